"""The HTTP endpoints the playground reads: samplers, schedulers, the gateway's status, and streamed images.

All through the real stack (gateway with an API key over tokenizer, lm and diffusion processes); images
with the official openai client, whose stream types are OpenAI's gpt-image-1 events.
"""

from __future__ import annotations

import base64
import io
import json
import re
import signal
import time

import httpx2 as httpx
import jsonschema
import numpy as np
import openai
import pytest
from fastapi.routing import iter_route_contexts
from PIL import Image

from muestra.gateway.http import create_app
from muestra.plugin.builtins import BUILTIN_SAMPLER_MODULES
from muestra.v1 import gateway_pb2
from tests.fixtures.prefix_cache import wait_until

PROMPT = "a watercolor painting of a lighthouse at sunset"
LONG_PROMPT = " ".join(f"Line {i}: the lighthouse keeper counts the ships that pass." for i in range(6))


@pytest.fixture(scope="module")
def client(openai_stack):
    with openai_stack.client(max_retries=0, timeout=300) as c:
        yield c


@pytest.fixture(scope="module")
def http(openai_stack):
    """Raw HTTP at the gateway's root, with the API key."""
    root = openai_stack.base_url.removesuffix("/v1")
    headers = {"Authorization": f"Bearer {openai_stack.api_key}"}
    with httpx.Client(base_url=root, headers=headers, timeout=300, trust_env=False) as c:
        yield c


def grpc_key(stack) -> tuple:
    return (("authorization", f"Bearer {stack.api_key}"),)


def status(http) -> dict:
    reply = http.get("/v1/status")
    assert reply.status_code == 200, reply.text
    return reply.json()


def text_replica(body: dict) -> dict:
    (model,) = [m for m in body["models"] if m["kind"] == "text"]
    (replica,) = model["replicas"]
    return replica


def pixels(b64: str) -> np.ndarray:
    image = Image.open(io.BytesIO(base64.b64decode(b64)))
    assert image.format == "PNG"
    return np.asarray(image.convert("RGB"))


# -- listings -------------------------------------------------------------------------------------


def test_samplers_lists_every_builtin_and_the_mirostat_plugin_with_valid_json_schemas(http, openai_stack):
    body = http.get("/v1/samplers").json()
    assert body["object"] == "list"
    names = [s["name"] for s in body["data"]]
    assert set(BUILTIN_SAMPLER_MODULES) | {"mirostat"} <= set(names)
    listing = openai_stack.stub.ListSamplers(gateway_pb2.ListSamplersRequest(), metadata=grpc_key(openai_stack))
    assert names == [s.name for s in listing.samplers]  # the gRPC order
    for sampler, info in zip(body["data"], listing.samplers, strict=True):
        jsonschema.Draft202012Validator.check_schema(sampler["parameters"])
        assert sampler["parameters"] == json.loads(info.parameter_schema)
        assert sampler["argmax_invariant"] is info.argmax_invariant
    mirostat = next(s for s in body["data"] if s["name"] == "mirostat")
    assert (mirostat["plugin"], mirostat["distribution"]) == ("mirostat", "muestra-mirostat")
    assert mirostat["version"] and mirostat["description"]
    assert "tau" in mirostat["parameters"]["properties"]
    assert next(s for s in body["data"] if s["name"] == "greedy")["argmax_invariant"] is True


def test_schedulers_lists_the_scheduler_plugins_with_the_models_that_have_them(http, openai_stack):
    body = http.get("/v1/schedulers").json()
    assert body["object"] == "list" and body["unanswered_image_models"] == []
    plugins = openai_stack.stub.ListPlugins(gateway_pb2.ListPluginsRequest(), metadata=grpc_key(openai_stack))
    expected = {name for p in plugins.plugins for name in p.schedulers}
    assert {s["name"] for s in body["data"]} == expected and expected
    for scheduler in body["data"]:
        assert scheduler["models"] == [openai_stack.image_model]
        assert scheduler["plugin"] and scheduler["distribution"] and scheduler["version"]
        assert isinstance(scheduler["aliases"], list)
    assert any(s["aliases"] for s in body["data"])


def test_status_shows_every_model_with_its_replicas_healthy(http, openai_stack):
    body = status(http)
    text = next(m for m in body["models"] if m["kind"] == "text")
    assert text["name"] == openai_stack.text_model and text["context_length"] > 0
    replica = text_replica(body)
    assert replica["healthy"] is True and replica["address"]
    assert set(replica) == {"address", "healthy", "requests_running", "requests_waiting", "rows_running"}
    image = next(m for m in body["models"] if m["kind"] == "image")
    assert image == {"name": openai_stack.image_model, "kind": "image", "replicas": [image["replicas"][0]]}
    assert image["replicas"][0]["healthy"] is True
    assert set(body["requests"]) == {"running", "waiting"} and body["uptime_s"] > 0


def test_status_names_the_gateways_own_grpc_port(http, openai_stack):
    assert status(http)["grpc_port"] == openai_stack.gateway.port


def test_status_counts_a_running_stream_and_its_rows_until_it_is_closed(client, http, openai_stack):
    wait_until(lambda: status(http)["requests"]["running"] == 0, what="an idle gateway")
    stream = client.completions.create(
        model=openai_stack.text_model, prompt="Once upon a time", max_tokens=500, n=3, stream=True,
        extra_body={"ignore_eos": True},
    )  # fmt: skip
    with stream:
        next(iter(stream))
        body = status(http)
        assert body["requests"] == {"running": 1, "waiting": 0}
        replica = text_replica(body)
        assert (replica["requests_running"], replica["rows_running"]) == (1, 3)
    wait_until(lambda: text_replica(status(http))["rows_running"] == 0, what="the closed stream's rows gone")
    assert status(http)["requests"] == {"running": 0, "waiting": 0}


def test_status_prefix_cache_hit_tokens_grow_when_a_long_prompt_repeats(client, http, openai_stack):
    # The stack's gateway has the default block size and no Redis: each lm keeps its blocks in process.
    before = status(http)["prefix_cache"]
    assert before["enabled"] is True

    def hit() -> bool:
        client.completions.create(model=openai_stack.text_model, prompt=LONG_PROMPT, max_tokens=1)
        return status(http)["prefix_cache"]["hit_tokens"] > before["hit_tokens"]

    wait_until(hit, what="a prefix-cache hit")
    after = status(http)["prefix_cache"]
    assert after["query_tokens"] > before["query_tokens"]
    assert after["hit_rate"] == pytest.approx(after["hit_tokens"] / after["query_tokens"])
    assert 0 < after["hit_rate"] <= 1


def test_an_unanswering_diffusion_service_is_unhealthy_and_its_schedulers_unanswered(http, diffusion_service):
    diffusion_service.process.proc.send_signal(signal.SIGSTOP)
    try:
        image = next(m for m in status(http)["models"] if m["kind"] == "image")
        schedulers = http.get("/v1/schedulers").json()
    finally:
        diffusion_service.process.proc.send_signal(signal.SIGCONT)
    assert image["replicas"][0]["healthy"] is False
    assert schedulers["data"] == [] and schedulers["unanswered_image_models"] == [image["name"]]
    wait_until(lambda: next(m for m in status(http)["models"] if m["kind"] == "image")["replicas"][0]["healthy"])


# -- the API key ----------------------------------------------------------------------------------


def every_route() -> list[tuple[str, str]]:
    """(method, path) of every route the app serves, path parameters filled in."""
    app = create_app(None, ["key"], 1024).app
    return [
        (method, re.sub(r"\{[^}]*\}", "x", route.path))
        for route in iter_route_contexts(app.routes)  # through the included routers
        for method in sorted(getattr(route, "methods", None) or ())
        if method != "HEAD"
    ]


ROUTES = every_route()


@pytest.mark.parametrize(("method", "path"), [r for r in ROUTES if r[1].startswith("/v1/") or r[1] == "/metrics"])
def test_every_api_route_needs_the_key(openai_stack, method, path):
    root = openai_stack.base_url.removesuffix("/v1")
    reply = httpx.request(method, root + path, json={} if method == "POST" else None, timeout=30, trust_env=False)
    assert reply.status_code == 401, reply.text
    assert reply.json()["error"]["code"] == "invalid_api_key"


def test_the_listing_routes_are_among_the_routes():
    assert {("GET", "/v1/samplers"), ("GET", "/v1/schedulers"), ("GET", "/v1/status")} <= set(ROUTES)


@pytest.mark.parametrize("path", ["/", "/ui/index.html", "/health"])
def test_the_playground_files_and_health_need_no_key(openai_stack, path):
    reply = httpx.get(openai_stack.base_url.removesuffix("/v1") + path, timeout=30, trust_env=False)
    assert reply.status_code == 200, reply.text


def test_playground_paths_count_under_two_metric_labels(openai_stack, http):
    root = openai_stack.base_url.removesuffix("/v1")
    for path in ("/", "/ui/index.html", "/ui/app.js", "/ui/no-such-file.js"):
        httpx.get(root + path, timeout=30, trust_env=False)
    paths = set(re.findall(r'muestra_http_requests_total\{path="([^"]*)"', http.get("/metrics").text))
    assert {"/", "/ui"} <= paths
    assert not any(p.startswith("/ui/") for p in paths)


# -- streamed images ------------------------------------------------------------------------------


def test_streamed_images_are_partial_images_then_the_same_pixels_as_unstreamed(client, openai_stack, reference_sd):
    asked = {"model": openai_stack.image_model, "prompt": PROMPT, "n": 2, "size": "64x64"}
    extra = {"steps": 3, "seed": 31, "guidance_scale": 5.0}
    events = list(client.images.generate(**asked, stream=True, extra_body={**extra, "preview_every": 1}))
    types = [e.type for e in events]
    partial, completed = "image_generation.partial_image", "image_generation.completed"
    assert types == [partial, partial, partial, completed] * 2
    assert all(isinstance(e, openai.types.ImageGenPartialImageEvent) for e in events if e.type == partial)
    assert all(isinstance(e, openai.types.ImageGenCompletedEvent) for e in events if e.type == completed)
    for image in (0, 1):
        partials = [e for e in events if e.type == partial and e.model_extra["image_index"] == image]
        assert [e.partial_image_index for e in partials] == [0, 1, 2]
        assert [(e.model_extra["step"], e.model_extra["total"]) for e in partials] == [(1, 3), (2, 3), (3, 3)]
        assert all(e.size == "64x64" and e.output_format == "png" and pixels(e.b64_json).size for e in partials)
    finals = [e for e in events if e.type == completed]
    assert [(e.model_extra["index"], e.model_extra["seed"]) for e in finals] == [(0, 31), (1, 32)]
    assert all(e.size == "64x64" and e.usage.total_tokens == 0 for e in finals)
    assert all(e.model_extra["parameters"].startswith(PROMPT) for e in finals)

    plain = client.images.generate(**asked, extra_body=extra)
    for final, item in zip(finals, plain.data, strict=True):
        np.testing.assert_array_equal(pixels(final.b64_json), pixels(item.b64_json))
        assert final.model_extra["parameters"] == item.model_extra["parameters"]
    expected = reference_sd.image(prompt=PROMPT, seed=31, steps=3, width=64, height=64, guidance_scale=5.0)
    np.testing.assert_array_equal(pixels(finals[0].b64_json), expected)


def test_partial_images_are_that_many_evenly_spaced_previews_per_image(client, openai_stack):
    stream = client.images.generate(
        model=openai_stack.image_model, prompt=PROMPT, n=2, size="64x64", stream=True, partial_images=2,
        extra_body={"steps": 4, "seed": 5},
    )  # fmt: skip
    events = list(stream)
    for image in (0, 1):
        partials = [
            e for e in events if e.type == "image_generation.partial_image" and e.model_extra["image_index"] == image
        ]
        assert [(e.partial_image_index, e.model_extra["step"]) for e in partials] == [(0, 1), (1, 3)]
    assert [e.type for e in events].count("image_generation.completed") == 2


def test_steps_without_a_preview_are_progress_events_the_client_iterates_past(client, openai_stack, http):
    stream = client.images.generate(
        model=openai_stack.image_model, prompt=PROMPT, size="64x64", stream=True,
        extra_body={"steps": 3, "seed": 2, "preview_every": 2},
    )  # fmt: skip
    events = list(stream)
    progress, partial = "muestra.image_generation.progress", "image_generation.partial_image"
    assert [(e.type, e.model_extra["step"]) for e in events[:3]] == [(progress, 1), (partial, 2), (progress, 3)]
    assert events[3].type == "image_generation.completed" and len(events) == 4

    # On the wire: each event names its type, and the stream ends with [DONE].
    body = {"prompt": PROMPT, "size": "64x64", "steps": 3, "seed": 2, "stream": True}
    with http.stream("POST", "/v1/images/generations", json=body) as reply:
        assert reply.status_code == 200 and reply.headers["content-type"].startswith("text/event-stream")
        blocks = reply.read().decode().split("\n\n")
    assert blocks[-2:] == ["data: [DONE]", ""]
    for block in blocks[:-2]:
        event, data = block.split("\n")
        assert event == "event: " + json.loads(data.removeprefix("data: "))["type"]
    first = json.loads(blocks[0].split("\n")[1].removeprefix("data: "))
    assert set(first) == {"type", "image_index", "step", "total", "elapsed_s"}


@pytest.mark.parametrize(
    ("fields", "param", "words"),
    [
        ({"stream": True, "partial_images": 5}, "partial_images", "less than or equal to 3"),
        ({"partial_images": 2}, "partial_images", "needs stream"),
        ({"preview_every": 1}, "preview_every", "needs stream"),
        ({"stream": True, "partial_images": 1, "preview_every": 1}, "partial_images", "preview_every"),
        ({"stream": True, "preview_every": -1}, "preview_every", "greater than or equal to 0"),
        ({"stream": True, "sampler": "no_such_scheduler"}, "sampler", "unknown scheduler"),
    ],
)
def test_bad_streaming_fields_are_400_naming_the_field(http, fields, param, words):
    reply = http.post("/v1/images/generations", json={"prompt": PROMPT, "size": "64x64", "steps": 1, **fields})
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert error["param"] == param and words in error["message"], error


def test_a_stream_refused_by_the_diffusion_service_gets_its_status_not_an_event(client):
    with pytest.raises(openai.BadRequestError) as error:
        client.images.generate(prompt=PROMPT, size="4096x4096", stream=True, extra_body={"steps": 1})
    assert error.value.param == "size"


def test_a_client_that_closes_the_stream_cancels_the_diffusion_call(client, openai_stack, diffusion_service):
    stream = client.images.generate(
        model=openai_stack.image_model, prompt=PROMPT, size="256x256", stream=True,
        extra_body={"steps": 149, "seed": 9},
    )  # fmt: skip
    with stream:
        events = iter(stream)
        seen = [next(events) for _ in range(3)]
    assert [e.model_extra["step"] for e in seen] == [1, 2, 3]
    per_step = (seen[2].model_extra["elapsed_s"] - seen[0].model_extra["elapsed_s"]) / 2

    started = time.monotonic()
    client.images.generate(prompt=PROMPT, size="64x64", extra_body={"steps": 1, "seed": 1})
    # The closed one's remaining 146 steps would take this long; the next request did not wait for them.
    assert time.monotonic() - started < per_step * 146 / 2
    wait_until(lambda: "of 149" in diffusion_service.process.log_tail(400), what="the diffusion's cancel line")
    line = r"cancelled by the client at step \d+; the loop stopped after step (\d+) of 149"
    stopped = re.findall(line, diffusion_service.process.log_tail(400))
    assert stopped and int(stopped[-1]) < 149

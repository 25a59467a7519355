"""What a client sees, pinned: the HTTP route table and the statuses and bodies of a fixed set of HTTP and gRPC
requests (successes and errors), against tests/fixtures/client_contract.json.

The file was recorded before the gateway was split into an API side and an engine side; the split must leave every
answer the same. Only what differs between two runs of the same code is normalized (ids, timestamps, timings, cached
prompt tokens, our own distributions' versions); an image is compared by its format, size and mode (its pixels come
from float kernels that differ between CPUs: tests/diffusion compares them with a bare diffusers call), and other
long strings by their digest.

To record the file again after a deliberate change of behaviour: MUESTRA_RECORD_CONTRACT=1 pytest this file, and
say in the commit what changed.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import io
import json
import os
import re
import urllib.error
import urllib.request
from pathlib import Path

import grpc
import pytest
from google.protobuf import json_format
from PIL import Image, UnidentifiedImageError

from muestra.v1 import common_pb2, diffusion_pb2, gateway_pb2

GOLDEN = Path(__file__).resolve().parents[1] / "fixtures" / "client_contract.json"
RECORD = os.environ.get("MUESTRA_RECORD_CONTRACT") == "1"

# Keys whose values differ between two runs of the same code.
_VOLATILE = {
    "id", "created", "created_at", "completed_at", "request_id", "response_id", "job_timestamp",
    "cached_tokens",  # what earlier tests left in the prefix cache
    "replica",  # the lm's address: a free port
}  # fmt: skip
_LONG = 300
# An id made at random (a request id, a stored response's id), not a name such as a model's.
_RANDOM = re.compile(r"[0-9a-zA-Z]{12,}")


def _normal(value, key: str | None = None):
    if isinstance(value, dict):
        out = {k: _normal(v, k) for k, v in value.items()}
        if str(out.get("distribution", "")).startswith("muestra") and "version" in out:
            out["version"] = "<ours>"
        return out
    if isinstance(value, list):
        return [_normal(v) for v in value]
    if key and key.endswith(("_ms", "_s")) and isinstance(value, (int, float)):
        return "<timing>"
    if key in _VOLATILE and value not in (None, "", 0) and (key != "id" or _RANDOM.search(str(value))):
        return f"<{key}>"
    if isinstance(value, str) and value.startswith("{"):  # JSON in a string (A1111's info)
        try:
            return {"json in a string": _normal(json.loads(value))}
        except ValueError:
            pass
    if isinstance(value, str) and len(value) > _LONG:
        try:
            return _image_or_digest(base64.b64decode(value, validate=True), value.encode())
        except (binascii.Error, ValueError):
            return _image_or_digest(b"", value.encode())
    return value


def _image_or_digest(image: bytes, raw: bytes) -> str:
    """An image's format, size and mode; anything else's digest."""
    try:
        with Image.open(io.BytesIO(image)) as opened:
            return f"<{opened.format} image {opened.width}x{opened.height} {opened.mode}>"
    except (UnidentifiedImageError, OSError, ValueError):
        return "sha256:" + hashlib.sha256(raw).hexdigest()[:16]


def _joined(pieces: list[dict], text_of) -> list[dict]:
    """Consecutive text pieces of one choice as one: how a stream's text is cut into messages depends on timing
    (bursts, batching), not on the code; the text, tokens and logprobs that arrive do not."""
    out: list[dict] = []
    for piece in pieces:
        path = text_of(piece)
        last = out[-1] if out else None
        if path is not None and last is not None and (lpath := text_of(last)) is not None and path[0] == lpath[0]:
            merged, text_keys = json.loads(json.dumps(last)), path[1]
            for keys in text_keys:
                _extend(merged, piece, keys)
            out[-1] = merged
        else:
            out.append(piece)
    return out


def _extend(into: dict, piece: dict, keys: tuple) -> None:
    target, source = into, piece
    for key in keys[:-1]:
        target, source = target[key], source[key]
    last = keys[-1]
    if last in source and source[last] is not None:
        target[last] = (target.get(last) or type(source[last])()) + source[last]


def _sse_text(event) -> tuple | None:
    """(choice index, the fields to join) of a chunk that only carries text, else None."""
    if not isinstance(event, dict) or len(event.get("choices") or ()) != 1 or event.get("usage"):
        return None
    choice = event["choices"][0]
    if choice.get("finish_reason") is not None:
        return None
    if "delta" in choice:
        if set(choice["delta"]) - {"content"} or choice.get("logprobs"):
            return None
        return choice["index"], [("choices", 0, "delta", "content")]
    if "text" in choice and not choice.get("logprobs"):
        return choice["index"], [("choices", 0, "text")]
    return None


def _grpc_text(message) -> tuple | None:
    if not isinstance(message, dict) or "delta" not in message:
        return None
    return message.get("index", 0), [("delta", "text"), ("delta", "token_ids"), ("delta", "logprobs")]


def _body(raw: bytes, content_type: str):
    text = raw.decode("utf-8", errors="replace")
    if "text/event-stream" in content_type:
        events = []
        for block in text.split("\n\n"):
            data = "".join(line[6:] for line in block.splitlines() if line.startswith("data: "))
            if data:
                events.append(data if data == "[DONE]" else _normal(json.loads(data)))
        return {"sse": _joined(events, _sse_text)}
    if "json" in content_type:
        return _normal(json.loads(text))
    return _image_or_digest(raw, raw)


def _http(stack, method: str, path: str, body=None, key: str | None = "default", raw: bytes | None = None):
    root = stack.base_url.removesuffix("/v1")
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    request = urllib.request.Request(root + path, data=data, method=method)
    request.add_header("Content-Type", "application/json")
    if key is not None:
        request.add_header("Authorization", f"Bearer {stack.api_key if key == 'default' else key}")
    try:
        with urllib.request.urlopen(request, timeout=300) as response:
            status, content, ctype = response.status, response.read(), response.headers.get("Content-Type", "")
    except urllib.error.HTTPError as error:
        status, content, ctype = error.code, error.read(), error.headers.get("Content-Type", "")
    return {"status": status, "body": _body(content, ctype)}


def _grpc(call, request, key: str | None):
    metadata = [("authorization", f"Bearer {key}")] if key else None
    try:
        result = call(request, timeout=300, metadata=metadata)
        if hasattr(result, "__iter__") and not hasattr(result, "ListFields"):
            messages = _joined(
                [json_format.MessageToDict(m, preserving_proto_field_name=True) for m in result], _grpc_text
            )
        else:
            messages = json_format.MessageToDict(result, preserving_proto_field_name=True)
        return {"code": "OK", "messages": _normal(messages)}
    except grpc.RpcError as error:
        return {"code": error.code().name, "details": error.details()}


def _chat(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


def _http_cases(stack) -> dict[str, tuple]:
    text, image = stack.text_model, stack.image_model
    greedy = {"model": text, "max_tokens": 8, "temperature": 0}
    seeded = {"model": text, "max_tokens": 8, "seed": 7}
    return {
        "health": ("GET", "/health", None, None),
        "models": ("GET", "/v1/models", None),
        "model": ("GET", f"/v1/models/{text}", None),
        "samplers": ("GET", "/v1/samplers", None),
        "schedulers": ("GET", "/v1/schedulers", None),
        "completion greedy": ("POST", "/v1/completions", {**greedy, "prompt": "The quick brown fox"}),
        "completion sampled n=2 logprobs": (
            "POST",
            "/v1/completions",
            {**seeded, "prompt": "Once upon", "temperature": 0.7, "top_p": 0.9, "n": 2, "logprobs": 2},
        ),
        "completion echo": ("POST", "/v1/completions", {**greedy, "prompt": "Hello there", "echo": True}),
        "completion two prompts": ("POST", "/v1/completions", {**greedy, "prompt": ["a b", "c d"]}),
        "completion stream with usage": (
            "POST",
            "/v1/completions",
            {**greedy, "prompt": "The quick brown fox", "stream": True, "stream_options": {"include_usage": True}},
        ),
        "chat greedy": ("POST", "/v1/chat/completions", {**greedy, "messages": _chat("Hi")}),
        "chat stream sampled": (
            "POST",
            "/v1/chat/completions",
            {**seeded, "messages": _chat("Tell me"), "temperature": 0.8, "top_k": 20, "stream": True},
        ),
        "chat logprobs": (
            "POST",
            "/v1/chat/completions",
            {**greedy, "messages": _chat("Hi"), "logprobs": True, "top_logprobs": 3},
        ),
        "chat penalties min_p": (
            "POST",
            "/v1/chat/completions",
            {**seeded, "messages": _chat("Count"), "presence_penalty": 0.5, "repetition_penalty": 1.2, "min_p": 0.1},
        ),
        "chat explicit samplers": (
            "POST",
            "/v1/chat/completions",
            {
                **seeded,
                "messages": _chat("Go"),
                "samplers": [{"name": "top_k", "params": {"top_k": 5}}, {"name": "sample", "params": {}}],
            },
        ),
        "chat stop": ("POST", "/v1/chat/completions", {**greedy, "messages": _chat("Hi"), "stop": ["e", "a"]}),
        "chat json_object": (
            "POST",
            "/v1/chat/completions",
            {**greedy, "max_tokens": 24, "messages": _chat("JSON"), "response_format": {"type": "json_object"}},
        ),
        "chat guided_choice": (
            "POST",
            "/v1/chat/completions",
            {**greedy, "messages": _chat("Pick"), "guided_choice": ["yes", "no"]},
        ),
        "responses store false": (
            "POST",
            "/v1/responses",
            {"model": text, "input": "Hi", "max_output_tokens": 8, "temperature": 0, "store": False},
        ),
        "image b64": (
            "POST",
            "/v1/images/generations",
            {
                "model": image,
                "prompt": "a seven",
                "size": "64x64",
                "response_format": "b64_json",
                "seed": 3,
                "steps": 2,
            },
        ),
        "a1111 samplers": ("GET", "/sdapi/v1/samplers", None),
        "a1111 sd-models": ("GET", "/sdapi/v1/sd-models", None),
        "a1111 upscalers": ("GET", "/sdapi/v1/upscalers", None),
        "a1111 txt2img": (
            "POST",
            "/sdapi/v1/txt2img",
            {"prompt": "a three", "width": 64, "height": 64, "steps": 2, "seed": 5},
        ),
        "playground page": ("GET", "/", None),
        # -- errors
        "error no key": ("POST", "/v1/completions", {"model": text, "prompt": "x"}, None),
        "error wrong key": ("GET", "/v1/models", None, "sk-wrong"),
        "error missing prompt": ("POST", "/v1/completions", {"model": text, "max_tokens": 4}),
        "error temperature": ("POST", "/v1/completions", {**greedy, "prompt": "x", "temperature": 5}),
        "error top_p": ("POST", "/v1/chat/completions", {**seeded, "messages": _chat("x"), "top_p": 1.5}),
        "error n": ("POST", "/v1/completions", {**greedy, "prompt": "x", "n": 1000}),
        "error max_tokens": ("POST", "/v1/completions", {**greedy, "prompt": "x", "max_tokens": 10_000_000}),
        "error empty messages": ("POST", "/v1/chat/completions", {**greedy, "messages": []}),
        "error unknown model": ("POST", "/v1/completions", {**greedy, "model": "nope", "prompt": "x"}),
        "error top_logprobs": (
            "POST",
            "/v1/chat/completions",
            {**greedy, "messages": _chat("x"), "logprobs": True, "top_logprobs": 99},
        ),
        "error stops": ("POST", "/v1/completions", {**greedy, "prompt": "x", "stop": [str(i) for i in range(99)]}),
        "error logit_bias": ("POST", "/v1/completions", {**greedy, "prompt": "x", "logit_bias": {"nope": 1}}),
        "error unknown sampler": (
            "POST",
            "/v1/completions",
            {**greedy, "prompt": "x", "samplers": [{"name": "nope", "params": {}}]},
        ),
        "error json_schema without schema": (
            "POST",
            "/v1/chat/completions",
            {
                **greedy,
                "messages": _chat("x"),
                "response_format": {"type": "json_schema", "json_schema": {"name": "a"}},
            },
        ),
        "error stream sampler param": (
            "POST",
            "/v1/chat/completions",
            {
                **greedy,
                "messages": _chat("x"),
                "stream": True,
                "samplers": [{"name": "top_k", "params": {"top_k": -3}}, {"name": "sample", "params": {}}],
            },
        ),
        "error image size": ("POST", "/v1/images/generations", {"model": image, "prompt": "x", "size": "4096x4096"}),
        "error unknown response": ("GET", "/v1/responses/resp_0123456789abcdef", None),
        "error a1111 width": ("POST", "/sdapi/v1/txt2img", {"prompt": "x", "width": 4096, "height": 32, "steps": 2}),
        "error unknown route": ("GET", "/v1/nothing-here", None),
        "error bad json": ("POST", "/v1/chat/completions", None, "default", b"{not json"),
    }


def _grpc_cases(stack) -> dict[str, tuple]:
    text, image = stack.text_model, stack.image_model
    stub = stack.stub

    def sampler(name: str, **params):
        spec = gateway_pb2.SamplerSpec(name=name)
        spec.params.update(params)
        return spec

    chat = common_pb2.ChatMessages(messages=[common_pb2.ChatMessage(role="user", content="Hi")])
    return {
        "ListModels": (stub.ListModels, gateway_pb2.ListModelsRequest()),
        "ListSamplers": (stub.ListSamplers, gateway_pb2.ListSamplersRequest()),
        "ListConstraints": (stub.ListConstraints, gateway_pb2.ListConstraintsRequest()),
        "ListPlugins": (stub.ListPlugins, gateway_pb2.ListPluginsRequest()),
        "Tokenize": (stub.Tokenize, gateway_pb2.TokenizeRequest(model=text, prompt="Hello world")),
        "Generate greedy": (
            stub.Generate,
            gateway_pb2.GenerateRequest(
                model=text, prompt="The quick brown fox", max_tokens=8, seed=1, samplers=[sampler("greedy")]
            ),
        ),
        "Generate chat sampled n=2": (
            stub.Generate,
            gateway_pb2.GenerateRequest(
                model=text,
                messages=chat,
                max_tokens=8,
                seed=11,
                n=2,
                logprobs=True,
                samplers=[sampler("temperature", temperature=0.9), sampler("sample")],
            ),
        ),
        "Generate image": (
            stub.GenerateImage,
            diffusion_pb2.ImageRequest(model=image, prompt="a five", width=64, height=64, steps=2, seed=9),
        ),
        "error Generate no input": (stub.Generate, gateway_pb2.GenerateRequest(model=text, max_tokens=4)),
        "error Generate temperature": (
            stub.Generate,
            gateway_pb2.GenerateRequest(
                model=text,
                prompt="x",
                max_tokens=4,
                samplers=[sampler("temperature", temperature=500), sampler("sample")],
            ),
        ),
        "error Generate unknown model": (stub.Generate, gateway_pb2.GenerateRequest(model="nope", prompt="x")),
        "error Generate n": (stub.Generate, gateway_pb2.GenerateRequest(model=text, prompt="x", n=1000)),
        "error Generate empty stop": (stub.Generate, gateway_pb2.GenerateRequest(model=text, prompt="x", stop=[""])),
        "error Tokenize unknown model": (stub.Tokenize, gateway_pb2.TokenizeRequest(model="nope", prompt="x")),
        "error no key": (stub.ListModels, gateway_pb2.ListModelsRequest(), None),
    }


def _route_table() -> list[str]:
    """Every route of the HTTP app as "METHODS path", sorted (the app built without a servicer: routes only)."""
    from muestra.gateway.http.app import create_app

    def walk(routes, prefix: str = ""):
        for route in routes:
            if hasattr(route, "original_router"):  # an included router
                yield from walk(route.original_router.routes, prefix + (route.include_context.prefix or ""))
            else:
                yield " ".join(sorted(getattr(route, "methods", None) or ())) + " " + prefix + route.path

    return sorted(walk(create_app(None, [], 1 << 20).app.routes))


def test_every_answer_a_client_sees_is_the_recorded_one(openai_stack):
    seen = {"routes": _route_table(), "http": {}, "grpc": {}}
    for name, case in _http_cases(openai_stack).items():
        method, path, body, *rest = case
        key = rest[0] if rest else "default"
        raw = rest[1] if len(rest) > 1 else None
        seen["http"][name] = _http(openai_stack, method, path, body, key, raw)
    for name, (call, request, *key) in _grpc_cases(openai_stack).items():
        seen["grpc"][name] = _grpc(call, request, key[0] if key else openai_stack.api_key)
    assert len(seen["http"]) + len(seen["grpc"]) >= 40
    if RECORD:
        GOLDEN.write_text(json.dumps(seen, indent=1, ensure_ascii=False) + "\n")
        pytest.skip(f"recorded {GOLDEN.name}")
    golden = json.loads(GOLDEN.read_text())
    assert seen["routes"] == golden["routes"]
    for side in ("http", "grpc"):
        assert sorted(seen[side]) == sorted(golden[side])
        for name, answer in seen[side].items():
            assert answer == golden[side][name], f"{side} {name!r} changed"

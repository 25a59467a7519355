"""The OpenAI-compatible HTTP API's failures: OpenAI's error shape and statuses, API keys, disconnects, full queues."""

from __future__ import annotations

import asyncio
import http.client
import json
import socket
import time
import urllib.error
import urllib.request

import openai
import pytest

from muestra.gateway.http.openai.text import TextRun
from muestra.v1 import gateway_pb2
from tests.harness import free_port

PROMPT = "The quick brown fox"


@pytest.fixture(scope="module")
def stack(openai_stack):
    return openai_stack


@pytest.fixture(scope="module")
def client(stack):
    with stack.client(max_retries=0, timeout=120) as c:
        yield c


def call(stack, method: str, path: str, body: bytes | None = None, key: str | None = "default") -> tuple[int, dict]:
    """A raw HTTP call (for what the openai client will not send); (status, JSON body)."""
    root = stack.base_url.removesuffix("/v1")
    request = urllib.request.Request(root + path, data=body, method=method)
    request.add_header("Content-Type", "application/json")
    if key is not None:
        request.add_header("Authorization", f"Bearer {stack.api_key if key == 'default' else key}")
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            raw = response.read()
            status = response.status
    except urllib.error.HTTPError as error:
        raw, status = error.read(), error.code
    try:
        return status, json.loads(raw)
    except ValueError:
        return status, {"text": raw.decode()}


def test_a_wrong_or_missing_key_is_401_and_health_needs_none(stack):
    with stack.client(api_key="sk-wrong", max_retries=0) as wrong:
        with pytest.raises(openai.AuthenticationError) as error:
            wrong.models.list()
    assert error.value.status_code == 401 and error.value.code == "invalid_api_key"
    status, body = call(stack, "POST", "/v1/completions", json.dumps({"prompt": "x"}).encode(), key=None)
    assert status == 401 and "missing API key" in body["error"]["message"]
    assert call(stack, "GET", "/health", key=None) == (200, {"status": "ok"})
    assert call(stack, "GET", "/metrics", key=None)[0] == 401


@pytest.mark.parametrize(
    ("kwargs", "param"),
    [
        ({"temperature": 3.0}, "temperature"),
        ({"top_p": 1.5}, "top_p"),
        ({"n": 1000}, "n"),
        ({"max_tokens": 100_000}, "max_tokens"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"logprobs": 50}, "logprobs"),
        ({"logit_bias": {"5": 500}}, "logit_bias"),
        ({"logit_bias": {"999999": 5}}, "logit_bias"),
        ({"stop": [""]}, "stop[0]"),
        ({"prompt": ""}, "prompt"),
        ({"prompt": [1, 2, 3]}, "prompt"),
        ({"suffix": "and then"}, "suffix"),
        ({"extra_body": {"top_k": -5}}, "top_k"),
        ({"extra_body": {"repetition_penalty": 0.0}}, "repetition_penalty"),
        ({"extra_body": {"samplers": [{"name": "no_such_sampler"}]}}, "samplers[0].name"),
        ({"extra_body": {"frobnicate": True}}, "frobnicate"),
        # Integers no protobuf field or double can hold (they used to be 500s).
        ({"extra_body": {"top_k": 10**400}}, "top_k"),
        ({"extra_body": {"samplers": [{"name": "top_k", "params": {"top_k": -(10**30)}}, {"name": "sample"}]}},
         "samplers"),
        ({"extra_body": {"stop_token_ids": [-1]}}, "stop_token_ids[0]"),
        ({"max_tokens": 2**32}, "max_tokens"),
        ({"seed": 2**64}, "seed"),
    ],
)  # fmt: skip
def test_bad_completion_parameters_are_400_naming_the_param(client, stack, kwargs, param):
    kwargs = {"model": stack.text_model, "prompt": PROMPT, "max_tokens": 4, **kwargs}
    with pytest.raises(openai.BadRequestError) as error:
        client.completions.create(**kwargs)
    assert error.value.status_code == 400
    assert error.value.param == param, error.value.message
    assert error.value.type == "invalid_request_error"


@pytest.mark.parametrize(
    ("kwargs", "param"),
    [
        ({"top_logprobs": 3}, "top_logprobs"),
        ({"max_completion_tokens": 100_000}, "max_completion_tokens"),
        ({"messages": []}, "messages"),
        ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
         "messages[0].content[0]"),
        ({"messages": [{"content": "no role"}]}, "messages[0].role"),
        ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "x"}}}]},
         "tools[0].function.parameters"),
        ({"response_format": {"type": "json_schema"}}, "response_format.json_schema.schema"),
        ({"stream_options": {"include_usage": True}}, "stream_options"),
        ({"presence_penalty": -3}, "presence_penalty"),
    ],
)  # fmt: skip
def test_bad_chat_parameters_are_400_naming_the_param(client, stack, kwargs, param):
    kwargs = {"model": stack.text_model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, **kwargs}
    with pytest.raises(openai.BadRequestError) as error:
        client.chat.completions.create(**kwargs)
    assert error.value.param == param, error.value.message


def test_bad_input_leaves_a_running_stream_untouched(client, stack):
    stream = client.completions.create(
        model=stack.text_model, prompt=PROMPT, max_tokens=60, temperature=1.0, seed=8, stream=True,
        stream_options={"include_usage": True}, extra_body={"ignore_eos": True},
    )  # fmt: skip
    next(iter(stream))
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model=stack.text_model, prompt=PROMPT, temperature=-1)
    chunks = list(stream)
    assert chunks[-1].usage.completion_tokens == 60


def test_an_unknown_model_is_404_naming_the_known_ones(client, stack):
    with pytest.raises(openai.NotFoundError) as error:
        client.completions.create(model="gpt-17", prompt=PROMPT, max_tokens=2)
    assert error.value.param == "model" and error.value.code == "model_not_found"
    assert stack.text_model in error.value.message
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("gpt-17")


def test_malformed_bodies_are_400_and_oversized_ones_413(stack):
    status, body = call(stack, "POST", "/v1/chat/completions", b"{not json")
    assert status == 400 and "not valid JSON" in body["error"]["message"]
    status, body = call(stack, "POST", "/v1/chat/completions", b"")
    assert status == 400
    # The refusal comes as soon as the headers announce too much; the client need not send it all.
    host, port = stack.base_url.removeprefix("http://").removesuffix("/v1").split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=30)
    connection.putrequest("POST", "/v1/completions")
    connection.putheader("Authorization", f"Bearer {stack.api_key}")
    connection.putheader("Content-Type", "application/json")
    connection.putheader("Content-Length", str(9 << 20))
    connection.endheaders(b'{"prompt": "xxxx')
    response = connection.getresponse()
    assert response.status == 413 and json.loads(response.read())["error"]["code"] == "body_too_large"
    connection.close()
    status, body = call(stack, "GET", "/v1/nothing-here")
    assert status == 404 and set(body["error"]) == {"message", "type", "param", "code"}


def test_metrics_count_http_requests(stack):
    call(stack, "GET", "/v1/models")
    status, body = call(stack, "GET", "/metrics")
    assert status == 200
    assert 'muestra_http_requests_total{path="/v1/models",status="200"}' in body["text"]


def test_closing_a_stream_mid_way_frees_the_lm_rows(client, stack):
    stream = client.chat.completions.create(
        model=stack.text_model, messages=[{"role": "user", "content": "Count."}], max_tokens=400, temperature=1.0,
        seed=1, stream=True, extra_body={"ignore_eos": True},
    )  # fmt: skip
    chunks = iter(stream)
    for _ in range(3):
        next(chunks)
    assert stack.lm_rows() >= 1
    stream.close()
    deadline = time.monotonic() + 5
    while stack.lm_rows() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert stack.lm_rows() == 0


def test_a_client_leaving_a_non_streamed_request_frees_the_lm_rows(stack):
    host, port = stack.base_url.removeprefix("http://").removesuffix("/v1").split(":")
    body = json.dumps({"model": "", "prompt": PROMPT, "max_tokens": 450, "temperature": 1.0, "ignore_eos": True})
    connection = http.client.HTTPConnection(host, int(port), timeout=30)
    connection.request(
        "POST", "/v1/completions", body=body,
        headers={"Authorization": f"Bearer {stack.api_key}", "Content-Type": "application/json"},
    )  # fmt: skip
    deadline = time.monotonic() + 10
    while not stack.lm_rows():
        assert time.monotonic() < deadline, "the generation never started"
        time.sleep(0.01)
    connection.sock.shutdown(socket.SHUT_RDWR)
    connection.close()
    deadline = time.monotonic() + 5
    while stack.lm_rows() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert stack.lm_rows() == 0
    while "HTTP POST /v1/completions 499" not in stack.gateway.log_path.read_text():
        assert time.monotonic() < deadline + 5, stack.gateway.log_tail()
        time.sleep(0.05)


def test_a_full_queue_is_429_and_the_gateway_keeps_serving(text_stack):
    # A queue of 0 refuses whatever cannot be admitted at once, which is every request: the scheduler's own
    # ResourceExhausted, every time, without racing a running generation.
    port = free_port()
    text_stack("llama", "--http-port", str(port), "--max-queue", "0")
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0, timeout=120)
    for stream in (False, True):
        with pytest.raises(openai.RateLimitError) as error:
            client.completions.create(model="", prompt=PROMPT, max_tokens=3, stream=stream)
        assert error.value.status_code == 429 and error.value.code == "queue_full"
        assert "queue is full" in error.value.message
    assert client.models.list().data


async def _fake_messages():
    yield 0, gateway_pb2.GenerateResponse(index=0, delta=gateway_pb2.TextDelta(text="Hel", token_ids=[5]))
    yield (
        0,
        gateway_pb2.GenerateResponse(
            index=0, done=gateway_pb2.Completion(finish_reason=gateway_pb2.ERROR, error="lm replica failed: gone")
        ),
    )


def test_an_error_after_the_stream_started_is_an_error_event_then_done():
    from muestra.gateway.http.openai.convert import chat_request
    from muestra.gateway.http.openai.schemas import ChatCompletionRequest

    body = ChatCompletionRequest(messages=[{"role": "user", "content": "hi"}], stream=True)
    request, renames = chat_request(body)
    run = TextRun(engine=None, body=body, requests=[request], renames=renames, chat=True)

    async def stream() -> list[str]:
        messages = _fake_messages()
        first = await anext(messages)
        return [event async for event in run.events({"id": "chatcmpl-x"}, first, messages)]

    events = asyncio.run(stream())
    payloads = [json.loads(e.removeprefix("data: ")) for e in events[:-1]]
    assert payloads[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert payloads[1]["choices"][0]["delta"] == {"content": "Hel"}
    assert payloads[2]["error"] == {
        "message": "lm replica failed: gone",
        "type": "server_error",
        "param": None,
        "code": "generation_error",
    }
    assert events[-1] == "data: [DONE]\n\n"

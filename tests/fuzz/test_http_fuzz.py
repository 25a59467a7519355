"""The HTTP API's JSON bodies, hostile: every field of every endpoint's schema with wrong types, huge and
negative numbers, NaN and infinities, lone surrogates, huge lists and unknown fields, and bodies that are
not JSON at all, truncated, not UTF-8 or over the size limit. Only 200 (a complete answer, a stream that ends
with [DONE] and no server error) or a 4xx with OpenAI's error object may come back; never a 5xx or a hang.
"""

from __future__ import annotations

import json
import math
import socket
import time

import httpx2 as httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from muestra.gateway.http.openai.response_bodies import ResponsesRequest, TextOptions
from muestra.gateway.http.openai.schemas import (
    ChatCompletionRequest,
    ChatMessage,
    CompletionRequest,
    ContentPart,
    ImageGenerationRequest,
    ResponseFormat,
    SamplerStep,
    StreamOptions,
)
from tests.fuzz.conftest import FUZZ, TEXT_MODEL, tally, unharmed
from tests.fuzz.protofuzz import json_values
from tests.http_attacks import Attack, bystander_bound, bystander_latencies

pytestmark = pytest.mark.slow
HANG_S = 60.0
ALLOWED = {200, 400, 404, 413, 415, 422, 429}

BASES = {
    "/v1/completions": {"model": TEXT_MODEL, "prompt": "def f(x):\n", "max_tokens": 6, "seed": 1},
    "/v1/chat/completions": {
        "model": TEXT_MODEL, "messages": [{"role": "user", "content": "Hola"}], "max_tokens": 6, "seed": 1,
    },
    "/v1/images/generations": {"model": "muestra-image", "prompt": "a seven", "n": 1, "steps": 2, "seed": 1},
    "/v1/responses": {"model": TEXT_MODEL, "input": "Hola", "max_output_tokens": 6, "seed": 1},
}  # fmt: skip
SCHEMAS = {
    "/v1/completions": CompletionRequest,
    "/v1/chat/completions": ChatCompletionRequest,
    "/v1/images/generations": ImageGenerationRequest,
    "/v1/responses": ResponsesRequest,
}
NESTED = {
    "messages": ChatMessage,
    "content": ContentPart,
    "response_format": ResponseFormat,
    "samplers": SamplerStep,
    "stream_options": StreamOptions,
    "text": TextOptions,
}
WEATHER = {"type": "function", "name": "f", "parameters": {"type": "object", "properties": {"a": {"type": "string"}}}}
# Raw JSON for what Python's json module does not write from a value.
RAW = ["1" + "0" * 400, "-" + "9" * 5000, "1e400", "-1e400", "NaN", "Infinity", '"\\ud800"', '"\\udfff x"',
       "[" + ",".join(["0"] * 100_000) + "]", '"' + "a" * 2_000_000 + '"', "{" * 2000 + "}" * 2000,
       "[" * 5000 + "]" * 5000]  # fmt: skip


# Values a real client sends: examples that mix them get past validation and run to the end.
PLAUSIBLE = {
    "n": [1, 2, 3], "max_tokens": [1, 4, 12], "max_completion_tokens": [1, 5], "temperature": [0, 0.7, 2],
    "top_p": [0.1, 1], "top_k": [0, 1, 40, 10**400, -(2**70)], "min_p": [0, 0.1], "typical_p": [0.5, 1],
    "seed": [0, 7, 2**64 - 1],
    "presence_penalty": [-2, 0.5, 2], "frequency_penalty": [-2, 1], "repetition_penalty": [0.5, 1.3],
    "logprobs": [True, False, 0, 3], "top_logprobs": [0, 5, 20], "stop": ["\n", [".", " is"], []],
    "stream": [True, False], "stream_options": [{"include_usage": True}], "echo": [True, False],
    "ignore_eos": [True], "stop_token_ids": [[0, 1], []], "logit_bias": [{"5": 100}, {"7": -100}],
    "samplers": [[{"name": "greedy"}], [{"name": "top_k", "params": {"top_k": 3}}, {"name": "sample"}],
                 [{"name": "beam_search", "params": {"num_beams": 2}}],
                 [{"name": "top_k", "params": {"top_k": 10**400}}, {"name": "sample"}]],
    "response_format": [{"type": "json_object"}, {"type": "text"}], "user": ["u"], "best_of": [1, 2],
    "size": ["16x16", "8x8", "4096x4096", "x"], "steps": [1, 2], "guidance_scale": [0, 7.5],
    "negative_prompt": ["blurry"], "sampler": ["euler", "ddim"], "include_stop_str_in_output": [True],
    "input": ["", "hi", [{"role": "user", "content": "hi"}], [{"type": "function_call_output", "call_id": "c",
              "output": "1"}], [{"role": "assistant", "content": [{"type": "output_text", "text": "x"}]}],
              [{"type": "item_reference", "id": "msg_x"}], [{"type": "reasoning"}], [{}] * 5000],
    "instructions": ["Be brief.", ""], "max_output_tokens": [1, 4, 12], "store": [True, False],
    "previous_response_id": ["resp_none", "", "x" * 200], "tools": [[WEATHER], [{"type": "web_search"}], [{}]],
    "tool_choice": ["auto", "required", "none", {"type": "function", "name": "f"}, {"type": "mcp"}],
    "text": [{"format": {"type": "json_object"}}, {"format": {"type": "json_schema", "name": "x", "schema": {}}},
             {"format": {"type": "json_schema"}}, {"verbosity": "high"}],
    "parallel_tool_calls": [True, False], "metadata": [{"k": "v"}, {str(i): "v" for i in range(20)}],
    "truncation": ["disabled", "auto"], "include": [[], ["message.output_text.logprobs"]],
    "reasoning": [{"effort": None}, {"effort": "low"}],
}  # fmt: skip


def hostile() -> st.SearchStrategy:
    """A value for any field: of any JSON type, at the edges, or raw JSON."""
    numbers = st.sampled_from([-1, 0, 1, 2, 2**31, 2**32, 2**53 + 1, 2**63, 2**64, -(2**63) - 1, 1e308, -0.0,
                               math.nan, math.inf, -math.inf, 0.5, 1e-320])  # fmt: skip
    return st.one_of(
        numbers, json_values(), st.sampled_from(["", "\ud800", "\udc00abc", "\x00", "🙂", "x" * 100_000]),
        st.builds(lambda s: ("raw", s), st.sampled_from(RAW)),
    )  # fmt: skip


def encode(value) -> str:
    """JSON text, raw pieces spliced in as they are."""
    if isinstance(value, tuple) and value and value[0] == "raw":
        return value[1]
    if isinstance(value, dict):
        return "{" + ",".join(f"{json.dumps(k)}:{encode(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ",".join(encode(v) for v in value) + "]"
    return json.dumps(value, allow_nan=True)


def fields(schema) -> list[str]:
    return [field.alias or name for name, field in schema.model_fields.items()]


@st.composite
def bodies(draw, path: str):
    """(how, bytes, headers) for one request to `path`."""
    headers = {"content-type": "application/json"}
    if draw(st.integers(0, 9)) == 0:
        headers["x-request-id"] = draw(
            st.sampled_from([b"", b"x" * 10_000, b"a b", b"%00", b"../../etc", "é".encode()])
        )
    if draw(st.integers(0, 19)) == 0:
        headers["content-type"] = draw(st.sampled_from(["text/plain", "application/x-www-form-urlencoded", ""]))
    how = draw(st.sampled_from(["fields"] * 5 + ["plausible"] * 3 + ["nested", "raw"]))
    body = dict(BASES[path])
    if draw(st.booleans()) and path != "/v1/images/generations":
        body["stream"] = True
    if how == "raw":
        raw = draw(
            st.one_of(
                st.binary(max_size=200),
                st.sampled_from(
                    [
                        b"",
                        b"{",
                        b"[]",
                        b"null",
                        b"42",
                        b'"x"',
                        b"\xff\xfe{}",
                        b'{"prompt": "\xc3\x28"}',
                        b"{}" * 10,
                        b" " * 9_000_000,
                    ]
                ),
                st.builds(lambda n: encode(body).encode()[:n], st.integers(1, 40)),
            )
        )
        return "raw", raw, headers
    names = [*fields(SCHEMAS[path]), "no_such_field", "__proto__", ""]
    for name in draw(st.lists(st.sampled_from(names), min_size=1, max_size=4, unique=True)):
        if how == "plausible" and name in PLAUSIBLE:
            body[name] = draw(st.sampled_from(PLAUSIBLE[name]))
        elif how == "nested" and name in NESTED:
            inner = {f: draw(hostile()) for f in draw(st.lists(st.sampled_from(fields(NESTED[name])), max_size=3))}
            body[name] = [inner] * draw(st.sampled_from([1, 2, 5000])) if name in ("messages", "samplers") else inner
        else:
            body[name] = draw(hostile())
    return how, encode(body).encode("utf-8", "surrogatepass"), headers


def check_stream(reply: httpx.Response) -> str:
    """How a 200 stream ended: 'ok' ([DONE], or the Responses API's last event; no server error), or what was
    wrong with it."""
    done = False
    for line in reply.iter_lines():
        if line == "data: [DONE]":
            done = True
        elif line.startswith("data: "):
            event = json.loads(line[6:])
            if event.get("type") in ("response.completed", "response.incomplete"):
                done = True
            elif event.get("type") in ("error", "response.failed"):
                return f"server error in the stream: {event}"
            error = event.get("error")
            if isinstance(error, dict) and error.get("type") != "invalid_request_error":
                return f"server error in the stream: {error}"
    return "ok" if done else "no [DONE]"


@pytest.mark.parametrize("path", list(BASES))
def test_hostile_bodies_get_a_4xx_with_an_error_object(fuzz_stack, known, path):
    base_url = f"http://127.0.0.1:{fuzz_stack.http_port}"

    @FUZZ
    @given(request=bodies(path))
    def one(request):
        how, data, headers = request
        with httpx.Client(base_url=base_url, timeout=HANG_S, trust_env=False) as client:
            try:
                with client.stream("POST", path, content=data, headers=headers) as reply:
                    status = reply.status_code
                    if status == 200 and "text/event-stream" in reply.headers.get("content-type", ""):
                        verdict = check_stream(reply)
                    else:
                        reply.read()
                        verdict = "ok"
            except httpx.TimeoutException:
                status, verdict = "HANG", "no answer"
        tally(f"HTTP POST {path}", str(status) if verdict == "ok" else f"{status} {verdict}")
        shown = data[:600]
        assert status in ALLOWED and verdict == "ok", f"{status} {verdict} for {how}: {shown!r}"
        if status != 200:
            error = json.loads(reply.content)["error"]
            assert error["message"] and error["type"], error

    one()
    unharmed(fuzz_stack, known)


@st.composite
def chunked_bodies(draw) -> tuple[bytes, int, float]:
    """(body, chunk size, pause between chunks): a /v1/completions body, valid or not, in chunks of any size."""
    body = draw(
        st.sampled_from(
            [
                json.dumps({**BASES["/v1/completions"], "max_tokens": 2}).encode(),
                json.dumps({**BASES["/v1/completions"], "max_tokens": 3, "stream": True}).encode(),
                b'{"prompt": "' + b"x" * 20_000 + b'"}',
                b"{" * 3000,
                b"",
            ]
        )
    )
    return body, draw(st.sampled_from([1, 2, 3, 17, 4096])), draw(st.sampled_from([0.0, 0.0, 0.001, 0.02]))


def test_chunked_and_slow_bodies_get_an_answer_and_nobody_waits(fuzz_stack, known):
    """Bodies in chunks of 1 byte and up, some paced: each gets a 200 or a 4xx, and a bystander's tiny requests
    are answered quickly meanwhile (a body parsed a byte at a time must not hold the event loop)."""
    port = fuzz_stack.http_port
    bound = bystander_bound(port)

    @settings(FUZZ, max_examples=15)
    @given(chunked_bodies())
    def one(example):
        body, size, pause = example

        pieces = range(0, len(body), size)
        # A paced body takes at most about 3 s in all (the fuzz stack's body deadline is 60 s).
        every = max(1, round(len(pieces) * pause / 3)) if pause else 0

        def send(sock: socket.socket) -> None:
            for k, start in enumerate(pieces):
                piece = body[start : start + size]
                sock.sendall(f"{len(piece):x}\r\n".encode() + piece + b"\r\n")
                if every and k % every == 0:
                    time.sleep(pause)
            sock.sendall(b"0\r\n\r\n")

        headers = "Transfer-Encoding: chunked\r\nContent-Type: application/json\r\nConnection: close\r\n"
        attack = Attack(port, headers, send)
        try:
            latencies = bystander_latencies(port, attack.running)
        finally:
            attack.close()
        tally("HTTP chunked and paced bodies", str(attack.status()))
        assert attack.status() in ALLOWED, attack.answer[:300]
        assert max(latencies) < bound, f"bystanders waited {sorted(latencies)[-3:]} (bound {bound:.2f} s)"

    one()
    unharmed(fuzz_stack, known)

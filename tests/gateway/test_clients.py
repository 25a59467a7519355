"""The engine's clients of the tokenizer and diffusion services: what a request gets when a call fails (one mapping,
engine/clients/errors.py). Fake stubs raise the statuses a real service or channel gives; the paths through real
services are the gateway suites' (tests/reliability kills the services themselves)."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace

import grpc
import pytest

from muestra.gateway.engine.clients import DiffusionClient, TokenizerClient, call_failed
from muestra.gateway.engine.requests import Message
from muestra.runtime.errors import DeadlineExceeded, MuestraError, Unavailable
from muestra.v1 import diffusion_pb2


def rpc_error(code: grpc.StatusCode, details: str = "it broke") -> grpc.aio.AioRpcError:
    return grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(), details)


def failing(code: grpc.StatusCode, seen: list | None = None):
    async def call(request, timeout):
        if seen is not None:
            seen.append((request, timeout))
        raise rpc_error(code)

    return call


def tokenizer_model(code: grpc.StatusCode, seen: list | None = None):
    stub = SimpleNamespace(
        Encode=failing(code, seen), ApplyChatTemplate=failing(code, seen), Decode=failing(code, seen)
    )
    return SimpleNamespace(name="tiny", tokenizer_model="tiny-tok", tokenizer=stub)


@pytest.mark.parametrize("code", [grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED])
def test_a_tokenizer_down_or_slow_is_unavailable_naming_it(code):
    client = TokenizerClient(tokenizer_model(code), timeout_s=5)
    with pytest.raises(Unavailable) as error:
        asyncio.run(client.prompt_ids("hello", True))
    assert str(error.value) == f"tokenizer of 'tiny' failed: {code.name} it broke"
    assert error.value.code == grpc.StatusCode.UNAVAILABLE


def test_the_requests_own_deadline_is_deadline_exceeded_and_bounds_the_call():
    seen: list = []
    client = TokenizerClient(tokenizer_model(grpc.StatusCode.DEADLINE_EXCEEDED, seen), timeout_s=5)
    with pytest.raises(DeadlineExceeded) as error:
        asyncio.run(client.chat_ids([Message("user", "hi")], "", deadline=time.monotonic() + 0.25))
    assert "the request's deadline" in str(error.value) and "its prompt was being tokenized" in str(error.value)
    (request, timeout), = seen  # fmt: skip
    assert 0 < timeout <= 0.25 and request.messages[0].content == "hi" and request.tokenize


def test_a_later_deadline_leaves_the_tokenizers_own_timeout():
    seen: list = []
    client = TokenizerClient(tokenizer_model(grpc.StatusCode.DEADLINE_EXCEEDED, seen), timeout_s=2)
    with pytest.raises(Unavailable):
        asyncio.run(client.decode([1, 2], True, deadline=time.monotonic() + 60))
    assert seen[0][1] == 2


@pytest.mark.parametrize("code", [grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND])
def test_the_services_verdict_on_the_request_passes_through(code):
    client = TokenizerClient(tokenizer_model(code), timeout_s=5)
    with pytest.raises(MuestraError) as error:
        asyncio.run(client.encode("x", False))
    assert error.value.code == code and str(error.value) == "it broke"
    assert not isinstance(error.value, Unavailable)


def diffusion_model(code: grpc.StatusCode):
    class Call:
        def __init__(self) -> None:
            self.cancelled = False

        def __aiter__(self):
            return self

        async def __anext__(self):
            raise rpc_error(code)

        def cancel(self) -> None:
            self.cancelled = True

    calls: list[Call] = []

    def generate(request, timeout):
        calls.append(Call())
        calls[-1].timeout = timeout
        return calls[-1]

    return SimpleNamespace(name="tiny-sd", stub=SimpleNamespace(Generate=generate)), calls


async def _drain(stream) -> list:
    return [message async for message in stream]


@pytest.mark.parametrize(
    ("code", "remaining", "expected"),
    [
        (grpc.StatusCode.UNAVAILABLE, None, Unavailable),
        (grpc.StatusCode.DEADLINE_EXCEEDED, None, Unavailable),  # --diffusion-timeout-s: the service is slow
        (grpc.StatusCode.DEADLINE_EXCEEDED, 0.5, DeadlineExceeded),  # the caller's deadline came first
        (grpc.StatusCode.INVALID_ARGUMENT, None, MuestraError),
    ],
)
def test_diffusion_failures_map_like_every_other_service(code, remaining, expected):
    model, calls = diffusion_model(code)
    client = DiffusionClient(model, timeout_s=30)
    with pytest.raises(expected) as error:
        asyncio.run(_drain(client.generate(diffusion_pb2.ImageRequest(model="tiny-sd"), remaining)))
    assert error.value.code == (code if expected is MuestraError else expected.code)
    assert calls[0].cancelled, "the call is cancelled however it ends"
    assert calls[0].timeout == (remaining or 30)
    if expected is Unavailable:
        assert "diffusion service of 'tiny-sd' failed" in str(error.value)


def test_one_mapping_names_the_service_and_the_wait():
    down = call_failed(rpc_error(grpc.StatusCode.UNAVAILABLE, ""), "lm replica 1")
    assert (type(down), str(down)) == (Unavailable, "lm replica 1 failed: UNAVAILABLE")
    late = call_failed(rpc_error(grpc.StatusCode.DEADLINE_EXCEEDED), "x", own_deadline=True, during="it waited")
    assert str(late) == "the request's deadline (timeout_ms, or its call's) passed while it waited"


def test_a_failed_lm_call_names_the_replica_as_every_client_names_its_service():
    from muestra.gateway.engine.clients.lm import LmFailed
    from muestra.gateway.engine.generation.detokenizer import TokenizerFailed

    lm = LmFailed("127.0.0.1:1", rpc_error(grpc.StatusCode.UNAVAILABLE, "connection refused"))
    assert (str(lm), lm.address, lm.code) == (
        "lm replica 127.0.0.1:1 failed: UNAVAILABLE connection refused", "127.0.0.1:1", grpc.StatusCode.UNAVAILABLE,
    )  # fmt: skip
    tokenizer = TokenizerFailed(SimpleNamespace(name="tiny"), rpc_error(grpc.StatusCode.DEADLINE_EXCEEDED, ""))
    assert str(tokenizer) == "tokenizer of 'tiny' failed: DEADLINE_EXCEEDED"
    assert str(tokenizer) == str(call_failed(rpc_error(grpc.StatusCode.DEADLINE_EXCEEDED, ""), "tokenizer of 'tiny'"))

"""The internal token: tokenizer, lm and diffusion refuse callers without it; the gateway sends it.

Real processes on loopback: a tokenizer and an lm that require the token, a gateway that has it, and
direct callers that do not. Health checks need no token; metrics ports need the same one.
"""

from __future__ import annotations

import urllib.error
import urllib.request

import grpc
import pytest

from muestra.client import Client
from muestra.runtime.healthcheck import check
from muestra.v1 import lm_pb2, lm_pb2_grpc, tokenizer_pb2, tokenizer_pb2_grpc
from tests.fixtures.text_stack import start_gateway
from tests.harness import ServiceProcess, free_port

TOKEN = "internal-test-token"


@pytest.fixture(scope="module")
def guarded(tiny_lm, tmp_path_factory):
    log_dir = tmp_path_factory.mktemp("internal-auth")
    model_dir = tiny_lm("llama").onnx_dir
    env = {"MUESTRA_INTERNAL_TOKEN": TOKEN}
    metrics_port = free_port()
    tokenizer = ServiceProcess("tokenizer", ["--models", str(model_dir)], log_dir, env=env)
    lm_flags = ["--model", str(model_dir), "--providers", "cpu", "--intra-op-threads", "1"]
    lm = ServiceProcess("lm", [*lm_flags, "--metrics-port", str(metrics_port)], log_dir, env=env)
    gateway = start_gateway(log_dir, tokenizer.address, lm.address, env=env)
    yield tokenizer, lm, gateway, metrics_port
    for process in (gateway, lm, tokenizer):
        process.stop()


def test_the_gateway_reaches_services_that_require_the_token(guarded):
    *_, gateway, _ = guarded
    with Client(gateway.address, timeout=60) as client:
        generation = client.generate("The quick brown fox", max_tokens=5, ignore_eos=True, seed=1).wait()
    assert len(generation.token_ids[0]) == 5


@pytest.mark.parametrize("token", [None, "wrong"], ids=["no-token", "wrong-token"])
def test_a_caller_without_the_token_is_unauthenticated(guarded, token):
    tokenizer, lm, _, _ = guarded
    metadata = [("authorization", f"Bearer {token}")] if token else []
    with grpc.insecure_channel(lm.address) as channel:
        stub = lm_pb2_grpc.LanguageModelStub(channel)
        for call in (
            lambda: stub.Clear(lm_pb2.ClearRequest(), metadata=metadata, timeout=10),
            lambda: list(stub.BatchSteps(iter([lm_pb2.BatchStepRequest(clear=lm_pb2.ClearRequest())]),
                                         metadata=metadata, timeout=10)),
        ):  # fmt: skip
            with pytest.raises(grpc.RpcError) as error:
                call()
            assert error.value.code() == grpc.StatusCode.UNAUTHENTICATED
            assert "internal token" in error.value.details()
    with grpc.insecure_channel(tokenizer.address) as channel:
        with pytest.raises(grpc.RpcError) as error:
            tokenizer_pb2_grpc.TokenizerStub(channel).Describe(
                tokenizer_pb2.DescribeTokenizerRequest(), metadata=metadata
            )
        assert error.value.code() == grpc.StatusCode.UNAUTHENTICATED
    # Health stays open (orchestrators probe it with no credentials).
    assert check(lm.address, timeout_s=5) == "SERVING"


def test_with_the_token_a_direct_caller_is_served_and_bearer_is_case_insensitive(guarded):
    _, lm, _, _ = guarded
    with grpc.insecure_channel(lm.address) as channel:
        reply = lm_pb2_grpc.LanguageModelStub(channel).Describe(
            lm_pb2.DescribeModelRequest(), metadata=[("authorization", f"bearer {TOKEN}")], timeout=10
        )
    assert reply.vocab_size > 0


def test_the_metrics_port_needs_the_token_too(guarded):
    *_, metrics_port = guarded
    url = f"http://127.0.0.1:{metrics_port}/metrics"
    with pytest.raises(urllib.error.HTTPError) as error:
        urllib.request.urlopen(url, timeout=10)
    assert error.value.code == 401
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {TOKEN}"})
    with urllib.request.urlopen(request, timeout=10) as response:
        assert b"muestra_lm_kv_cache_bytes" in response.read()

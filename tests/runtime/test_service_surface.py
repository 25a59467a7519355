"""Every service answers the standard health check and server reflection, and drains on SIGTERM."""

from __future__ import annotations

import threading
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from muestra.client import Client
from tests.harness import ServiceProcess

DEFAULT_TEXT_MODEL = Path(__file__).resolve().parents[2] / "models" / "muestra-text"


def reflected_services(address: str) -> set[str]:
    with grpc.insecure_channel(address) as channel:
        stub = reflection_pb2_grpc.ServerReflectionStub(channel)
        request = reflection_pb2.ServerReflectionRequest(list_services="")
        reply = next(stub.ServerReflectionInfo(iter([request]), timeout=10))
        return {s.name for s in reply.list_services_response.service}


def health(address: str, service: str = "") -> int:
    with grpc.insecure_channel(address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        return stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=10).status


@pytest.fixture(scope="module")
def stack(text_stack):
    return text_stack("llama")


@pytest.mark.parametrize(
    ("process", "service"),
    [("tokenizer", "muestra.v1.Tokenizer"), ("lm", "muestra.v1.LanguageModel"), ("gateway", "muestra.v1.Gateway")],
)
def test_health_is_serving_and_reflection_lists_the_service(stack, process, service):
    address = getattr(stack, process).address
    assert health(address) == health_pb2.HealthCheckResponse.SERVING
    assert health(address, service) == health_pb2.HealthCheckResponse.SERVING
    assert {service, "grpc.health.v1.Health", "grpc.reflection.v1alpha.ServerReflection"} <= reflected_services(address)


def test_sigterm_lets_an_in_flight_stream_finish(tmp_path, stack):
    # A gateway of its own (the shared one must keep serving), in front of the shared backends.
    gateway = ServiceProcess(
        "gateway",
        ["--tokenizer-addr", stack.tokenizer.address, "--lm-addr", stack.lm.address, "--grace-period-s", "20"],
        tmp_path,
    )
    result = {}

    def run() -> None:
        with Client(gateway.address, timeout=60) as client:
            result["generation"] = client.generate("drain me", max_tokens=150, ignore_eos=True, temperature=1.0).wait()

    thread = threading.Thread(target=run)
    thread.start()
    while stack.lm_rows() == 0 and thread.is_alive():
        pass
    assert gateway.stop(timeout_s=30) == 0
    thread.join(30)
    assert result["generation"].completions[0].completion_tokens == 150
    assert "stopping" in gateway.log_tail()

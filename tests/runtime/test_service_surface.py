"""Every service answers the standard health check and server reflection, and drains on SIGTERM."""

from __future__ import annotations

import threading

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from muestra.client import Client
from tests.harness import ServiceProcess


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


def watch_first_status(address: str, service: str = "") -> int:
    """The first status Health/Watch streams (the current one)."""
    with grpc.insecure_channel(address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        call = stub.Watch(health_pb2.HealthCheckRequest(service=service), timeout=10)
        try:
            return next(call).status
        finally:
            call.cancel()


@pytest.mark.parametrize("process", ["tokenizer", "lm", "gateway", "diffusion"])
def test_health_watch_streams_the_status(stack, diffusion_service, process):
    # grpc's Health/Watch handler writes with context.write: the runtime's interceptor must keep its kind.
    address = diffusion_service.address if process == "diffusion" else getattr(stack, process).address
    assert watch_first_status(address) == health_pb2.HealthCheckResponse.SERVING


def test_services_stopped_with_a_gateways_step_streams_open_log_no_error(tmp_path, text_stack, tiny_lm):
    """A tokenizer and an lm of their own, a generation through a gateway (its step streams stay open), SIGTERM."""
    from tests.fixtures.lm_service import start_lm
    from tests.fixtures.text_stack import start_gateway

    model_dir = tiny_lm("llama").onnx_dir
    tokenizer = ServiceProcess("tokenizer", ["--models", str(model_dir)], tmp_path)
    lm = start_lm(model_dir, "llama", tmp_path)
    gateway = start_gateway(tmp_path, tokenizer.address, lm.address)
    try:
        with Client(gateway.address, timeout=60) as client:
            for seed in range(3):
                client.generate("open streams", max_tokens=8, seed=seed, temperature=1.0).wait()
        assert tokenizer.stop(timeout_s=30) == 0
        assert lm.stop(timeout_s=30) == 0
    finally:
        gateway.stop()
        tokenizer.stop()
        lm.stop()
    for service in (tokenizer, lm):
        log = service.log_path.read_text(errors="replace")
        assert "stopped" in log
        assert "Traceback" not in log and "never retrieved" not in log, service.log_tail()

"""One generation runs at a time; at most max_queue wait; the next one is RESOURCE_EXHAUSTED."""

from __future__ import annotations

import time

import grpc
import pytest

from muestra.v1 import diffusion_pb2
from tests.diffusion.client import generate, metric, stub
from tests.fixtures.diffusion_models import start_diffusion_service


@pytest.fixture(scope="module")
def one_waiting_service(tiny_sd_model, tmp_path_factory):
    service = start_diffusion_service(tiny_sd_model, tmp_path_factory.mktemp("logs"), "--max-queue", "1")
    yield service
    service.process.stop()


def _wait_for(predicate, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_a_full_queue_is_resource_exhausted_and_frees_up_afterwards(one_waiting_service):
    address, port = one_waiting_service.address, one_waiting_service.metrics_port
    long_run = diffusion_pb2.ImageRequest(prompt="long", steps=150, seed=1, width=256, height=256)
    running = stub(address).Generate(long_run, timeout=300)
    assert next(running).progress.step == 1
    waiting = stub(address).Generate(diffusion_pb2.ImageRequest(prompt="short", steps=2, seed=2), timeout=300)
    _wait_for(lambda: metric(port, "muestra_diffusion_queue_depth") == 2)

    with pytest.raises(grpc.RpcError) as error:
        generate(address, prompt="one too many", steps=2, seed=3)
    assert error.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "max_queue=1" in error.value.details()

    # The waiting request runs once the running one is gone, and then the queue has room again.
    running.cancel()
    responses = list(waiting)
    assert [r.WhichOneof("kind") for r in responses] == ["progress", "progress", "image"]
    assert responses[-1].image.seed == 2
    _wait_for(lambda: metric(port, "muestra_diffusion_queue_depth") == 0)
    assert len(generate(address, prompt="room again", steps=2, seed=3).images) == 1


def test_a_request_cancelled_while_waiting_never_runs(one_waiting_service):
    address, port = one_waiting_service.address, one_waiting_service.metrics_port
    running = stub(address).Generate(
        diffusion_pb2.ImageRequest(prompt="long", steps=150, seed=1, width=256, height=256), timeout=300
    )
    assert next(running).progress.step == 1
    waiting = stub(address).Generate(diffusion_pb2.ImageRequest(prompt="never", steps=2, seed=2), timeout=300)
    _wait_for(lambda: metric(port, "muestra_diffusion_queue_depth") == 2)
    images_before = metric(port, "muestra_diffusion_images_total")
    cancelled_lines = one_waiting_service.process.log_tail(1000).count("Generate CANCELLED")
    waiting.cancel()
    # Only once the service has seen that cancellation does the running request go away.
    _wait_for(lambda: one_waiting_service.process.log_tail(1000).count("Generate CANCELLED") > cancelled_lines)
    running.cancel()
    _wait_for(lambda: metric(port, "muestra_diffusion_queue_depth") == 0)
    assert metric(port, "muestra_diffusion_images_total") == images_before
    assert "generation cancelled by the client before it started" in one_waiting_service.process.log_tail(100)

"""Clients that cancel at any moment never take the service down."""

from __future__ import annotations

import random

import grpc
import pytest

from muestra.v1 import diffusion_pb2
from tests.diffusion.client import generate, stub
from tests.fixtures.diffusion_models import start_diffusion_service


@pytest.fixture(scope="module")
def own_service(tiny_sd_model, tmp_path_factory):
    """A service of this module's own, so that a crash here does not fail the other modules' tests."""
    service = start_diffusion_service(tiny_sd_model, tmp_path_factory.mktemp("logs"))
    yield service
    service.process.stop()


def test_the_service_survives_many_cancellations_at_random_points(own_service):
    rng = random.Random(1)
    for i in range(100):
        request = diffusion_pb2.ImageRequest(
            prompt="x", steps=150, seed=i, width=rng.choice([64, 128]), preview_every=rng.choice([0, 1])
        )
        call = stub(own_service.address).Generate(request, timeout=60)
        for _ in range(rng.randint(0, 4)):
            next(call)
        call.cancel()
        assert own_service.process.proc.poll() is None, f"crashed after {i + 1} cancellations:\n" + (
            own_service.process.log_tail(60)
        )
    with pytest.raises(grpc.RpcError):
        next(call)
    assert len(generate(own_service.address, prompt="still here", steps=2, seed=1).images) == 1

"""Gateway start-up: an image-only gateway needs only --diffusion-addr; a backend that never answers is one line."""

from __future__ import annotations

import subprocess
import sys
import time

import grpc

from muestra.v1 import gateway_pb2, gateway_pb2_grpc
from tests.harness import ServiceProcess, free_port


def test_a_gateway_given_only_a_diffusion_address_serves_images_alone(diffusion_service, tmp_path):
    started = time.monotonic()
    gateway = ServiceProcess("gateway", ["--diffusion-addr", diffusion_service.address, "--http-port", "-1"], tmp_path)
    try:
        took = time.monotonic() - started
        with grpc.insecure_channel(gateway.address) as channel:
            models = gateway_pb2_grpc.GatewayStub(channel).ListModels(gateway_pb2.ListModelsRequest(), timeout=10)
        log = gateway.log_path.read_text(errors="replace")
    finally:
        gateway.stop()
    assert [m.kind for m in models.models] == ["image"]
    assert "waiting up to" not in log  # it never looked for an lm at the default address
    assert took < 60


def test_a_backend_that_never_answers_ends_the_gateway_with_one_line_naming_it_and_the_flag(tmp_path):
    dead = f"127.0.0.1:{free_port()}"  # nothing listens there
    done = subprocess.run(
        [sys.executable, "-m", "muestra.gateway", "--port", str(free_port()), "--http-port", "-1",
         "--lm-addr", dead, "--startup-timeout-s", "1"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 1
    assert "Traceback" not in done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("muestra-gateway: the lm service at " + dead + " did not answer")
    assert "--lm-addr" in last

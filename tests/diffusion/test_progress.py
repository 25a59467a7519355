"""Progress streams step by step; a client that cancels stops the denoising loop at the next step."""

from __future__ import annotations

import io
import re
import time

import grpc
import pytest
from PIL import Image

from muestra.v1 import diffusion_pb2
from tests.diffusion.client import generate, metric, stub

STEPS_METRIC = "muestra_diffusion_denoise_steps_total"


@pytest.mark.parametrize("sampler", ["euler", "heun", "pndm"])
def test_progress_arrives_in_order_one_per_step_per_image(sampler, diffusion_service):
    # heun evaluates the model twice per step and pndm adds warm-up iterations; both still report `steps` steps.
    result = generate(diffusion_service.address, prompt="a cat", steps=5, seed=1, num_images=2, sampler=sampler)
    assert [(p.image_index, p.step, p.total) for p in result.progress] == [
        (image, step, 5) for image in (0, 1) for step in range(1, 6)
    ]
    # Each image follows its own progress.
    assert result.kinds == ["progress"] * 5 + ["image"] + ["progress"] * 5 + ["image"]
    elapsed = [p.elapsed_s for p in result.progress]
    assert elapsed == sorted(elapsed) and elapsed[0] > 0


def test_previews_come_every_k_steps_as_latent_sized_pngs(diffusion_service):
    result = generate(diffusion_service.address, prompt="a cat", steps=7, seed=1, width=128, height=64, preview_every=3)
    with_preview = [p.step for p in result.progress if p.preview_png]
    assert with_preview == [3, 6]
    preview = Image.open(io.BytesIO(result.progress[2].preview_png))
    assert (preview.format, preview.size, preview.mode) == ("PNG", (16, 8), "RGB")
    assert not any(p.preview_png for p in generate(diffusion_service.address, prompt="a", steps=3).progress)


def _wait_until_stable(read, settle_s: float = 0.5, timeout_s: float = 30.0) -> float:
    value, deadline = read(), time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        time.sleep(settle_s)
        now = read()
        if now == value:
            return value
        value = now
    raise AssertionError("value still changing")


def test_cancelling_stops_the_loop_within_one_step_and_the_next_request_is_served(diffusion_service):
    address, port = diffusion_service.address, diffusion_service.metrics_port
    before = metric(port, STEPS_METRIC)
    call = stub(address).Generate(
        diffusion_pb2.ImageRequest(prompt="a long run", steps=150, seed=3, width=256, height=256), timeout=300
    )
    seen = [next(call).progress.step for _ in range(3)]
    assert seen == [1, 2, 3]
    call.cancel()
    with pytest.raises(grpc.RpcError) as error:
        next(call)
    assert error.value.code() == grpc.StatusCode.CANCELLED

    done = _wait_until_stable(lambda: metric(port, STEPS_METRIC)) - before
    assert 3 <= done < 150
    log = ""
    for _ in range(50):
        log = diffusion_service.process.log_tail(400)
        if "cancelled by the client at step" in log:
            break
        time.sleep(0.1)
    match = re.findall(r"cancelled by the client at step (\d+); the loop stopped after step (\d+) of 150", log)[-1]
    cancelled_at, stopped_after = int(match[0]), int(match[1])
    assert stopped_after - cancelled_at <= 1
    assert stopped_after == done

    result = generate(address, prompt="the next one", steps=2, seed=4)
    assert len(result.images) == 1 and [p.step for p in result.progress] == [1, 2]

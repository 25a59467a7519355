"""A late preview looks like the image being made: a downscaled copy of it, whatever the scheduler.

Through the diffusion service's gRPC stream and the gateway's HTTP stream, on models/muestra-image (whose
images are pictures, where the tests' random model's are noise). Before previews showed each step's
estimate of the final latents, decoded by the VAE, the last previews were near-black and none correlated
above 0.43 with the final image (issue 46).
"""

from __future__ import annotations

import base64
import io
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from muestra.diffusion.denoised import estimate_from_model_output
from muestra.v1 import diffusion_pb2
from tests.diffusion.client import generate, looks_like, pixels, stub
from tests.fixtures.diffusion_models import start_diffusion_service
from tests.harness import ServiceProcess, free_port

MODEL = Path(__file__).resolve().parents[2] / "models" / "muestra-image"
PROMPT, SEED, STEPS = "a handwritten seven", 3, 20
LATE = STEPS - 2  # not the last step, whose estimate is the final latents themselves


def recognisable(correlation: float, difference: float) -> bool:
    # Measured on this model at step 18 of 20: 0.99 or more and under 3 for every scheduler.
    return correlation >= 0.9 and difference < 10


@pytest.fixture(scope="module")
def image_model_stack(tmp_path_factory):
    """The diffusion service on models/muestra-image and a gateway with its HTTP API in front of it."""
    if not (MODEL / "vae" / "diffusion_pytorch_model.safetensors").is_file():
        pytest.skip("models/muestra-image is not here")
    log_dir = tmp_path_factory.mktemp("preview-logs")
    diffusion = start_diffusion_service(MODEL, log_dir)
    http_port = free_port()
    try:
        gateway = ServiceProcess(
            "gateway", ["--diffusion-addr", diffusion.address, "--http-port", str(http_port)], log_dir
        )
    except Exception:
        diffusion.process.stop()
        raise
    yield diffusion, f"http://127.0.0.1:{http_port}/v1"
    gateway.stop()
    diffusion.process.stop()


def test_a_late_grpc_preview_looks_like_the_final_image_for_every_scheduler(image_model_stack):
    address = image_model_stack[0].address
    schedulers = [s.name for s in stub(address).ListSchedulers(diffusion_pb2.ListSchedulersRequest()).schedulers]
    assert {"euler", "ddim", "dpmpp_2m"} <= set(schedulers)
    unlike = {}
    for name in schedulers:
        result = generate(address, prompt=PROMPT, steps=STEPS, seed=SEED, sampler=name, preview_every=1, timeout=300)
        previews = {p.step: pixels(p.preview_png) for p in result.progress if p.preview_png}
        assert sorted(previews) == list(range(1, STEPS + 1)), name
        score = looks_like(previews[LATE], pixels(result.images[0].png))
        if not recognisable(*score):
            unlike[name] = score
    assert not unlike, f"(correlation, mean difference) of the step {LATE} preview: {unlike}"


@pytest.mark.parametrize("sampler", ["euler", "ddim"])
def test_a_late_http_partial_image_looks_like_the_completed_image(image_model_stack, sampler):
    import openai

    client = openai.OpenAI(base_url=image_model_stack[1], api_key="unused", max_retries=0, timeout=300)
    extra = {"steps": STEPS, "seed": SEED, "sampler": sampler, "preview_every": 1}
    events = list(client.images.generate(model="muestra-image", prompt=PROMPT, stream=True, extra_body=extra))
    partials = {e.model_extra["step"]: e for e in events if e.type == "image_generation.partial_image"}
    (completed,) = [e for e in events if e.type == "image_generation.completed"]
    assert sorted(partials) == list(range(1, STEPS + 1))
    late = np.asarray(Image.open(io.BytesIO(base64.b64decode(partials[LATE].b64_json))).convert("RGB"))
    final = pixels(base64.b64decode(completed.b64_json))
    assert late.shape[:2] == (final.shape[0] // 4, final.shape[1] // 4)  # latent-sized: the VAE halves twice
    assert recognisable(*looks_like(late, final))


@pytest.mark.parametrize("sampler", ["euler_a", "ddpm"])
def test_previews_leave_a_stochastic_schedulers_image_as_it_is(image_model_stack, sampler):
    # The pipeline gives the scheduler the request's generator only if its step's signature asks for one.
    address = image_model_stack[0].address
    asked = {"prompt": PROMPT, "steps": 6, "seed": SEED, "sampler": sampler}
    with_previews = generate(address, preview_every=1, **asked).images[0].png
    np.testing.assert_array_equal(pixels(with_previews), pixels(generate(address, **asked).images[0].png))


@pytest.mark.parametrize("prediction_type", ["epsilon", "v_prediction"])
def test_the_estimate_computed_for_schedulers_that_report_none_equals_ddims_own(prediction_type):
    # PNDM, DPM-Solver++ and UniPC return no estimate; DDIM's pred_original_sample is the same formula.
    from diffusers import DDIMScheduler

    scheduler = DDIMScheduler(beta_schedule="scaled_linear", prediction_type=prediction_type, clip_sample=False)
    scheduler.set_timesteps(10)
    generator = torch.Generator().manual_seed(0)
    sample, model_output = torch.randn(2, 1, 4, 8, 8, generator=generator)
    timestep = scheduler.timesteps[3]
    own = scheduler.step(model_output, timestep, sample).pred_original_sample
    torch.testing.assert_close(estimate_from_model_output(scheduler, model_output, timestep, sample), own)

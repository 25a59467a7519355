"""The latent previews the playground shows look like the image being made (models/muestra-image).

In process, on a bare diffusers pipeline with the service's preview (`service_preview`) of each step's
estimate of the final latents (`DenoisedEstimate`); tests/diffusion/test_previews.py checks what the
service and the gateway stream.
"""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from muestra.diffusion.denoised import DenoisedEstimate
from muestra.diffusion.preview import preview_for, service_preview
from tests.diffusion.client import looks_like

MODEL = Path(__file__).resolve().parents[2] / "models" / "muestra-image"
STEPS = 20


def recognisable(correlation: float, difference: float) -> bool:
    return correlation > 0.8 and difference < 60


def shown(png: bytes) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(png)).convert("RGB"))


@pytest.fixture(scope="module")
def pipe():
    from diffusers import StableDiffusionPipeline

    if not (MODEL / "vae" / "diffusion_pytorch_model.safetensors").is_file():
        pytest.skip("models/muestra-image is not here")
    pipe = StableDiffusionPipeline.from_pretrained(MODEL, local_files_only=True, safety_checker=None)
    pipe.set_progress_bar_config(disable=True)
    return pipe


CASES = [("a handwritten seven", 3), ("a handwritten nine", 7), ("a red circle", 7)]


@pytest.mark.parametrize(("prompt", "seed"), CASES)
def test_a_late_preview_looks_like_the_final_image(pipe, prompt, seed):
    latents, estimates = {}, {}
    pipe.scheduler = type(pipe.scheduler).from_config(pipe.scheduler.config)  # a fresh one, as the service builds
    denoised = DenoisedEstimate(pipe.scheduler)

    def keep(_pipe, step, _t, tensors):
        latents[step], estimates[step] = tensors["latents"].clone(), denoised.latest.clone()
        return tensors

    generator = torch.manual_seed(seed)
    out = pipe(prompt, num_inference_steps=STEPS, generator=generator, output_type="np", callback_on_step_end=keep)
    image = (out.images[0] * 255).round().astype(np.uint8)
    late = STEPS - 2  # the step before the last
    preview = shown(service_preview(pipe.vae).png(estimates[late]))
    assert preview.shape[:2] == latents[late].shape[-2:]
    correlation, difference = looks_like(preview, image)
    print(f"{prompt}, seed {seed}: correlation {correlation:.3f}, mean difference {difference:.1f}")
    assert recognisable(correlation, difference)
    if seed == 3:  # what the service streamed before: the latents between steps, by factors fitted to the VAE
        assert not recognisable(*looks_like(shown(preview_for(pipe.vae).png(latents[late])), image))

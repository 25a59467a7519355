"""The latent previews the playground shows look like the image being made (models/muestra-image)."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from PIL import Image

from muestra.diffusion.preview import SD1_FACTORS, LatentPreview, preview_for

MODEL = Path(__file__).resolve().parents[2] / "models" / "muestra-image"
STEPS = 20


def looks_like(preview: np.ndarray, image: np.ndarray) -> tuple[float, float]:
    """(correlation, mean absolute difference in 0-255) of a preview with the image averaged to its size."""
    target = F.adaptive_avg_pool2d(torch.from_numpy(image).permute(2, 0, 1)[None].float(), preview.shape[:2])
    target = target[0].permute(1, 2, 0).numpy()
    shown = preview.astype(np.float32)
    return float(np.corrcoef(shown.flatten(), target.flatten())[0, 1]), float(np.abs(shown - target).mean())


def recognisable(correlation: float, difference: float) -> bool:
    return correlation > 0.8 and difference < 60


@pytest.fixture(scope="module")
def pipe():
    from diffusers import StableDiffusionPipeline

    if not (MODEL / "vae" / "diffusion_pytorch_model.safetensors").is_file():
        pytest.skip("models/muestra-image is not here")
    pipe = StableDiffusionPipeline.from_pretrained(MODEL, local_files_only=True, safety_checker=None)
    pipe.set_progress_bar_config(disable=True)
    return pipe


@pytest.mark.parametrize("prompt", ["a handwritten nine", "a red circle"])
def test_a_late_preview_looks_like_the_final_image_where_sd_factors_did_not(pipe, prompt):
    latents = {}

    def keep(_pipe, step, _t, tensors):
        latents[step] = tensors["latents"].clone()
        return tensors

    out = pipe(
        prompt, num_inference_steps=STEPS, generator=torch.manual_seed(7), output_type="np", callback_on_step_end=keep
    )
    image = (out.images[0] * 255).round().astype(np.uint8)
    late = latents[STEPS - 2]  # the step before the last
    preview = preview_for(pipe.vae)  # what the diffusion service uses for this model
    shown = np.asarray(Image.open(io.BytesIO(preview.png(late))).convert("RGB"))
    assert shown.shape[:2] == late.shape[-2:]
    correlation, difference = looks_like(shown, image)
    print(f"{prompt}: correlation {correlation:.3f}, mean difference {difference:.1f}")
    assert recognisable(correlation, difference)
    # The SD 1.x factors every model got before: coloured blocks that fail the same test.
    old = np.asarray(Image.open(io.BytesIO(LatentPreview(SD1_FACTORS).png(late))).convert("RGB"))
    assert not recognisable(*looks_like(old, image))

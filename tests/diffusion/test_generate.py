"""Images from the service equal a bare diffusers pipeline's, seed for seed."""

from __future__ import annotations

import io
import struct

import numpy as np
import torch
from PIL import Image

from muestra.v1 import diffusion_pb2
from tests.diffusion.client import generate, pixels, stub
from tests.fixtures.diffusion_models import TORCH_THREADS, torch_threads

PROMPT = "a photo of a cat sitting on a red chair"


def test_pixels_equal_a_bare_pipeline_call(diffusion_service, reference_sd):
    result = generate(
        diffusion_service.address,
        prompt=PROMPT,
        negative_prompt="blurry, low quality",
        width=96,
        height=64,
        steps=4,
        guidance_scale=6.5,
        seed=1234,
    )
    [image] = result.images
    expected = reference_sd.image(
        prompt=PROMPT,
        negative_prompt="blurry, low quality",
        width=96,
        height=64,
        steps=4,
        guidance_scale=6.5,
        seed=1234,
    )
    assert (image.width, image.height) == (96, 64)
    assert expected.shape == (64, 96, 3)
    np.testing.assert_array_equal(pixels(image.png), expected)


def test_guidance_of_one_or_less_runs_without_guidance_like_the_pipeline(diffusion_service, reference_sd):
    [image] = generate(diffusion_service.address, prompt=PROMPT, steps=3, guidance_scale=1.0, seed=5).images
    expected = reference_sd.image(prompt=PROMPT, width=64, height=64, steps=3, guidance_scale=1.0, seed=5)
    np.testing.assert_array_equal(pixels(image.png), expected)


def test_same_seed_same_image_different_seed_different_image(diffusion_service):
    def png_for(seed: int) -> np.ndarray:
        [image] = generate(diffusion_service.address, prompt=PROMPT, steps=3, seed=seed).images
        return pixels(image.png)

    first, again, other = png_for(7), png_for(7), png_for(8)
    np.testing.assert_array_equal(first, again)
    assert not np.array_equal(first, other)


def test_num_images_uses_consecutive_seeds_each_equal_to_a_single_image_call(diffusion_service):
    batch = generate(diffusion_service.address, prompt=PROMPT, steps=3, seed=40, num_images=3).images
    assert [image.index for image in batch] == [0, 1, 2]
    assert [image.seed for image in batch] == [40, 41, 42]
    for image in batch:
        [single] = generate(diffusion_service.address, prompt=PROMPT, steps=3, seed=image.seed).images
        np.testing.assert_array_equal(pixels(image.png), pixels(single.png))
    assert not np.array_equal(pixels(batch[0].png), pixels(batch[1].png))


def test_a_missing_seed_is_chosen_and_reported(diffusion_service):
    [image] = generate(diffusion_service.address, prompt=PROMPT, steps=2).images
    [again] = generate(diffusion_service.address, prompt=PROMPT, steps=2, seed=image.seed).images
    np.testing.assert_array_equal(pixels(image.png), pixels(again.png))
    assert f"Seed: {image.seed}," in image.parameters


def _text_chunks(png: bytes) -> dict[str, str]:
    """The tEXt chunks of a PNG, read from the bytes (not through PIL)."""
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    chunks, offset = {}, 8
    while offset < len(png):
        (length,) = struct.unpack(">I", png[offset : offset + 4])
        kind, data = png[offset + 4 : offset + 8], png[offset + 8 : offset + 8 + length]
        if kind == b"tEXt":
            key, _, value = data.partition(b"\0")
            chunks[key.decode("latin-1")] = value.decode("latin-1")
        offset += 12 + length
    return chunks


def test_png_carries_the_generation_parameters(diffusion_service, tiny_sd_model):
    [image] = generate(
        diffusion_service.address,
        prompt=PROMPT,
        negative_prompt="blurry",
        steps=3,
        guidance_scale=5.5,
        seed=99,
        sampler="euler_a",
        width=64,
        height=72,
    ).images
    text = _text_chunks(image.png)["parameters"]
    assert text == image.parameters
    assert text.splitlines() == [
        PROMPT,
        "Negative prompt: blurry",
        f"Steps: 3, Sampler: euler_a, CFG scale: 5.5, Seed: 99, Size: 64x72, Model: {tiny_sd_model.name}",
    ]
    assert Image.open(io.BytesIO(image.png)).size == (64, 72)


def test_describe_reports_the_model_device_dtype_and_limits(diffusion_service, tiny_sd_model):
    info = stub(diffusion_service.address).Describe(diffusion_pb2.DescribeDiffusionRequest())
    assert (info.model, info.device, info.dtype) == (tiny_sd_model.name, "cpu", "float32")
    assert info.pipeline == "StableDiffusionPipeline"
    assert (info.default_width, info.default_height) == (64, 64)
    assert (info.max_width, info.max_height, info.max_steps, info.max_images) == (2048, 2048, 150, 8)


def test_zero_fields_select_the_defaults(diffusion_service, reference_sd):
    # Like a pipeline call without them: steps 0 -> 50, size 0 -> the model's 64x64, guidance absent -> 7.5,
    # num_images 0 -> 1.
    [image] = generate(diffusion_service.address, prompt=PROMPT, seed=3).images
    assert "Steps: 50," in image.parameters and "CFG scale: 7.5," in image.parameters
    with torch_threads(TORCH_THREADS):
        expected = reference_sd.pipe(
            prompt=PROMPT, generator=torch.Generator("cpu").manual_seed(3), output_type="np"
        ).images[0]
    np.testing.assert_array_equal(pixels(image.png), (expected * 255).round().astype(np.uint8))

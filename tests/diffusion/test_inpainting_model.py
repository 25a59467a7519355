"""A dedicated inpainting folder (9-channel UNet, StableDiffusionInpaintPipeline) is served for inpainting only."""

from __future__ import annotations

import dataclasses

import grpc
import numpy as np
import pytest
import torch

from muestra.v1 import diffusion_pb2
from tests.diffusion.client import generate, pixels, rpc_error, stub
from tests.diffusion.test_img2img import encode, random_image, square_mask
from tests.fixtures.diffusion_models import TINY, TORCH_THREADS, build_random_sd, start_diffusion_service, torch_threads

PROMPT = "a bowl of fruit on a wooden table"


@pytest.fixture(scope="module")
def inpainting_model(tmp_path_factory):
    config = dataclasses.replace(TINY, inpainting=True)
    return build_random_sd(tmp_path_factory.mktemp("diffusion-models") / "tiny-sd-inpainting", config)


@pytest.fixture(scope="module")
def inpainting_service(inpainting_model, tmp_path_factory):
    service = start_diffusion_service(inpainting_model, tmp_path_factory.mktemp("logs"))
    yield service
    service.process.stop()


def test_the_9_channel_unet_inpaints_like_a_bare_inpaint_pipeline(inpainting_model, inpainting_service):
    from diffusers import StableDiffusionInpaintPipeline

    info = stub(inpainting_service.address).Describe(diffusion_pb2.DescribeDiffusionRequest(), timeout=10)
    assert info.pipeline == "StableDiffusionInpaintPipeline"
    init, mask = random_image(seed=70), square_mask()
    result = generate(
        inpainting_service.address, prompt=PROMPT, init_image=encode(init), mask_image=encode(mask), strength=0.8,
        steps=5, seed=71, preview_every=1,
    )  # fmt: skip
    [image] = result.images
    assert [p.total for p in result.progress] == [4] * 4 and all(p.preview_png for p in result.progress)

    pipe = StableDiffusionInpaintPipeline.from_pretrained(
        inpainting_model, local_files_only=True, safety_checker=None, requires_safety_checker=False
    )
    assert pipe.unet.config.in_channels == 9
    pipe.set_progress_bar_config(disable=True)
    with torch_threads(TORCH_THREADS):
        expected = pipe(
            prompt=PROMPT, image=init, mask_image=mask, strength=0.8, num_inference_steps=5, width=64, height=64,
            generator=torch.Generator("cpu").manual_seed(71),
        ).images[0]  # fmt: skip
    np.testing.assert_array_equal(pixels(image.png), np.asarray(expected))


@pytest.mark.parametrize(
    ("fields", "field"), [({}, "init_image"), ({"init_image": encode(random_image()), "strength": 0.5}, "mask_image")]
)
def test_text_to_image_and_img2img_are_refused_naming_what_is_missing(fields, field, inpainting_service):
    error = rpc_error(inpainting_service.address, prompt=PROMPT, steps=2, **fields)
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error.details() == f"{field}: is required: model 'tiny-sd-inpainting' is an inpainting model"

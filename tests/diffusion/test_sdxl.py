"""An SDXL folder (model_index.json says StableDiffusionXLPipeline) is served by the same service."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from muestra.v1 import diffusion_pb2
from tests.diffusion.client import generate, pixels, stub
from tests.fixtures.diffusion_models import TORCH_THREADS, build_random_sdxl, start_diffusion_service, torch_threads


@pytest.fixture(scope="module")
def sdxl_model(tmp_path_factory):
    return build_random_sdxl(tmp_path_factory.mktemp("diffusion-models") / "tiny-sdxl")


@pytest.fixture(scope="module")
def sdxl_service(sdxl_model, tmp_path_factory):
    service = start_diffusion_service(sdxl_model, tmp_path_factory.mktemp("logs"))
    yield service
    service.process.stop()


def test_sdxl_pixels_equal_a_bare_sdxl_pipeline_call(sdxl_model, sdxl_service):
    from diffusers import StableDiffusionXLPipeline

    info = stub(sdxl_service.address).Describe(diffusion_pb2.DescribeDiffusionRequest())
    assert (info.pipeline, info.default_width, info.default_height) == ("StableDiffusionXLPipeline", 64, 64)
    # guidance_scale is left out on both sides: the service takes the pipeline's own default (5 for SDXL).

    result = generate(
        sdxl_service.address, prompt="a lighthouse at sunset", steps=3, seed=17, width=64, height=80, preview_every=1
    )
    [image] = result.images
    assert all(p.preview_png for p in result.progress)

    pipe = StableDiffusionXLPipeline.from_pretrained(sdxl_model, local_files_only=True)
    pipe.set_progress_bar_config(disable=True)
    with torch_threads(TORCH_THREADS):
        expected = pipe(
            prompt="a lighthouse at sunset",
            width=64,
            height=80,
            num_inference_steps=3,
            generator=torch.Generator("cpu").manual_seed(17),
            output_type="np",
        ).images[0]
    np.testing.assert_array_equal(pixels(image.png), (expected * 255).round().astype(np.uint8))


def test_sdxl_img2img_and_inpainting_equal_bare_sdxl_pipelines(sdxl_model, sdxl_service):
    from diffusers import StableDiffusionXLImg2ImgPipeline, StableDiffusionXLInpaintPipeline, StableDiffusionXLPipeline

    from tests.diffusion.test_img2img import encode, random_image, square_mask

    init, mask = random_image(seed=30), square_mask()
    [edited] = generate(
        sdxl_service.address, prompt="a lighthouse", init_image=encode(init), strength=0.6, steps=5, seed=31
    ).images
    [inpainted] = generate(
        sdxl_service.address, prompt="a lighthouse", init_image=encode(init), mask_image=encode(mask), strength=0.8,
        steps=5, seed=32, guidance_scale=6.0,
    ).images  # fmt: skip

    base = StableDiffusionXLPipeline.from_pretrained(sdxl_model, local_files_only=True)
    components = {k: v for k, v in base.components.items() if k not in ("image_encoder", "feature_extractor")}
    img2img = StableDiffusionXLImg2ImgPipeline(**components)
    inpaint = StableDiffusionXLInpaintPipeline(**components)
    with torch_threads(TORCH_THREADS):
        expected_edit = img2img(
            prompt="a lighthouse", image=init, strength=0.6, num_inference_steps=5,
            generator=torch.Generator("cpu").manual_seed(31),
        ).images[0]  # fmt: skip
        inpaint.scheduler = type(base.scheduler).from_config(base.scheduler.config)
        expected_inpaint = inpaint(
            prompt="a lighthouse", image=init, mask_image=mask, strength=0.8, num_inference_steps=5, width=64,
            height=64, guidance_scale=6.0, generator=torch.Generator("cpu").manual_seed(32),
        ).images[0]  # fmt: skip
    np.testing.assert_array_equal(pixels(edited.png), np.asarray(expected_edit))
    np.testing.assert_array_equal(pixels(inpainted.png), np.asarray(expected_inpaint))


def test_an_sdxl_lora_on_both_text_encoders_equals_bare_diffusers(sdxl_model, tmp_path_factory):
    from diffusers import StableDiffusionXLPipeline

    from tests.fixtures.diffusion_models import build_random_lora

    loras = tmp_path_factory.mktemp("sdxl-loras")
    build_random_lora(loras, sdxl_model, "glow", seed=3)
    service = start_diffusion_service(sdxl_model, tmp_path_factory.mktemp("logs"), "--lora-dir", str(loras))
    try:
        call = {"prompt": "a lighthouse", "steps": 3, "seed": 19, "width": 64, "height": 64}
        [with_lora] = generate(
            service.address, **call, loras=[diffusion_pb2.LoraWeight(name="glow", weight=0.9)]
        ).images
        [without] = generate(service.address, **call).images
    finally:
        service.process.stop()
    pipe = StableDiffusionXLPipeline.from_pretrained(sdxl_model, local_files_only=True)
    pipe.set_progress_bar_config(disable=True)

    def bare():
        with torch_threads(TORCH_THREADS):
            return pipe(
                prompt="a lighthouse", num_inference_steps=3, width=64, height=64,
                generator=torch.Generator("cpu").manual_seed(19),
            ).images[0]  # fmt: skip

    base = np.asarray(bare())
    pipe.load_lora_weights(str(loras / "glow.safetensors"), adapter_name="glow")
    assert set(pipe.get_list_adapters()) == {"unet", "text_encoder", "text_encoder_2"}
    pipe.set_adapters(["glow"], [0.9])
    np.testing.assert_array_equal(pixels(with_lora.png), np.asarray(bare()))
    np.testing.assert_array_equal(pixels(without.png), base)
    assert not np.array_equal(base, pixels(with_lora.png))

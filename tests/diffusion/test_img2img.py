"""img2img and inpainting through the service equal bare diffusers pipelines on the same components."""

from __future__ import annotations

import io

import grpc
import numpy as np
import pytest
from diffusers import EulerAncestralDiscreteScheduler
from PIL import Image, ImageOps

from muestra.v1 import diffusion_pb2
from tests.diffusion.client import cancellations, generate, next_cancellation, pixels, stub

PROMPT = "a watercolor painting of a lighthouse at sunset"


def random_image(width: int = 64, height: int = 64, seed: int = 0) -> Image.Image:
    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8))


def square_mask(width: int = 64, height: int = 64) -> Image.Image:
    """White (repaint) in the middle, black (keep) around it."""
    mask = Image.new("L", (width, height), 0)
    mask.paste(255, (width // 4, height // 4, 3 * width // 4, 3 * height // 4))
    return mask


def infotext(parameters: str) -> dict[str, str]:
    """The "key: value" pairs of the parameters text's last line."""
    return dict(pair.split(": ", 1) for pair in parameters.splitlines()[-1].split(", "))


def encode(image: Image.Image, fmt: str = "PNG", **options) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format=fmt, **options)
    return buffer.getvalue()


def test_img2img_pixels_equal_a_bare_img2img_pipeline(diffusion_service, reference_edits):
    init = random_image()
    result = generate(
        diffusion_service.address, prompt=PROMPT, negative_prompt="blurry", init_image=encode(init),
        strength=0.6, steps=5, guidance_scale=6.5, seed=21,
    )  # fmt: skip
    [image] = result.images
    expected = reference_edits.image(
        reference_edits.img2img, prompt=PROMPT, negative_prompt="blurry", image=init, strength=0.6,
        num_inference_steps=5, guidance_scale=6.5, seed=21,
    )  # fmt: skip
    np.testing.assert_array_equal(pixels(image.png), np.asarray(expected))
    # int(5 * 0.6) = 3 steps run, and progress counts those.
    assert [(p.step, p.total) for p in result.progress] == [(1, 3), (2, 3), (3, 3)]
    pairs = infotext(image.parameters)
    assert pairs["Denoising strength"] == "0.6" and "Mask blur" not in pairs


def test_img2img_with_a_stochastic_scheduler_equals_the_pipeline(diffusion_service, reference_edits):
    init = random_image(seed=1)
    [image] = generate(
        diffusion_service.address, prompt=PROMPT, init_image=encode(init), strength=0.8, steps=5, seed=3,
        sampler="euler_a",
    ).images  # fmt: skip
    expected = reference_edits.image(
        reference_edits.img2img, prompt=PROMPT, image=init, strength=0.8, num_inference_steps=5, seed=3,
        scheduler=EulerAncestralDiscreteScheduler.from_config,
    )  # fmt: skip
    np.testing.assert_array_equal(pixels(image.png), np.asarray(expected))


def test_img2img_defaults_to_the_pipelines_strength_and_the_images_size(diffusion_service, reference_edits):
    init = random_image(96, 64, seed=2)
    result = generate(diffusion_service.address, prompt=PROMPT, init_image=encode(init), steps=5, seed=4)
    [image] = result.images
    assert (image.width, image.height) == (96, 64)
    expected = reference_edits.image(reference_edits.img2img, prompt=PROMPT, image=init, num_inference_steps=5, seed=4)
    np.testing.assert_array_equal(pixels(image.png), np.asarray(expected))
    assert result.progress[-1].total == 4 and infotext(image.parameters)["Denoising strength"] == "0.8"


@pytest.mark.parametrize(("fmt", "options"), [("JPEG", {"quality": 90}), ("WEBP", {"lossless": True})])
def test_jpeg_and_webp_init_images_are_read_as_pil_reads_them(fmt, options, diffusion_service, reference_edits):
    data = encode(random_image(seed=5), fmt, **options)
    [image] = generate(diffusion_service.address, prompt=PROMPT, init_image=data, strength=0.5, steps=4, seed=6).images
    decoded = Image.open(io.BytesIO(data)).convert("RGB")
    expected = reference_edits.image(
        reference_edits.img2img, prompt=PROMPT, image=decoded, strength=0.5, num_inference_steps=4, seed=6
    )
    np.testing.assert_array_equal(pixels(image.png), np.asarray(expected))


def test_a_differently_sized_request_resizes_the_init_image_first(diffusion_service, reference_edits):
    init = random_image(80, 80, seed=7)
    [image] = generate(
        diffusion_service.address, prompt=PROMPT, init_image=encode(init), width=64, height=96, strength=0.5,
        steps=4, seed=8,
    ).images  # fmt: skip
    assert (image.width, image.height) == (64, 96)
    resized = init.resize((64, 96), Image.LANCZOS)
    expected = reference_edits.image(
        reference_edits.img2img, prompt=PROMPT, image=resized, strength=0.5, num_inference_steps=4, seed=8
    )
    np.testing.assert_array_equal(pixels(image.png), np.asarray(expected))


def test_inpainting_pixels_equal_a_bare_inpaint_pipeline(diffusion_service, reference_edits):
    init, mask = random_image(seed=9), square_mask()
    for strength in (0.75, None):  # None: the inpainting pipeline's own default, 1.0
        fields = {} if strength is None else {"strength": strength}
        result = generate(
            diffusion_service.address, prompt=PROMPT, init_image=encode(init), mask_image=encode(mask), steps=4,
            seed=10, guidance_scale=5.0, **fields,
        )  # fmt: skip
        [image] = result.images
        expected = reference_edits.image(
            reference_edits.inpaint, prompt=PROMPT, image=init, mask_image=mask, num_inference_steps=4,
            guidance_scale=5.0, seed=10, height=64, width=64, **fields,
        )  # fmt: skip
        np.testing.assert_array_equal(pixels(image.png), np.asarray(expected))
        assert result.progress[-1].total == (3 if strength else 4)
        pairs = infotext(image.parameters)
        assert (pairs["Denoising strength"], pairs["Mask blur"]) == (f"{strength or 1:g}", "0")


def test_mask_blur_blurs_the_mask_and_keeps_the_unmasked_pixels(diffusion_service, reference_edits):
    init, mask = random_image(seed=11), square_mask()
    [image] = generate(
        diffusion_service.address, prompt=PROMPT, init_image=encode(init), mask_image=encode(mask), mask_blur=4,
        strength=0.9, steps=4, seed=12,
    ).images  # fmt: skip
    pipe = reference_edits.inpaint
    blurred = pipe.mask_processor.blur(mask, blur_factor=4)
    painted = reference_edits.image(
        pipe, prompt=PROMPT, image=init, mask_image=blurred, strength=0.9, num_inference_steps=4, seed=12,
        height=64, width=64,
    )  # fmt: skip
    expected = np.asarray(pipe.image_processor.apply_overlay(blurred, init, painted))
    got = pixels(image.png)
    np.testing.assert_array_equal(got, expected)
    kept = np.asarray(blurred) == 0
    np.testing.assert_array_equal(got[kept], np.asarray(init)[kept])
    assert infotext(image.parameters)["Mask blur"] == "4"


def test_padding_mask_crop_inpaints_only_the_masked_area_like_the_pipeline(diffusion_service, reference_edits):
    init, mask = random_image(seed=13), square_mask()
    [image] = generate(
        diffusion_service.address, prompt=PROMPT, init_image=encode(init), mask_image=encode(mask),
        padding_mask_crop=8, strength=0.8, steps=5, seed=14,
    ).images  # fmt: skip
    expected = reference_edits.image(
        reference_edits.inpaint, prompt=PROMPT, image=init, mask_image=mask, padding_mask_crop=8, strength=0.8,
        num_inference_steps=5, seed=14, height=64, width=64,
    )  # fmt: skip
    np.testing.assert_array_equal(pixels(image.png), np.asarray(expected))
    pairs = infotext(image.parameters)
    assert (pairs["Inpaint area"], pairs["Masked area padding"]) == ("Only masked", "8")


def test_an_inverted_mask_and_an_alpha_mask_equal_the_pipeline_with_the_mask_they_mean(
    diffusion_service, reference_edits
):
    init, mask = random_image(seed=15), square_mask()
    inverted = ImageOps.invert(mask)
    expected = reference_edits.image(
        reference_edits.inpaint, prompt=PROMPT, image=init, mask_image=inverted, strength=0.8,
        num_inference_steps=5, seed=16, height=64, width=64,
    )  # fmt: skip
    [by_invert] = generate(
        diffusion_service.address, prompt=PROMPT, init_image=encode(init), mask_image=encode(mask), invert_mask=True,
        strength=0.8, steps=5, seed=16,
    ).images  # fmt: skip
    np.testing.assert_array_equal(pixels(by_invert.png), np.asarray(expected))
    assert infotext(by_invert.parameters)["Mask mode"] == "Inpaint not masked"
    # OpenAI's convention: transparent is repainted. The square is opaque here, so the rest is repainted.
    rgba = init.convert("RGBA")
    rgba.putalpha(mask)
    [by_alpha] = generate(
        diffusion_service.address, prompt=PROMPT, init_image=encode(init), mask_image=encode(rgba),
        mask_from_alpha=True, strength=0.8, steps=5, seed=16,
    ).images  # fmt: skip
    np.testing.assert_array_equal(pixels(by_alpha.png), np.asarray(expected))


def test_inpainting_streams_previews_and_stops_within_a_step_of_a_cancel(diffusion_service):
    init, mask = random_image(256, 256, seed=17), square_mask(256, 256)
    request = diffusion_pb2.ImageRequest(
        prompt=PROMPT, init_image=encode(init), mask_image=encode(mask), strength=1.0, steps=150, seed=18,
        preview_every=2,
    )  # fmt: skip
    call = stub(diffusion_service.address).Generate(request, timeout=300)
    progress = [next(call).progress for _ in range(2)]
    # Our generation runs, so the worker has logged every earlier one's end.
    seen = len(cancellations(diffusion_service.process))
    assert [(p.step, p.total, bool(p.preview_png)) for p in progress] == [(1, 150, False), (2, 150, True)]
    call.cancel()
    with pytest.raises(grpc.RpcError) as error:
        next(call)
    assert error.value.code() == grpc.StatusCode.CANCELLED
    cancelled_at, stopped_after, total = next_cancellation(diffusion_service.process, seen)
    assert stopped_after - cancelled_at <= 1 and total == 150
    [image] = generate(diffusion_service.address, prompt=PROMPT, init_image=encode(init), steps=2, seed=1).images
    assert (image.width, image.height) == (256, 256)

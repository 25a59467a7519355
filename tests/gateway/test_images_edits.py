"""POST /v1/images/edits through the official openai client: img2img and inpainting equal bare diffusers."""

from __future__ import annotations

import base64
import io
import time

import httpx2 as httpx
import numpy as np
import openai
import pytest
from PIL import Image

from tests.diffusion.test_img2img import encode, random_image, square_mask
from tests.fixtures.diffusion_models import generation_running

PROMPT = "a watercolor painting of a lighthouse at sunset"
IMAGE = ("x.png", encode(random_image()))
# A mask of the wrong size, with alpha as OpenAI's masks have.
SMALL_MASK = ("m.png", encode(random_image(64, 72).convert("RGBA")))


@pytest.fixture(scope="module")
def client(image_stack):
    with openai.OpenAI(
        base_url=image_stack.http_url + "/v1", api_key=image_stack.api_key, max_retries=0, timeout=300
    ) as c:
        yield c


def decode(item) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(base64.b64decode(item.b64_json))).convert("RGB"))


def test_an_edit_without_a_mask_is_img2img_equal_to_bare_diffusers(client, reference_edits):
    init = random_image(seed=40)
    response = client.images.edit(
        image=("init.png", encode(init), "image/png"), prompt=PROMPT, n=2, response_format="b64_json",
        extra_body={"steps": 5, "seed": 41, "strength": 0.6, "guidance_scale": 6.0},
    )  # fmt: skip
    assert [item.model_extra["seed"] for item in response.data] == [41, 42]
    for item in response.data:
        expected = reference_edits.image(
            reference_edits.img2img, prompt=PROMPT, image=init, strength=0.6, num_inference_steps=5,
            guidance_scale=6.0, seed=item.model_extra["seed"],
        )  # fmt: skip
        np.testing.assert_array_equal(decode(item), np.asarray(expected))
        assert "Denoising strength: 0.6" in item.model_extra["parameters"]


def test_an_edit_with_an_alpha_mask_inpaints_the_transparent_part(client, reference_edits):
    init = random_image(seed=43)
    # OpenAI's mask: an RGBA image whose fully transparent pixels are repainted (here, the middle square).
    rgba = init.convert("RGBA")
    rgba.putalpha(Image.eval(square_mask(), lambda v: 255 - v))
    response = client.images.edit(
        image=("init.png", encode(init), "image/png"), mask=("mask.png", encode(rgba), "image/png"), prompt=PROMPT,
        size="64x64", extra_body={"steps": 4, "seed": 44, "strength": 0.75},
    )  # fmt: skip
    expected = reference_edits.image(
        reference_edits.inpaint, prompt=PROMPT, image=init, mask_image=square_mask(), strength=0.75,
        num_inference_steps=4, seed=44, width=64, height=64,
    )  # fmt: skip
    np.testing.assert_array_equal(decode(response.data[0]), np.asarray(expected))


@pytest.mark.parametrize(
    ("files", "fields", "param", "text"),
    [
        ({"image": ("x.gif", encode(Image.new("RGB", (64, 64)), "GIF"))}, {}, "image", "not a PNG, JPEG or WebP"),
        ({"image": IMAGE}, {"strength": "1.5"}, "strength", "(0, 1]"),
        ({"image": IMAGE, "mask": SMALL_MASK}, {}, "mask", "must be the size of init_image"),
        ({"image": IMAGE, "mask": ("m.png", encode(square_mask()))}, {}, "mask", "has no alpha channel"),
        ({}, {}, "image", "one image file is required"),
        ({"image": IMAGE}, {"steps": "many"}, "steps", "integer"),
        ({"image": IMAGE}, {"colour": "red"}, "colour", "unrecognized"),
        ({"image": IMAGE}, {"sampler": "Euler z"}, "sampler", "unknown scheduler"),
    ],
)
def test_bad_edits_are_400_naming_the_parameter_while_another_request_runs(files, fields, param, text, image_stack):
    with generation_running(image_stack.diffusion.address) as running:
        started = time.monotonic()
        response = httpx.post(
            image_stack.http_url + "/v1/images/edits", headers=image_stack.headers(), files=files,
            data={"prompt": "a cat", "steps": "2", **fields}, timeout=60,
        )  # fmt: skip
        assert time.monotonic() - started < 10  # answered at once, not after the running generation
        assert next(running).WhichOneof("kind") == "progress"
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == param and text in error["message"], error


def test_a_streamed_edit_sends_partial_images_then_the_unstreamed_pixels(client):
    init = random_image(seed=45)
    asked = {"image": ("init.png", encode(init), "image/png"), "prompt": PROMPT}
    extra = {"steps": 4, "seed": 46, "strength": 0.75}
    events = list(client.images.edit(**asked, stream=True, partial_images=2, extra_body=extra))
    # int(4 * 0.75) = 3 steps: previews at steps 1 and 2, a progress event for step 3, then the image.
    kinds = [event.type for event in events]
    assert kinds == ["image_generation.partial_image"] * 2 + [
        "muestra.image_generation.progress",
        "image_generation.completed",
    ], kinds
    [unstreamed] = client.images.edit(**asked, extra_body=extra).data
    np.testing.assert_array_equal(decode(events[-1]), decode(unstreamed))

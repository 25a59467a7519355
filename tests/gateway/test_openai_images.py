"""The OpenAI-compatible HTTP API, images: the official client's images.generate against gateway + diffusion.

Reference: a bare diffusers pipeline on the same folder with the same seed, steps and size.
"""

from __future__ import annotations

import base64
import io

import numpy as np
import openai
import pytest
from PIL import Image

PROMPT = "a watercolor painting of a lighthouse at sunset"


@pytest.fixture(scope="module")
def client(openai_stack):
    with openai_stack.client(max_retries=0, timeout=300) as c:
        yield c


def decode(item) -> Image.Image:
    return Image.open(io.BytesIO(base64.b64decode(item.b64_json)))


def test_images_generate_returns_pngs_of_the_requested_size_equal_to_bare_diffusers(client, openai_stack, reference_sd):
    response = client.images.generate(
        model=openai_stack.image_model, prompt=PROMPT, n=2, size="64x96", response_format="b64_json",
        extra_body={"steps": 3, "seed": 21, "guidance_scale": 5.0, "negative_prompt": "blurry"},
    )  # fmt: skip
    assert len(response.data) == 2
    images = [decode(item) for item in response.data]
    assert all(image.format == "PNG" and image.size == (64, 96) for image in images)
    assert [item.model_extra["seed"] for item in response.data] == [21, 22]
    for seed, image in zip((21, 22), images, strict=True):
        expected = reference_sd.image(
            prompt=PROMPT, seed=seed, steps=3, width=64, height=96, guidance_scale=5.0, negative_prompt="blurry"
        )
        np.testing.assert_array_equal(np.asarray(image.convert("RGB")), expected)


def test_default_size_is_the_model_default(client, openai_stack):
    response = client.images.generate(prompt=PROMPT, extra_body={"steps": 1, "seed": 1})
    assert decode(response.data[0]).size == (64, 64)


@pytest.mark.parametrize(
    ("kwargs", "param"),
    [
        ({"size": "big"}, "size"),
        ({"size": "64x40"}, "size"),
        ({"size": "65x64"}, "size"),
        ({"response_format": "url"}, "response_format"),
        ({"n": 1000}, "n"),
        ({"extra_body": {"sampler": "no_such_scheduler"}}, "sampler"),
        ({"extra_body": {"steps": 0}}, "steps"),
    ],
)
def test_bad_image_parameters_are_400_naming_the_param(client, kwargs, param):
    with pytest.raises(openai.BadRequestError) as error:
        client.images.generate(prompt=PROMPT, **{"extra_body": {"steps": 1}, **kwargs})
    assert error.value.param == param, error.value.message


def test_a_size_error_names_the_dimension(client):
    with pytest.raises(openai.BadRequestError) as error:
        client.images.generate(prompt=PROMPT, size="64x40", extra_body={"steps": 1})
    assert error.value.body["message"].startswith("size (height): must be between")


def test_an_unknown_image_model_is_404(client):
    with pytest.raises(openai.NotFoundError) as error:
        client.images.generate(model="dall-e-9", prompt=PROMPT)
    assert error.value.param == "model"

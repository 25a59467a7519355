"""A1111's Extras upscalers that need no model, its no-op refreshes, /interrogate's 501 and its sampler names in
the infotext, through webuiapi (0.9.17) and a real gateway + diffusion service. Pixels are checked against
Pillow's own resize with the filter A1111 names."""

from __future__ import annotations

import base64
import io
import json

import httpx2 as httpx
import numpy as np
import pytest
import webuiapi
from PIL import Image, PngImagePlugin

from tests.diffusion.test_img2img import random_image
from tests.gateway.test_a1111_webuiapi import client

LANCZOS, NEAREST = Image.Resampling.LANCZOS, Image.Resampling.NEAREST


@pytest.fixture(scope="module")
def webui(image_stack) -> webuiapi.WebUIApi:
    return client(image_stack.http_url, image_stack.api_key)


@pytest.fixture(scope="module")
def api(image_stack):
    with httpx.Client(base_url=image_stack.http_url, headers=image_stack.headers(), timeout=300) as http:
        yield http


def pixels(image: Image.Image) -> np.ndarray:
    return np.asarray(image.convert("RGB"))


def b64png(image: Image.Image, parameters: str | None = None) -> str:
    chunks = PngImagePlugin.PngInfo()
    if parameters is not None:
        chunks.add_text("parameters", parameters)
    buffer = io.BytesIO()
    image.save(buffer, format="PNG", pnginfo=chunks)
    return base64.b64encode(buffer.getvalue()).decode()


def test_upscalers_lists_exactly_the_three_served(webui):
    assert [u["name"] for u in webui.get_upscalers()] == ["None", "Lanczos", "Nearest"]
    assert all(set(u) == {"name", "model_name", "model_path", "model_url", "scale"} for u in webui.get_upscalers())


def test_extra_single_image_by_a_factor_equals_pillows_lanczos_resize(webui):
    image = random_image(seed=60)
    result = webui.extra_single_image(image, upscaler_1=webuiapi.Upscaler.Lanczos, upscaling_resize=2)
    assert result.image.size == (128, 128)
    np.testing.assert_array_equal(pixels(result.image), pixels(image.resize((128, 128), LANCZOS)))
    assert result.info == "<p>Postprocess upscale by: 2.0, Postprocess upscaler: Lanczos</p>"
    assert result.image.info["postprocessing"] == "Postprocess upscale by: 2.0, Postprocess upscaler: Lanczos"


def test_extra_single_image_to_a_size_upscales_by_the_larger_ratio_and_crops_the_middle(webui):
    image = random_image(seed=61)
    result = webui.extra_single_image(
        image, resize_mode=1, upscaling_resize_w=96, upscaling_resize_h=64, upscaler_1=webuiapi.Upscaler.Nearest
    )
    expected = image.resize((96, 96), NEAREST).crop((0, 16, 96, 80))
    np.testing.assert_array_equal(pixels(result.image), pixels(expected))
    assert result.info == (
        "<p>Postprocess upscale to: 96x64, Postprocess crop to: 96x64, Postprocess upscaler: Nearest</p>"
    )
    uncropped = webui.extra_single_image(
        image, resize_mode=1, upscaling_resize_w=96, upscaling_resize_h=64, upscaling_crop=False, upscaler_1="Nearest"
    )
    np.testing.assert_array_equal(pixels(uncropped.image), pixels(image.resize((96, 96), NEAREST)))


def test_a_side_off_a_multiple_of_8_is_resized_again_with_lanczos_as_a1111s_upscaler_does(webui):
    image = random_image(60, 60, seed=62)
    result = webui.extra_single_image(image, upscaler_1="Nearest", upscaling_resize=1.5)
    expected = image.resize((90, 90), NEAREST).resize((88, 88), LANCZOS)
    np.testing.assert_array_equal(pixels(result.image), pixels(expected))


def test_extra_batch_images_blends_the_second_upscaler_by_its_visibility(webui):
    images = [random_image(seed=63), random_image(48, 32, seed=64)]
    result = webui.extra_batch_images(
        images, upscaler_1="Lanczos", upscaler_2="Nearest", extras_upscaler_2_visibility=0.25, upscaling_resize=3
    )
    assert len(result.images) == 2
    for image, upscaled in zip(images, result.images, strict=True):
        size = (image.width * 3, image.height * 3)
        expected = Image.blend(image.resize(size, LANCZOS), image.resize(size, NEAREST), 0.25)
        np.testing.assert_array_equal(pixels(upscaled), pixels(expected))
    assert result.info == (
        "<p>Postprocess upscale by: 3.0, Postprocess upscaler: Lanczos, Postprocess upscaler 2: Nearest</p>"
    )


def test_upscaler_none_keeps_the_image_and_its_infotext(webui, api):
    text = "a cat\nSteps: 2, Sampler: Euler a, CFG scale: 7, Seed: 1, Size: 64x64, Model: tiny-sd"
    image = random_image(seed=65)
    body = {"image": b64png(image, text)}
    answer = api.post("/sdapi/v1/extra-single-image", json=body).json()
    assert answer["html_info"] == "<p></p>"
    out = Image.open(io.BytesIO(base64.b64decode(answer["image"])))
    np.testing.assert_array_equal(pixels(out), pixels(image))
    info = webui.png_info(out)
    assert info.info == text and info.json["items"] == {"postprocessing": ""}


@pytest.mark.parametrize(
    ("fields", "status", "detail"),
    [
        ({"upscaler_1": "R-ESRGAN 4x+"}, 400, "upscaler_1: 'R-ESRGAN 4x+' needs a model muestra does not have;"),
        ({"upscaler_1": "Lanczos", "upscaler_2": "SwinIR 4x"}, 400, "upscaler_2: 'SwinIR 4x' needs a model"),
        ({"gfpgan_visibility": 0.5}, 400, "gfpgan_visibility: muestra has no face restoration; leave it at 0"),
        ({"codeformer_visibility": 1}, 400, "codeformer_visibility: muestra has no face restoration"),
        (
            {"upscaler_1": "Lanczos", "resize_mode": 1, "upscaling_resize_w": 100_000, "upscaling_resize_h": 8},
            400,
            "upscaling_resize_w, upscaling_resize_h: 64x64 scaled by 1562.5 is 100000x100000 pixels; the limit is",
        ),
        ({"upscaler_1": "Lanczos", "upscaling_resize": 9}, 422, None),
        ({"image": "not base64!"}, 400, "image: not valid base64 image data"),
    ],
)
def test_what_extras_cannot_do_is_refused_naming_the_field(api, fields, status, detail):
    body = {"image": b64png(random_image(seed=66)), **fields}
    response = api.post("/sdapi/v1/extra-single-image", json=body)
    assert response.status_code == status, response.text
    if detail is not None:
        assert response.json()["detail"].startswith(detail)


def test_a_batch_names_the_image_it_cannot_read(api):
    body = {"imageList": [{"data": b64png(random_image()), "name": "a"}, {"data": "R0lGODlh", "name": "b"}]}
    response = api.post("/sdapi/v1/extra-batch-images", json={**body, "upscaler_1": "Lanczos"})
    assert response.status_code == 400
    assert response.json() == {"detail": "imageList[1].data: not a PNG, JPEG or WebP image"}


def test_interrogate_is_501_as_no_captioning_model_is_installed(webui):
    with pytest.raises(RuntimeError) as raised:
        webui.interrogate(random_image())
    status, text = raised.value.args
    assert status == 501
    assert json.loads(text) == {"detail": "interrogate: no captioning model is installed (asked for 'clip')"}


def test_refreshes_and_checkpoint_reloads_answer_null_as_a1111_does(webui, api):
    assert webui.refresh_checkpoints() is None
    for path in ("refresh-loras", "refresh-vae", "refresh-embeddings", "reload-checkpoint", "unload-checkpoint"):
        response = api.post(f"/sdapi/v1/{path}")
        assert (response.status_code, response.json()) == (200, None), path
        assert api.get(f"/sdapi/v1/{path}").status_code == 405


@pytest.mark.parametrize(
    ("fields", "a1111_name"),
    [({"sampler_name": "euler"}, "Euler"), ({"sampler_name": "DPM++ 2M", "scheduler": "Karras"}, "DPM++ 2M Karras")],
)
def test_the_infotext_names_the_sampler_as_a1111_and_png_info_reads_it_back(webui, fields, a1111_name):
    result = webui.txt2img(prompt="a nine", seed=7, steps=2, width=64, height=64, **fields)
    text = result.info["infotexts"][0]
    assert f", Sampler: {a1111_name}, " in text
    info = webui.png_info(result.image)
    assert info.info == text and info.parameters["Sampler"] == a1111_name


def test_png_info_reads_muestras_own_scheduler_names_as_a1111s(api):
    text = "a nine\nSteps: 2, Sampler: euler_a, CFG scale: 7, Seed: 1, Size: 64x64, Model: tiny-sd"
    answer = api.post("/sdapi/v1/png-info", json={"image": b64png(random_image(), text)}).json()
    assert answer["info"] == text and answer["parameters"]["Sampler"] == "Euler a"

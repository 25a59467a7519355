"""webuiapi, the most used AUTOMATIC1111 client on PyPI, against the gateway: its defaults, and every getter it has."""

from __future__ import annotations

import inspect
import json
from pathlib import Path

import numpy as np
import pytest
import webuiapi
from PIL import Image

from tests.diffusion.test_img2img import random_image
from tests.fixtures.diffusion_models import start_diffusion_service
from tests.harness import ServiceProcess, free_port

PROMPT = "a handwritten nine"
DEFAULT_MODEL = Path(__file__).resolve().parents[2] / "models" / "muestra-image"

# What each webuiapi getter returns from A1111 (modules/api/models.py): a type, and the keys of a list's items
# (checked where muestra has some) or of a dict. The test fails when webuiapi gains a getter not listed here.
GETTERS = {
    "get_options": (dict, {"sd_model_checkpoint"}),
    "get_cmd_flags": (dict, set()),
    "get_progress": (dict, {"progress", "eta_relative", "state", "current_image", "textinfo"}),
    "get_samplers": (list, {"name", "aliases", "options"}),
    "get_schedulers": (list, {"name", "label", "aliases", "default_rho", "need_inner_model"}),
    "get_sd_models": (list, {"title", "model_name", "hash", "sha256", "filename", "config"}),
    "get_loras": (list, {"name", "alias", "path", "metadata"}),
    "get_sd_vae": (list, set()),
    "get_upscalers": (list, {"name", "model_name", "model_path", "model_url", "scale"}),
    "get_latent_upscale_modes": (list, set()),
    "get_hypernetworks": (list, set()),
    "get_face_restorers": (list, set()),
    "get_realesrgan_models": (list, set()),
    "get_prompt_styles": (list, set()),
    "get_artist_categories": (list, set()),
    "get_artists": (list, set()),
    "get_scripts": (dict, {"txt2img", "img2img"}),
    "get_embeddings": (dict, {"loaded", "skipped"}),
    "get_memory": (dict, {"ram", "cuda"}),
    "util_get_model_names": (list, set()),
    "util_get_sampler_names": (list, set()),
    "util_get_scheduler_names": (list, set()),
    "util_get_current_model": (str, set()),
}


def client(http_url: str, api_key: str) -> webuiapi.WebUIApi:
    api = webuiapi.WebUIApi(baseurl=f"{http_url}/sdapi/v1")
    api.session.headers["Authorization"] = f"Bearer {api_key}"
    api.check_extensions()  # what its constructor did before it had the key: asks /scripts
    return api


@pytest.fixture(scope="module")
def webui(image_stack) -> webuiapi.WebUIApi:
    return client(image_stack.http_url, image_stack.api_key)


def test_txt2img_with_the_clients_512_square_is_the_models_64_square_resized_with_lanczos(webui):
    result = webui.txt2img(prompt=PROMPT, seed=5)
    assert result.image.size == (512, 512)
    text = result.info["infotexts"][0]
    assert "Size: 64x64" in text and text.endswith("Postprocess upscale to: 512x512, Postprocess upscaler: Lanczos")
    assert result.info["extra_generation_params"] == {
        "Postprocess upscale to": "512x512",
        "Postprocess upscaler": "Lanczos",
    }
    assert (result.info["width"], result.info["height"], result.info["steps"]) == (512, 512, 20)
    used = {key: result.parameters[key] for key in ("seed", "sampler_name", "steps", "cfg_scale", "width", "height")}
    assert used == {"seed": 5, "sampler_name": "Euler a", "steps": 20, "cfg_scale": 7.0, "width": 512, "height": 512}
    native = webui.txt2img(prompt=PROMPT, seed=5, width=64, height=64)
    assert native.image.size == (64, 64) and native.info["extra_generation_params"] == {}
    expected = native.image.convert("RGB").resize((512, 512), Image.Resampling.LANCZOS)
    np.testing.assert_array_equal(np.asarray(result.image.convert("RGB")), np.asarray(expected))
    assert webui.png_info(result.image).info == text


def test_another_ratio_keeps_it_at_the_models_size_on_the_shorter_side(webui):
    result = webui.txt2img(prompt=PROMPT, seed=1, steps=2, width=512, height=768)
    assert result.image.size == (512, 768)
    assert "Size: 64x96" in result.info["infotexts"][0]


def test_img2img_with_the_clients_defaults_returns_the_asked_size(webui):
    result = webui.img2img(images=[random_image(seed=7)], prompt=PROMPT)
    assert result.image.size == (512, 512)
    text = result.info["infotexts"][0]
    assert "Size: 64x64" in text and "Denoising strength: 0.75" in text and "Postprocess upscale to: 512x512" in text
    assert (result.parameters["steps"], result.parameters["cfg_scale"]) == (20, 7.0)


def test_png_info_reads_the_parameters_chunk_as_a1111_parses_it(webui):
    result = webui.txt2img(prompt=PROMPT, negative_prompt="blurry", seed=3, steps=2, width=64, height=64)
    info = webui.png_info(result.image)
    assert info.info == result.info["infotexts"][0]
    parsed = info.parameters
    assert (parsed["Prompt"], parsed["Negative prompt"]) == (PROMPT, "blurry")
    assert (parsed["Steps"], parsed["Seed"]) == ("2", "3")
    assert (parsed["Size-1"], parsed["Size-2"], parsed["Sampler"]) == ("64", "64", "Euler a")
    assert info.images == [] and info.json["items"] == {}


def test_every_getter_returns_data_of_a1111s_shape(webui):
    getters = {
        name for name, _ in inspect.getmembers(webuiapi.WebUIApi, inspect.isfunction)
        if name.startswith(("get_", "util_get_")) and name != "get_endpoint"
    }  # fmt: skip
    assert getters == set(GETTERS), "webuiapi's getters changed: list the new ones in GETTERS"
    for name, (kind, keys) in GETTERS.items():
        value = getattr(webui, name)()
        assert isinstance(value, kind), (name, value)
        assert "detail" not in value and "error" not in value, (name, value)
        for item in value if kind is list and keys else [value] if kind is dict else []:
            assert keys <= set(item), (name, item)
    assert webui.util_get_current_model() == "tiny-sd" and webui.util_get_model_names() == ["tiny-sd"]
    assert "Euler a" in webui.util_get_sampler_names()
    assert webui.util_get_scheduler_names() == ["automatic", "karras"]
    assert webui.get_scripts() == {"txt2img": [], "img2img": []} and webui.get_embeddings()["loaded"] == {}
    ram = webui.get_memory()["ram"]
    assert 0 < ram["used"] < ram["total"] and ram["free"] == ram["total"] - ram["used"]


def test_the_other_calls_answer_as_a1111_does(webui):
    assert webui.skip() is None
    assert webui.interrupt() == {}
    assert webui.refresh_checkpoints() is None
    assert webui.set_options({"sd_model_checkpoint": "tiny-sd"}) is None
    webui.util_set_model("tiny-sd")
    webui.util_wait_for_ready(check_interval=0.1)


def test_an_unknown_route_is_a1111s_404_and_webuiapi_raises_on_it(webui):
    with pytest.raises(RuntimeError) as raised:
        webui.custom_post("sdapi/v1/create/embedding", {"name": "ink"})
    status, text = raised.value.args
    assert status == 404 and json.loads(text) == {"detail": "Not Found"}


def _trained_model_present() -> bool:
    index = DEFAULT_MODEL / "model_index.json"
    return index.is_file() and not json.loads(index.read_text()).get("_muestra_placeholder", False)


@pytest.mark.skipif(not _trained_model_present(), reason="models/muestra-image is not the trained model")
def test_the_default_32x32_digits_model_draws_the_nine_webuiapi_asks_for(tmp_path_factory):
    from sklearn.datasets import load_digits
    from sklearn.svm import SVC

    log_dir = tmp_path_factory.mktemp("webuiapi-default-model")
    diffusion = start_diffusion_service(DEFAULT_MODEL, log_dir)
    http_port = free_port()
    gateway = ServiceProcess(
        "gateway",
        ["--diffusion-addr", diffusion.address, "--http-port", str(http_port), "--api-keys", "sk-webuiapi"],
        log_dir,
    )
    try:
        webui = client(f"http://127.0.0.1:{http_port}", "sk-webuiapi")
        drawn = webui.txt2img(prompt=PROMPT, seed=9)
        edited = webui.img2img(images=[drawn.image], prompt="a handwritten eight", seed=9)
    finally:
        gateway.stop()
        diffusion.process.stop()
    assert drawn.image.size == edited.image.size == (512, 512)
    assert "Size: 32x32" in drawn.info["infotexts"][0] and "Size: 32x32" in edited.info["infotexts"][0]
    digits = load_digits()
    classifier = SVC(gamma=0.001).fit(digits.data, digits.target)
    grey = np.asarray(drawn.image.convert("L").resize((8, 8), Image.Resampling.BOX), dtype=np.float32) / 255 * 16
    assert classifier.predict(grey.reshape(1, 64))[0] == 9

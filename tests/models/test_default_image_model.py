"""The image model that ships in models/muestra-image: a small SD 1.x folder the diffusion service serves as is."""

from __future__ import annotations

import io
import json
from pathlib import Path

import grpc
import numpy as np
import pytest
import torch
from PIL import Image

from tests.diffusion.client import generate, pixels, rpc_error
from tests.fixtures.diffusion_models import TORCH_THREADS, start_diffusion_service, torch_threads

MODEL = Path(__file__).resolve().parents[2] / "models" / "muestra-image"
WORDS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")
MAX_BYTES = 15 * 1024 * 1024


def _trained_model_present() -> bool:
    """The trained model's folder (the placeholder random pipeline marks its model_index.json)."""
    index = MODEL / "model_index.json"
    return index.is_file() and not json.loads(index.read_text()).get("_muestra_placeholder", False)


pytestmark = pytest.mark.skipif(
    not _trained_model_present(), reason="models/muestra-image is not the trained model (make models-image)"
)


@pytest.fixture(scope="module")
def default_image_service(tmp_path_factory):
    service = start_diffusion_service(MODEL, tmp_path_factory.mktemp("default-image-logs"))
    yield service
    service.process.stop()


@pytest.fixture(scope="module")
def bare_pipeline():
    """The folder loaded by diffusers alone, as anyone would load a Stable Diffusion folder."""
    from diffusers import StableDiffusionPipeline

    pipe = StableDiffusionPipeline.from_pretrained(
        MODEL, local_files_only=True, safety_checker=None, requires_safety_checker=False
    )
    pipe.set_progress_bar_config(disable=True)
    return pipe


def test_folder_is_a_small_stable_diffusion_1_pipeline_with_a_local_clip_tokenizer():
    from transformers import CLIPTokenizer

    index = json.loads((MODEL / "model_index.json").read_text())
    assert index["_class_name"] == "StableDiffusionPipeline"
    assert index["unet"] == ["diffusers", "UNet2DConditionModel"]
    assert index["vae"] == ["diffusers", "AutoencoderKL"]
    assert index["text_encoder"] == ["transformers", "CLIPTextModel"]
    assert index["safety_checker"] == [None, None] and index["requires_safety_checker"] is False
    tokenizer = CLIPTokenizer(
        vocab=str(MODEL / "tokenizer" / "vocab.json"), merges=str(MODEL / "tokenizer" / "merges.txt")
    )
    assert tokenizer.tokenize("a handwritten seven") == ["a</w>", "handwritten</w>", "seven</w>"]
    size = sum(f.stat().st_size for f in MODEL.rglob("*") if f.is_file())
    assert size <= MAX_BYTES, f"{size} bytes"


def test_service_default_png_equals_a_bare_pipeline_call_with_the_same_seed(default_image_service, bare_pipeline):
    # No size, steps, guidance or sampler: the service's defaults for this folder, as the CLI's `muestra image` asks.
    [image] = generate(default_image_service.address, prompt="a handwritten seven", seed=2024).images
    assert image.png[:8] == b"\x89PNG\r\n\x1a\n"
    decoded = Image.open(io.BytesIO(image.png))
    decoded.verify()
    default_size = bare_pipeline.unet.config.sample_size * bare_pipeline.vae_scale_factor
    assert default_size == 32
    assert (image.width, image.height) == (default_size, default_size)
    assert Image.open(io.BytesIO(image.png)).size == (default_size, default_size)
    with torch_threads(TORCH_THREADS):
        expected = bare_pipeline(
            "a handwritten seven", generator=torch.Generator("cpu").manual_seed(2024), output_type="np"
        ).images[0]
    np.testing.assert_array_equal(pixels(image.png), (expected * 255).round().astype(np.uint8))


def test_service_draws_the_digit_each_prompt_names(default_image_service):
    """One image per digit, labelled by a classifier trained on the real 8x8 digits (the full bar is in bench/)."""
    from sklearn.datasets import load_digits
    from sklearn.svm import SVC

    digits = load_digits()
    classifier = SVC(gamma=0.001).fit(digits.data, digits.target)
    labels = []
    for digit, word in enumerate(WORDS):
        [image] = generate(default_image_service.address, prompt=f"a handwritten {word}", seed=digit).images
        grey = torch.from_numpy(pixels(image.png).astype(np.float32) / 255).mean(-1)[None, None]
        small = torch.nn.functional.interpolate(grey, size=(8, 8), mode="area").reshape(1, 64) * 16
        labels.append(int(classifier.predict(small.numpy())[0]))
    assert sum(label == digit for digit, label in enumerate(labels)) >= 8, labels


def test_left_to_choose_the_service_runs_the_small_model_on_one_thread_and_serves_its_size_when_asked(
    default_image_service, tmp_path
):
    """Without --torch-threads the service picks one thread for this 1.5M-parameter UNet; an explicit 32x32
    (the model's own size, under the default --min-size of 64) is served and equals the default size."""
    service = start_diffusion_service(MODEL, tmp_path, threads=None)
    try:
        asked = generate(service.address, prompt="a handwritten two", seed=11, steps=6, width=32, height=32).images
        default = generate(default_image_service.address, prompt="a handwritten two", seed=11, steps=6).images
        assert (asked[0].width, asked[0].height) == (32, 32)
        assert np.array_equal(pixels(asked[0].png), pixels(default[0].png))
        assert "torch threads: 1 (a UNet of 1.5M parameters" in service.process.log_path.read_text()
        error = rpc_error(service.address, prompt="a handwritten two", width=24, height=32)
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "width" in error.details() and "32" in error.details()
    finally:
        service.process.stop()

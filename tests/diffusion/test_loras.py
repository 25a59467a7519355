"""LoRA adapters from --lora-dir equal bare diffusers' load_lora_weights + set_adapters, and leave no trace."""

from __future__ import annotations

import time

import grpc
import numpy as np
import pytest
import torch

from muestra.v1 import diffusion_pb2
from tests.diffusion.client import generate, pixels, rpc_error, stub
from tests.fixtures.diffusion_models import (
    TORCH_THREADS,
    ReferencePipeline,
    build_random_lora,
    start_diffusion_service,
    torch_threads,
)

PROMPT = "a photo of a cat sitting on a red chair"
CALL = {"steps": 3, "width": 64, "height": 64, "guidance_scale": 7.5}


@pytest.fixture(scope="module")
def lora_dir(tiny_sd_model, tmp_path_factory):
    folder = tmp_path_factory.mktemp("loras")
    build_random_lora(folder, tiny_sd_model, "ink", seed=1, kohya_copy=True)
    build_random_lora(folder, tiny_sd_model, "paper", seed=2)
    return folder


@pytest.fixture(scope="module")
def lora_service(tiny_sd_model, lora_dir, redis_server, tmp_path_factory):
    # Two adapters stay loaded; a third evicts the least recently used. The text-embedding cache is on: the
    # adapters change the text encoder, so requests with them must not read the base model's embeddings.
    service = start_diffusion_service(
        tiny_sd_model, tmp_path_factory.mktemp("logs"), "--lora-dir", str(lora_dir), "--lora-cache-size", "2",
        "--max-loras", "2", "--redis-url", redis_server.url,
    )  # fmt: skip
    yield service
    service.process.stop()


@pytest.fixture(scope="module")
def reference_lora(tiny_sd_model, lora_dir):
    """A bare pipeline with every adapter loaded under its file name."""
    reference = ReferencePipeline(tiny_sd_model)
    for name in ("ink", "ink_kohya", "paper"):
        reference.pipe.load_lora_weights(str(lora_dir / f"{name}.safetensors"), adapter_name=name)
    return reference


def expected(reference: ReferencePipeline, adapters: dict[str, float], seed: int, prompt: str = PROMPT) -> np.ndarray:
    reference.pipe.enable_lora()
    reference.pipe.set_adapters(list(adapters), list(adapters.values()))
    return reference.image(prompt=prompt, seed=seed, **CALL)


def loras(**weights: float) -> list[diffusion_pb2.LoraWeight]:
    return [diffusion_pb2.LoraWeight(name=name, weight=weight) for name, weight in weights.items()]


def test_the_folder_is_listed_with_the_limit(lora_service, lora_dir):
    listing = stub(lora_service.address).ListLoras(diffusion_pb2.ListLorasRequest(), timeout=10)
    assert [(lora.name, lora.file) for lora in listing.loras] == [
        ("ink", "ink.safetensors"), ("ink_kohya", "ink_kohya.safetensors"), ("paper", "paper.safetensors"),
    ]  # fmt: skip
    assert listing.loras[0].size_bytes == (lora_dir / "ink.safetensors").stat().st_size
    info = stub(lora_service.address).Describe(diffusion_pb2.DescribeDiffusionRequest(), timeout=10)
    assert info.max_loras == 2


def test_an_adapter_at_a_weight_equals_bare_diffusers_and_a_request_without_one_equals_the_base(
    lora_service, reference_lora, reference_sd
):
    generate(lora_service.address, prompt=PROMPT, seed=1, steps=1)  # the base prompt's embeddings are now cached
    [with_lora] = generate(lora_service.address, prompt=PROMPT, seed=5, loras=loras(ink=0.8), **CALL).images
    np.testing.assert_array_equal(pixels(with_lora.png), expected(reference_lora, {"ink": 0.8}, seed=5))
    [without] = generate(lora_service.address, prompt=PROMPT, seed=5, **CALL).images
    base = reference_sd.image(prompt=PROMPT, seed=5, **CALL)
    np.testing.assert_array_equal(pixels(without.png), base)
    assert not np.array_equal(pixels(with_lora.png), base)


def test_the_kohya_file_equals_bare_diffusers_and_the_same_weights_in_diffusers_layout(lora_service, reference_lora):
    [kohya] = generate(lora_service.address, prompt=PROMPT, seed=6, loras=loras(ink_kohya=1.0), **CALL).images
    np.testing.assert_array_equal(pixels(kohya.png), expected(reference_lora, {"ink_kohya": 1.0}, seed=6))
    [same] = generate(lora_service.address, prompt=PROMPT, seed=6, loras=loras(ink=1.0), **CALL).images
    np.testing.assert_array_equal(pixels(kohya.png), pixels(same.png))


def test_two_adapters_one_from_the_prompt_syntax_equal_bare_diffusers(lora_service, reference_lora):
    prompt = f"{PROMPT} <lora:paper:0.7>"
    [image] = generate(lora_service.address, prompt=prompt, seed=7, loras=loras(ink=0.5), **CALL).images
    # The tag leaves the prompt the text encoder sees; the PNG's prompt carries both, as A1111 writes them.
    np.testing.assert_array_equal(pixels(image.png), expected(reference_lora, {"ink": 0.5, "paper": 0.7}, seed=7))
    assert image.parameters.splitlines()[0] == f"{PROMPT} <lora:ink:0.5><lora:paper:0.7>"
    [tag_only] = generate(lora_service.address, prompt="<lora:paper>" + PROMPT, seed=7, **CALL).images
    np.testing.assert_array_equal(pixels(tag_only.png), expected(reference_lora, {"paper": 1.0}, seed=7))


def test_switching_past_the_cache_size_evicts_and_reloads_with_the_same_pixels(
    lora_service, reference_lora, reference_sd
):
    for name in ("ink", "paper", "ink_kohya", "ink", "paper"):
        [image] = generate(lora_service.address, prompt=PROMPT, seed=8, loras=loras(**{name: 0.9}), **CALL).images
        np.testing.assert_array_equal(pixels(image.png), expected(reference_lora, {name: 0.9}, seed=8))
    [base] = generate(lora_service.address, prompt=PROMPT, seed=8, **CALL).images
    np.testing.assert_array_equal(pixels(base.png), reference_sd.image(prompt=PROMPT, seed=8, **CALL))


@pytest.fixture(scope="module")
def busy(lora_service):
    call = stub(lora_service.address).Generate(
        diffusion_pb2.ImageRequest(prompt="a long run", steps=150, seed=1, width=256, height=256), timeout=600
    )
    assert next(call).progress.step == 1
    yield call
    call.cancel()


@pytest.mark.parametrize(
    ("fields", "field", "message"),
    [
        ({"loras": loras(nope=1.0)}, "loras[0].name", "unknown LoRA 'nope'; known: ink, ink_kohya, paper"),
        ({"prompt": "a cat <lora:nope:0.5>"}, "prompt", "unknown LoRA 'nope'; known: ink, ink_kohya, paper"),
        ({"loras": loras(ink=1.0, paper=1.0, ink_kohya=1.0)}, "loras", "3 LoRA adapters asked for; the limit is 2"),
        ({"loras": loras(ink=1.0), "prompt": "<lora:ink:0.5>"}, "prompt", "LoRA 'ink' is named twice"),
        ({"loras": loras(ink=float("nan"))}, "loras[0].weight", "must be a finite number"),
        ({"loras": loras(ink=11.0)}, "loras[0].weight", "between -10.0 and 10.0"),
        ({"prompt": "a cat <lora:ink:heavy>"}, "prompt", "<lora:ink:heavy>: the weight must be a number"),
    ],
)
def test_bad_adapters_are_invalid_argument_while_another_request_runs(fields, field, message, lora_service, busy):
    started = time.monotonic()
    error = rpc_error(lora_service.address, **{"prompt": "a cat", "steps": 2, **fields})
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error.details().startswith(f"{field}: ") and message in error.details(), error.details()
    assert time.monotonic() - started < 10
    assert next(busy).WhichOneof("kind") == "progress"


def test_a_service_without_a_lora_dir_says_so(diffusion_service):
    error = rpc_error(diffusion_service.address, prompt="a cat", steps=2, loras=loras(ink=1.0))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error.details() == "loras: 1 LoRA adapters asked for; this service has no --lora-dir"


def test_an_adapter_applies_to_img2img_too(lora_service, reference_lora):
    from diffusers import StableDiffusionImg2ImgPipeline

    from tests.diffusion.test_img2img import encode, random_image

    init = random_image(seed=9)
    [image] = generate(
        lora_service.address, prompt=PROMPT, init_image=encode(init), strength=0.7, steps=4, seed=9,
        loras=loras(paper=0.6),
    ).images  # fmt: skip
    components = {k: v for k, v in reference_lora.pipe.components.items() if k != "image_encoder"}
    img2img = StableDiffusionImg2ImgPipeline(**components)  # the same modules, adapters loaded
    img2img.set_progress_bar_config(disable=True)
    img2img.enable_lora()
    img2img.set_adapters(["paper"], [0.6])
    with torch_threads(TORCH_THREADS):
        expected = img2img(
            prompt=PROMPT, image=init, strength=0.7, num_inference_steps=4,
            generator=torch.Generator("cpu").manual_seed(9),
        ).images[0]  # fmt: skip
    np.testing.assert_array_equal(pixels(image.png), np.asarray(expected))


def test_a_corrupt_file_is_failed_precondition_and_leaves_the_model_as_it_was(
    lora_service, lora_dir, reference_lora, reference_sd
):
    broken = lora_dir / "broken.safetensors"
    broken.write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{nonsense")
    try:
        error = rpc_error(lora_service.address, prompt=PROMPT, seed=10, loras=loras(broken=1.0), **CALL)
    finally:
        broken.unlink()
    assert error.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert error.details().startswith("LoRA 'broken' cannot be loaded into this model: ")
    [base] = generate(lora_service.address, prompt=PROMPT, seed=10, **CALL).images
    np.testing.assert_array_equal(pixels(base.png), reference_sd.image(prompt=PROMPT, seed=10, **CALL))
    [ink] = generate(lora_service.address, prompt=PROMPT, seed=10, loras=loras(ink=0.8), **CALL).images
    np.testing.assert_array_equal(pixels(ink.png), expected(reference_lora, {"ink": 0.8}, seed=10))


def test_switching_between_loaded_adapters_loads_nothing(lora_service):
    def loads() -> int:
        return lora_service.process.log_path.read_text().count("loaded LoRA ")

    for name in ("ink", "paper"):  # both loaded now (the cache holds two)
        generate(lora_service.address, prompt=PROMPT, seed=11, steps=1, loras=loras(**{name: 1.0}))
    before = loads()
    assert before >= 2  # the service logs each load
    for name in ("ink", "paper", "ink", "paper"):
        generate(lora_service.address, prompt=PROMPT, seed=11, steps=1, loras=loras(**{name: 0.5}))
    generate(lora_service.address, prompt=PROMPT, seed=11, steps=1, loras=loras(ink=0.5, paper=0.5))
    assert loads() == before

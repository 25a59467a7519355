"""Every field a client controls is checked; bad input is INVALID_ARGUMENT naming the field and its limit."""

from __future__ import annotations

import grpc
import pytest

from muestra.v1 import diffusion_pb2, diffusion_pb2_grpc
from tests.diffusion.client import generate, rpc_error


@pytest.mark.parametrize(
    ("fields", "field", "limit"),
    [
        ({"width": 33}, "width", "multiple of 8"),
        ({"height": 100}, "height", "multiple of 8"),
        ({"width": 4096}, "width", "between 64 and 256, got 4096: at most 4x the 64x64"),  # not 2048: the trained size
        ({"height": 56}, "height", "between 64 and 256, got 56"),
        ({"steps": 10_000}, "steps", "between 1 and 150"),
        ({"num_images": 100}, "num_images", "between 1 and 8"),
        ({"guidance_scale": float("nan")}, "guidance_scale", "finite number between 0 and 50"),
        ({"guidance_scale": float("inf")}, "guidance_scale", "finite number between 0 and 50"),
        ({"guidance_scale": 51.0}, "guidance_scale", "between 0 and 50"),
        ({"guidance_scale": -1.0}, "guidance_scale", "between 0 and 50"),
        ({"prompt": "x" * 4097}, "prompt", "limit is 4096 bytes"),
        ({"negative_prompt": "é" * 2049}, "negative_prompt", "limit is 4096 bytes"),
        ({"seed": 2**64 - 1, "num_images": 2}, "seed", "between 0 and 18446744073709551614"),
    ],
)
def test_bad_input_is_invalid_argument_naming_the_field_and_limit(fields, field, limit, diffusion_service):
    error = rpc_error(diffusion_service.address, **{"prompt": "a cat", "steps": 2, **fields})
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error.details().startswith(f"{field}: ")
    assert limit in error.details()


def test_an_unknown_model_is_not_found(diffusion_service):
    error = rpc_error(diffusion_service.address, model="sdxl-turbo", prompt="a cat", steps=2)
    assert error.code() == grpc.StatusCode.NOT_FOUND


def test_the_largest_seed_and_the_limits_themselves_are_accepted(diffusion_service):
    result = generate(diffusion_service.address, prompt="x" * 4096, steps=1, seed=2**64 - 1, guidance_scale=50.0)
    assert [image.seed for image in result.images] == [2**64 - 1]


def test_the_service_keeps_serving_after_bad_requests(diffusion_service):
    for _ in range(3):
        rpc_error(diffusion_service.address, prompt="a cat", width=33)
    assert len(generate(diffusion_service.address, prompt="a cat", steps=2, seed=1).images) == 1


def test_a_size_far_above_the_models_trained_size_is_refused_naming_that_size(diffusion_service):
    with grpc.insecure_channel(diffusion_service.address) as channel:
        info = diffusion_pb2_grpc.DiffusionStub(channel).Describe(diffusion_pb2.DescribeDiffusionRequest(), timeout=10)
    native = info.default_width
    error = rpc_error(diffusion_service.address, prompt="a cat", steps=1, width=native * 4 + 8)
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error.details().startswith("width: ")
    assert f"the {native}x{info.default_height} the model was trained at" in error.details()
    assert f"at most {native * 4}" in error.details() and "--max-size-factor" in error.details()
    # four times the side is still served
    assert len(generate(diffusion_service.address, prompt="a cat", steps=1, seed=1, width=native * 4).images) == 1

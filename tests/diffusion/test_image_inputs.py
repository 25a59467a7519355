"""Bad init and mask images, strengths and mask options are INVALID_ARGUMENT naming the field and the limit,
answered at once while another generation runs."""

from __future__ import annotations

import struct
import time
import zlib

import grpc
import pytest
from PIL import Image

from muestra.v1 import diffusion_pb2
from tests.diffusion.client import generate, rpc_error, stub
from tests.diffusion.test_img2img import encode, random_image, square_mask

PNG = encode(random_image())
MASK = encode(square_mask())


def png_header_only(width: int, height: int) -> bytes:
    """A PNG that declares width x height but holds no pixel data: decoding it in full would fail."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IEND", b"")


def gif() -> bytes:
    return encode(Image.new("RGB", (64, 64)), "GIF")


@pytest.fixture(scope="module")
def busy(diffusion_service):
    """A long generation running on the service for the module's tests; cancelled at the end."""
    call = stub(diffusion_service.address).Generate(
        diffusion_pb2.ImageRequest(prompt="a long run", steps=150, seed=1, width=256, height=256), timeout=600
    )
    assert next(call).progress.step == 1
    yield call
    call.cancel()


@pytest.mark.parametrize(
    ("fields", "field", "limit"),
    [
        ({"init_image": gif()}, "init_image", "is not a PNG, JPEG or WebP image"),
        ({"init_image": b"not an image at all"}, "init_image", "is not a PNG, JPEG or WebP image"),
        ({"init_image": PNG[:200]}, "init_image", "cannot be decoded as PNG"),
        ({"init_image": b"\0" * (16 * 1024 * 1024 + 1)}, "init_image", "the limit is 16777216 bytes"),
        # A decompression bomb: refused from its header, which is all there is of it.
        ({"init_image": png_header_only(100_000, 100_000)}, "init_image", "the limit is 16777216 pixels"),
        ({"init_image": PNG, "mask_image": png_header_only(5000, 5000)}, "mask_image", "the limit is 16777216 pixels"),
        ({"init_image": PNG, "mask_image": gif()}, "mask_image", "is not a PNG, JPEG or WebP image"),
        ({"init_image": PNG, "mask_image": encode(square_mask(64, 72))}, "mask_image", "the size of init_image"),
        ({"init_image": PNG, "strength": 0.0}, "strength", "must be in (0, 1]"),
        ({"init_image": PNG, "strength": 1.5}, "strength", "must be in (0, 1]"),
        ({"init_image": PNG, "strength": -0.1}, "strength", "must be in (0, 1]"),
        ({"init_image": PNG, "strength": float("nan")}, "strength", "must be in (0, 1]"),
        ({"init_image": PNG, "strength": 0.1, "steps": 5}, "strength", "int(steps * strength) = 0 steps"),
        ({"strength": 0.5}, "strength", "needs init_image"),
        ({"mask_image": MASK}, "mask_image", "needs init_image"),
        ({"init_image": PNG, "mask_blur": 3}, "mask_blur", "needs mask_image"),
        ({"init_image": PNG, "invert_mask": True}, "invert_mask", "needs mask_image"),
        ({"init_image": PNG, "padding_mask_crop": 8}, "padding_mask_crop", "needs mask_image"),
        ({"init_image": PNG, "mask_image": MASK, "mask_blur": 65}, "mask_blur", "between 0 and 64"),
        ({"init_image": PNG, "mask_image": MASK, "padding_mask_crop": 65}, "padding_mask_crop", "between 0 and 64"),
        ({"init_image": PNG, "mask_image": MASK, "mask_from_alpha": True}, "mask_image", "has no alpha channel"),
        ({"init_image": encode(random_image(4, 64))}, "init_image", "each side must be at least 8 pixels"),
        ({"init_image": encode(random_image(8, 64))}, "init_image's width", "between 64 and 256, got 8"),
    ],
)
def test_bad_images_and_options_are_invalid_argument_while_another_request_runs(
    fields, field, limit, diffusion_service, busy
):
    started = time.monotonic()
    error = rpc_error(diffusion_service.address, **{"prompt": "a cat", "steps": 4, **fields})
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error.details().startswith(f"{field}: "), error.details()
    assert limit in error.details(), error.details()
    assert time.monotonic() - started < 10  # answered at once, not after the running generation
    assert next(busy).WhichOneof("kind") == "progress"  # and that one is still going


def test_the_limits_themselves_are_accepted(diffusion_service):
    [image] = generate(diffusion_service.address, prompt="a cat", init_image=PNG, strength=1.0, steps=1, seed=1).images
    assert (image.width, image.height) == (64, 64)
    [image] = generate(
        diffusion_service.address, prompt="a cat", init_image=PNG, mask_image=MASK, mask_blur=64,
        padding_mask_crop=64, strength=0.2, steps=5, seed=1,
    ).images  # fmt: skip
    assert (image.width, image.height) == (64, 64)

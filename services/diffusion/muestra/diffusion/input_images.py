"""init_image and mask_image: decoded only after their format, byte count and pixel count pass the limits."""

from __future__ import annotations

import dataclasses
import io

from PIL import Image, ImageOps

from muestra.runtime.errors import InvalidArgument

FORMATS = ("PNG", "JPEG", "WEBP")
# PIL's own decompression-bomb check uses one global limit; open_image checks the configured one itself,
# from the header, and reports the size it read.
Image.MAX_IMAGE_PIXELS = None


@dataclasses.dataclass(frozen=True)
class InputLimits:
    max_bytes: int
    max_pixels: int


def open_image(field: str, data: bytes, limits: InputLimits) -> Image.Image:
    """The decoded image. Its header is read first, so a decompression bomb is refused before it is decoded."""
    if len(data) > limits.max_bytes:
        raise InvalidArgument(field, f"is {len(data)} bytes; the limit is {limits.max_bytes} bytes")
    try:
        image = Image.open(io.BytesIO(data), formats=FORMATS)  # reads the header only
    except Exception as exc:  # PIL raises several kinds for bytes it cannot read
        raise InvalidArgument(field, f"is not a PNG, JPEG or WebP image ({exc})") from exc
    width, height = image.size
    if width * height > limits.max_pixels:
        raise InvalidArgument(
            field, f"is {width}x{height} = {width * height} pixels; the limit is {limits.max_pixels} pixels"
        )
    try:
        image.load()
    except Exception as exc:  # truncated or corrupt data behind a valid header
        raise InvalidArgument(field, f"cannot be decoded as {image.format} ({exc})") from exc
    return image


def read_mask(data: bytes, limits: InputLimits, from_alpha: bool, invert: bool) -> Image.Image:
    """mask_image as grayscale "L": white is repainted. From the alpha channel, transparent is repainted."""
    image = open_image("mask_image", data, limits)
    if from_alpha:
        if "A" not in image.getbands() and "transparency" not in image.info:
            raise InvalidArgument("mask_image", "has no alpha channel to read the mask from (mask_from_alpha)")
        mask = ImageOps.invert(image.convert("RGBA").getchannel("A"))
    else:
        mask = image.convert("L")
    return ImageOps.invert(mask) if invert else mask

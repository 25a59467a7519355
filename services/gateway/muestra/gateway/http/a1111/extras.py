"""A1111's Extras tab over the API (/extra-single-image, /extra-batch-images) with the upscalers that need no
model (None, Lanczos, Nearest), resized as A1111's modules/upscaler.py and scripts/postprocessing_upscale.py
resize; the model-based upscalers and face restoration are refused by the field that asks for them."""

from __future__ import annotations

import asyncio
import base64
import html
import io
import json

from fastapi import APIRouter, Request
from PIL import Image, PngImagePlugin

from muestra.gateway.http.a1111.convert import decode_b64, describe
from muestra.gateway.http.a1111.schemas import (
    A1111Error,
    ExtrasBatchImagesRequest,
    ExtrasRequest,
    ExtrasSingleImageRequest,
    read_body,
)
from muestra.gateway.http.state import EngineDep
from muestra.runtime.errors import MuestraError

# A1111's upscalers that are a Pillow filter ("None" leaves the image as it is).
UPSCALERS = {"None": None, "Lanczos": Image.Resampling.LANCZOS, "Nearest": Image.Resampling.NEAREST}
FORMATS = ("PNG", "JPEG", "WEBP")
# The diffusion service's default --max-input-image-bytes/-pixels, for a gateway with no image model to ask.
DEFAULT_MAX_BYTES = 16 * 1024 * 1024
DEFAULT_MAX_PIXELS = 4096 * 4096

router = APIRouter(prefix="/sdapi/v1")


@router.get("/upscalers")
async def upscalers() -> list[dict]:
    return [{"name": name, "model_name": None, "model_path": None, "model_url": None, "scale": 4} for name in UPSCALERS]


@router.post("/extra-single-image")
async def extra_single_image(http: Request, engine: EngineDep) -> dict:
    body = await read_body(http, ExtrasSingleImageRequest)
    _check(body)
    max_bytes, max_pixels = await _limits(engine)
    image = await asyncio.to_thread(_decode, "image", body.image, max_bytes, max_pixels)
    png, text = await asyncio.to_thread(_postprocess, image, body, max_pixels)
    return {"html_info": _html(text), "image": png}


@router.post("/extra-batch-images")
async def extra_batch_images(http: Request, engine: EngineDep) -> dict:
    body = await read_body(http, ExtrasBatchImagesRequest)
    _check(body)
    max_bytes, max_pixels = await _limits(engine)

    def run() -> tuple[list[str], str]:
        pngs, text = [], ""
        for i, item in enumerate(body.imageList):
            image = _decode(f"imageList[{i}].data", item.data, max_bytes, max_pixels)
            png, text = _postprocess(image, body, max_pixels)
            pngs.append(png)
        return pngs, text

    pngs, text = await asyncio.to_thread(run)
    return {"html_info": _html(text), "images": pngs}  # A1111's html_info is its last image's


def _check(body: ExtrasRequest) -> None:
    for field in ("gfpgan_visibility", "codeformer_visibility"):
        if getattr(body, field):
            raise A1111Error(400, f"{field}: muestra has no face restoration; leave it at 0")
    for field in ("upscaler_1", "upscaler_2"):
        name = getattr(body, field)
        if name not in UPSCALERS:
            served = ", ".join(UPSCALERS)
            raise A1111Error(400, f"{field}: {name!r} needs a model muestra does not have; it serves {served}")


async def _limits(engine: EngineDep) -> tuple[int, int]:
    """The diffusion service's limits on input images (bytes, pixels); the pixel limit bounds the output too."""
    try:
        model = engine.registry.image_model("")
    except MuestraError:
        return DEFAULT_MAX_BYTES, DEFAULT_MAX_PIXELS
    described = await describe(model)
    return described.max_input_image_bytes, described.max_input_image_pixels


def _decode(field: str, text: str, max_bytes: int, max_pixels: int) -> Image.Image:
    """The image, its size read from the header and checked before it is decoded."""
    data = decode_b64(field, text)
    if len(data) > max_bytes:
        raise A1111Error(400, f"{field}: is {len(data)} bytes; the limit is {max_bytes} bytes")
    try:
        image = Image.open(io.BytesIO(data), formats=FORMATS)
    except Exception as exc:  # PIL raises several kinds for bytes it cannot read
        raise A1111Error(400, f"{field}: not a PNG, JPEG or WebP image") from exc
    width, height = image.size
    if width * height > max_pixels:
        raise A1111Error(400, f"{field}: is {width}x{height} = {width * height} pixels; the limit is {max_pixels}")
    try:
        image.load()
    except Exception as exc:  # truncated or corrupt data behind a valid header
        raise A1111Error(400, f"{field}: cannot be decoded as {image.format}") from exc
    return image


def _postprocess(image: Image.Image, body: ExtrasRequest, max_pixels: int) -> tuple[str, str]:
    """The image upscaled as base64 PNG (its text chunks kept, A1111's "postprocessing" added), and that text."""
    info: dict[str, str] = {}
    pixels = image if image.mode in ("RGB", "RGBA") else image.convert("RGB")
    if body.upscaler_1 != "None":
        upscaled = _upscale(pixels, UPSCALERS[body.upscaler_1], body, info, max_pixels)
        info["Postprocess upscaler"] = body.upscaler_1
        if body.upscaler_2 != "None" and body.extras_upscaler_2_visibility > 0:
            second = _upscale(pixels, UPSCALERS[body.upscaler_2], body, info, max_pixels)
            second = second.convert(upscaled.mode) if second.mode != upscaled.mode else second
            upscaled = Image.blend(upscaled, second, body.extras_upscaler_2_visibility)
            info["Postprocess upscaler 2"] = body.upscaler_2
        pixels = upscaled
    text = ", ".join(f"{key}: {_quote(value)}" for key, value in info.items())
    chunks = PngImagePlugin.PngInfo()
    for key, value in image.info.items():
        if isinstance(key, str) and isinstance(value, str) and key != "postprocessing":
            chunks.add_text(key, value)
    chunks.add_text("postprocessing", text)
    buffer = io.BytesIO()
    pixels.save(buffer, format="PNG", pnginfo=chunks)
    return base64.b64encode(buffer.getvalue()).decode(), text


def _upscale(image: Image.Image, resample, body: ExtrasRequest, info: dict, max_pixels: int) -> Image.Image:
    """PostprocessingUpscale.upscale: by a factor, or to a size (the larger ratio), then cropped to it."""
    if body.resize_mode == 1:
        to_w, to_h = body.upscaling_resize_w, body.upscaling_resize_h
        scale = max(to_w / image.width, to_h / image.height)
        info["Postprocess upscale to"] = f"{to_w}x{to_h}"
        fields = "upscaling_resize_w, upscaling_resize_h"
    else:
        scale = body.upscaling_resize
        info["Postprocess upscale by"] = str(scale)
        fields = "upscaling_resize"
    # Upscaler.upscale: the filter's own size first, then Lanczos to sides rounded down to multiples of 8.
    size = int(image.width * scale), int(image.height * scale)
    dest = int(image.width * scale // 8 * 8), int(image.height * scale // 8 * 8)
    if max(size[0] * size[1], dest[0] * dest[1]) > max_pixels:
        raise A1111Error(
            400, f"{fields}: {image.width}x{image.height} scaled by {scale:g} is {size[0]}x{size[1]} pixels; "
            f"the limit is {max_pixels} pixels"
        )  # fmt: skip
    if not min(dest):
        raise A1111Error(400, f"{fields}: {image.width}x{image.height} scaled by {scale:g} is under 8 pixels a side")
    if not (image.width >= dest[0] and image.height >= dest[1] and scale != 1):
        image = image.resize(size, resample)
    if image.size != dest:
        image = image.resize(dest, Image.Resampling.LANCZOS)
    if body.resize_mode == 1 and body.upscaling_crop:
        cropped = Image.new("RGB", (to_w, to_h))
        cropped.paste(image, box=(to_w // 2 - image.width // 2, to_h // 2 - image.height // 2))
        image = cropped
        info["Postprocess crop to"] = f"{to_w}x{to_h}"
    return image


def _quote(value: str) -> str:
    """A1111's infotext_utils.quote."""
    return value if not any(c in value for c in ",\n:") else json.dumps(value, ensure_ascii=False)


def _html(text: str) -> str:
    """A1111's ui_common.plaintext_to_html."""
    return "<p>" + "<br>\n".join(html.escape(line) for line in text.split("\n")) + "</p>"

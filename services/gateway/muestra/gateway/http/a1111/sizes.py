"""A size the model cannot draw, asked by an A1111 client (webuiapi always sends 512x512): generated at the
model's own size in the asked ratio, as A1111's hires fix makes its first pass, then resized to the asked size
with Lanczos (A1111's "Lanczos" upscaler) and said so in the infotext, as A1111's Extras tab says it."""

from __future__ import annotations

import dataclasses
import io
import math

from PIL import Image, PngImagePlugin

from muestra.v1 import diffusion_pb2

UPSCALER = "Lanczos"


@dataclasses.dataclass(frozen=True)
class Plan:
    """The size the diffusion service generates, and the size the client gets (equal: no resize)."""

    width: int
    height: int
    out_width: int
    out_height: int

    @property
    def resized(self) -> bool:
        return (self.width, self.height) != (self.out_width, self.out_height)


def _multiple_of_8(value: float) -> int:
    return max(8, math.ceil(value / 8) * 8)


def plan(width: int, height: int, model: diffusion_pb2.DescribeDiffusionResponse) -> Plan:
    """As asked when the service serves the size; over its limit for the model's trained size only, the
    smallest size in the asked ratio that covers the trained size (sides multiples of 8, within the limit)."""
    native_w, native_h, factor = model.default_width, model.default_height, model.max_size_factor
    as_asked = Plan(width, height, width, height)
    # Other refusals (not a multiple of 8, over --max-width) stay the service's to give.
    if not (width and height and native_w and native_h and factor) or width % 8 or height % 8:
        return as_asked
    if width > model.max_width or height > model.max_height:
        return as_asked
    limit_w, limit_h = int(native_w * factor) // 8 * 8, int(native_h * factor) // 8 * 8
    if width <= native_w * factor and height <= native_h * factor:
        return as_asked
    scale = max(native_w / width, native_h / height)
    return Plan(
        min(_multiple_of_8(width * scale), limit_w), min(_multiple_of_8(height * scale), limit_h), width, height
    )


def infotext_pairs(plan: Plan) -> dict[str, str]:
    """The keys A1111's Extras tab writes for an upscale to a size."""
    return {"Postprocess upscale to": f"{plan.out_width}x{plan.out_height}", "Postprocess upscaler": UPSCALER}


def resize(image: diffusion_pb2.GeneratedImage, plan: Plan) -> diffusion_pb2.GeneratedImage:
    """The image resized to the asked size, its parameters text (and PNG chunk) ending with the upscale."""
    pairs = ", ".join(f"{key}: {value}" for key, value in infotext_pairs(plan).items())
    parameters = f"{image.parameters}, {pairs}"
    pixels = Image.open(io.BytesIO(image.png))
    pixels = pixels.resize((plan.out_width, plan.out_height), Image.Resampling.LANCZOS)
    chunk = PngImagePlugin.PngInfo()
    chunk.add_text("parameters", parameters)
    buffer = io.BytesIO()
    pixels.save(buffer, format="PNG", pnginfo=chunk)
    resized = diffusion_pb2.GeneratedImage()
    resized.CopyFrom(image)
    resized.png, resized.parameters = buffer.getvalue(), parameters
    resized.width, resized.height = plan.out_width, plan.out_height
    return resized

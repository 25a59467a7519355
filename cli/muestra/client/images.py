"""Image requests and events."""

from __future__ import annotations

import dataclasses
from typing import Any

from google.protobuf import struct_pb2

from muestra.v1 import diffusion_pb2


@dataclasses.dataclass
class Progress:
    image_index: int
    step: int
    total: int
    elapsed_s: float
    preview_png: bytes = b""


@dataclasses.dataclass
class GeneratedImage:
    index: int
    seed: int
    png: bytes
    width: int
    height: int
    parameters: str


def build_image_request(
    prompt: str,
    *,
    model: str = "",
    negative_prompt: str = "",
    width: int = 0,
    height: int = 0,
    steps: int = 0,
    guidance_scale: float | None = None,
    seed: int | None = None,
    sampler: str = "",
    num_images: int = 1,
    preview_every: int = 0,
    extra: dict[str, Any] | None = None,
    init_image: bytes = b"",
    strength: float | None = None,
    mask_image: bytes = b"",
    mask_blur: int = 0,
    invert_mask: bool = False,
    padding_mask_crop: int | None = None,
    loras: dict[str, float] | None = None,
) -> diffusion_pb2.ImageRequest:
    """An ImageRequest; init_image makes it img2img, mask_image as well inpainting (white is repainted)."""
    request = diffusion_pb2.ImageRequest(
        model=model,
        prompt=prompt,
        negative_prompt=negative_prompt,
        width=width,
        height=height,
        steps=steps,
        sampler=sampler,
        num_images=num_images,
        preview_every=preview_every,
        init_image=init_image,
        mask_image=mask_image,
        mask_blur=mask_blur,
        invert_mask=invert_mask,
        loras=[diffusion_pb2.LoraWeight(name=name, weight=weight) for name, weight in (loras or {}).items()],
    )
    if strength is not None:
        request.strength = strength
    if padding_mask_crop is not None:
        request.padding_mask_crop = padding_mask_crop
    if guidance_scale is not None:
        request.guidance_scale = guidance_scale
    if seed is not None:
        request.seed = seed
    if extra:
        struct = struct_pb2.Struct()
        struct.update(extra)
        request.extra.CopyFrom(struct)
    return request


def image_event(message: diffusion_pb2.ImageResponse) -> Progress | GeneratedImage:
    if message.HasField("progress"):
        p = message.progress
        return Progress(p.image_index, p.step, p.total, p.elapsed_s, p.preview_png)
    i = message.image
    return GeneratedImage(i.index, i.seed, i.png, i.width, i.height, i.parameters)

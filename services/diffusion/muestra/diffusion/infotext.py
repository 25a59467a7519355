"""The generation parameters as A1111-style text, and PNGs that carry them in a "parameters" text chunk."""

from __future__ import annotations

import io
import json

from PIL import Image, PngImagePlugin


def _quote(value: str) -> str:
    # A1111 quotes values that would break its "key: value, key: value" line.
    return json.dumps(value, ensure_ascii=False) if any(c in value for c in ',:\n"') else value


def parameters_text(
    *,
    prompt: str,
    negative_prompt: str,
    steps: int,
    sampler: str,
    guidance_scale: float,
    seed: int,
    width: int,
    height: int,
    model: str,
    scheduler_options: dict | None = None,
    strength: float | None = None,
    mask_blur: int | None = None,
    invert_mask: bool = False,
    padding_mask_crop: int | None = None,
) -> str:
    """The text A1111 writes: the prompt, "Negative prompt: ...", then one line of key: value pairs."""
    lines = [prompt]
    if negative_prompt:
        lines.append(f"Negative prompt: {negative_prompt}")
    pairs = [
        ("Steps", str(steps)),
        ("Sampler", sampler),
        ("CFG scale", f"{guidance_scale:g}"),
        ("Seed", str(seed)),
        ("Size", f"{width}x{height}"),
        ("Model", model),
    ]
    # img2img and inpainting, under A1111's names.
    if strength is not None:
        pairs.append(("Denoising strength", f"{strength:g}"))
    if mask_blur is not None:
        pairs.append(("Mask blur", str(mask_blur)))
    if invert_mask:
        pairs.append(("Mask mode", "Inpaint not masked"))
    if padding_mask_crop is not None:
        pairs += [("Inpaint area", "Only masked"), ("Masked area padding", str(padding_mask_crop))]
    if scheduler_options:
        pairs.append(("Scheduler options", json.dumps(scheduler_options, sort_keys=True)))
    lines.append(", ".join(f"{key}: {_quote(value)}" for key, value in pairs))
    return "\n".join(lines)


def encode_png(image: Image.Image, parameters: str) -> bytes:
    """PNG bytes with `parameters` in a tEXt chunk (iTXt when the text is not Latin-1, as PIL and A1111 do)."""
    info = PngImagePlugin.PngInfo()
    info.add_text("parameters", parameters)
    buffer = io.BytesIO()
    image.save(buffer, format="PNG", pnginfo=info)
    return buffer.getvalue()

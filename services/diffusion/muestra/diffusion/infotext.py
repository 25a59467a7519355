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

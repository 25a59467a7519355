"""Reading a model folder's model_index.json, before torch and diffusers are imported."""

from __future__ import annotations

import json
from pathlib import Path

# The inpainting classes are folders whose UNet takes 9 channels (latents, mask, masked image): they only inpaint.
SUPPORTED_PIPELINES = (
    "StableDiffusionPipeline",
    "StableDiffusionXLPipeline",
    "StableDiffusionInpaintPipeline",
    "StableDiffusionXLInpaintPipeline",
)


def pipeline_class_name(path: str | Path) -> str:
    """The folder's pipeline class; SystemExit naming the folder when it is not a supported diffusers pipeline."""
    index_path = Path(path) / "model_index.json"
    if not index_path.is_file():
        raise SystemExit(f"--model {path}: no model_index.json (expected a diffusers folder)")
    try:
        class_name = json.loads(index_path.read_text()).get("_class_name", "")
    except (ValueError, AttributeError) as exc:
        raise SystemExit(f"--model {path}: model_index.json is not a JSON object: {exc}") from exc
    if class_name not in SUPPORTED_PIPELINES:
        raise SystemExit(
            f"--model {path}: pipeline {class_name!r} is not supported; supported: {', '.join(SUPPORTED_PIPELINES)}"
        )
    return class_name

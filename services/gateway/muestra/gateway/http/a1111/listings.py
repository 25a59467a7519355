"""The A1111 routes clients read at start-up or on demand, answered truthfully: an empty list of what muestra
has none of, png-info from the PNG's "parameters" chunk, memory of this gateway process."""

from __future__ import annotations

import io
import json
import os
import re

from fastapi import APIRouter, Request
from PIL import Image, UnidentifiedImageError

from muestra.gateway.http.a1111.convert import decode_b64, image_model, list_schedulers
from muestra.gateway.http.a1111.infotext import a1111_names
from muestra.gateway.http.a1111.schemas import A1111Error, InterrogateRequest, PngInfoRequest, read_body
from muestra.gateway.http.state import EngineDep

router = APIRouter(prefix="/sdapi/v1")
# One "key: value" of an infotext's last line (A1111's modules/infotext_utils.py re_param).
PAIR = re.compile(r'\s*(\w[\w \-/]+):\s*("(?:\\.|[^\\"])+"|[^,]*)(?:,|$)')
SIZE = re.compile(r"^(\d+)x(\d+)$")


def _none() -> list:
    return []


# What A1111 lists from its model folders and extensions; muestra has none of these. LoRAs, models and
# samplers are in routes.py, upscalers in extras.py. /artists and /artist-categories are gone from A1111 but
# webuiapi still asks.
for _path in (
    "latent-upscale-modes", "sd-vae", "hypernetworks", "face-restorers", "realesrgan-models",
    "prompt-styles", "script-info", "artists", "artist-categories",
):  # fmt: skip
    router.add_api_route(f"/{_path}", _none, methods=["GET"], name=_path)


@router.get("/scripts")
async def scripts() -> dict:
    return {"txt2img": [], "img2img": []}


@router.get("/embeddings")
async def embeddings() -> dict:
    return {"loaded": {}, "skipped": {}}


@router.get("/cmd-flags")
async def cmd_flags() -> dict:
    """A1111's command-line flags: muestra has none of them (its services' flags are in their READMEs)."""
    return {}


def _models_are_fixed() -> None:
    """A no-op answered as A1111 answers (null): the models, LoRAs and VAE are what the services loaded at start."""


# A1111 rescans its model folders (refresh-*) or loads and frees its one checkpoint (reload-, unload-).
for _path in (
    "refresh-checkpoints", "refresh-vae", "refresh-embeddings", "refresh-loras", "reload-checkpoint",
    "unload-checkpoint",
):  # fmt: skip
    router.add_api_route(f"/{_path}", _models_are_fixed, methods=["POST"], name=_path)


@router.post("/interrogate")
async def interrogate(http: Request) -> None:
    """A1111 captions an image with CLIP or DeepDanbooru; muestra has no captioning model."""
    body = await read_body(http, InterrogateRequest)
    raise A1111Error(501, f"interrogate: no captioning model is installed (asked for {body.model!r})")


@router.get("/memory")
async def memory() -> dict:
    """A1111's figures for this gateway process: `used` its resident memory, `total` the machine's, `free` the
    difference (A1111's arithmetic). The gateway runs no CUDA; the diffusion service is another process."""
    try:
        page = os.sysconf("SC_PAGE_SIZE")
        total = page * os.sysconf("SC_PHYS_PAGES")
        with open("/proc/self/statm") as statm:
            used = int(statm.read().split()[1]) * page
        ram = {"free": total - used, "used": used, "total": total}
    except (OSError, ValueError) as exc:
        ram = {"error": str(exc)}
    return {"ram": ram, "cuda": {"error": "unavailable: the gateway process does not use CUDA"}}


def parse_infotext(text: str) -> dict[str, str]:
    """A1111's parse_generation_parameters: Prompt, Negative prompt, and the last line's pairs (Size as -1/-2)."""
    *lines, last = text.strip().split("\n")
    if len(PAIR.findall(last)) < 3:
        lines, last = [*lines, last], ""
    prompt, negative, in_negative = [], [], False
    for line in lines:
        if not in_negative and line.startswith("Negative prompt:"):
            in_negative, line = True, line.removeprefix("Negative prompt:").strip()
        (negative if in_negative else prompt).append(line)
    parsed = {"Prompt": "\n".join(prompt), "Negative prompt": "\n".join(negative)}
    for key, value in PAIR.findall(last):
        if value.startswith('"'):
            try:
                value = json.loads(value)
            except ValueError:
                pass
        size = SIZE.match(value)
        if size:
            parsed[f"{key}-1"], parsed[f"{key}-2"] = size.groups()
        else:
            parsed[key] = value
    return parsed


async def _sampler_names(engine: EngineDep) -> dict[str, str]:
    """Our scheduler names and A1111's to A1111's; none when no diffusion service answers (png-info needs none)."""
    try:
        return a1111_names(await list_schedulers(image_model(engine, "")))
    except A1111Error:
        return {}


@router.post("/png-info")
async def png_info(http: Request, engine: EngineDep) -> dict:
    """The "parameters" text chunk the diffusion service writes, parsed (its Sampler under A1111's name, as
    muestra writes it on /sdapi or ours, as on the other APIs); the image's other text in `items`."""
    body = await read_body(http, PngInfoRequest)
    if not body.image.strip():
        return {"info": "", "items": {}, "parameters": {}}
    try:
        image = Image.open(io.BytesIO(decode_b64("image", body.image)))
    except (UnidentifiedImageError, OSError):
        raise A1111Error(400, "image: not a PNG, JPEG or WebP image") from None
    items = {key: value for key, value in image.info.items() if isinstance(value, str)}
    text = items.pop("parameters", "")
    parsed = parse_infotext(text) if text else {}
    if "Sampler" in parsed:
        parsed["Sampler"] = (await _sampler_names(engine)).get(parsed["Sampler"].lower(), parsed["Sampler"])
    return {"info": text, "items": items, "parameters": parsed}

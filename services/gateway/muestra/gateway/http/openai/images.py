"""POST /v1/images/generations and /v1/images/edits: the images in one JSON answer, or streamed as OpenAI
streams gpt-image-1's.

An edit is a multipart form: `image` (img2img), optionally `mask` (inpainting; OpenAI's convention, the
transparent part is repainted), and the generation's fields as text, plus muestra's strength, mask_blur,
padding_mask_crop and invert_mask.

A stream is server-sent events, each `event: <type>` and `data: <json>`: `image_generation.partial_image`
for a preview, `muestra.image_generation.progress` for a step without one, `image_generation.completed`
for each image, then `data: [DONE]`.
"""

from __future__ import annotations

import base64
import contextlib
import logging
import time

from fastapi import Request
from fastapi.responses import JSONResponse, Response
from pydantic import Field, ValidationError
from starlette.datastructures import UploadFile

from muestra.gateway.engine.engine import Engine
from muestra.gateway.http.errors import OpenAIError, bad_request, from_muestra, from_validation, internal
from muestra.gateway.http.openai.convert import image_request
from muestra.gateway.http.openai.schemas import UINT32_MAX, ImageGenerationRequest
from muestra.gateway.http.streams import SSE_DONE, ClientGone, ClosingStreamingResponse, cancel_on_disconnect, sse
from muestra.runtime.errors import MuestraError
from muestra.runtime.logs import request_id_var
from muestra.v1 import diffusion_pb2

log = logging.getLogger("muestra.gateway.openai")
# The fields gpt-image-1's events carry that a diffusion model has only one answer for.
PNG_FIELDS = {"quality": "auto", "background": "opaque", "output_format": "png"}
# gpt-image-1 counts tokens; a diffusion model has none to count, and the client's type needs the fields.
NO_USAGE = {
    "input_tokens": 0,
    "output_tokens": 0,
    "total_tokens": 0,
    "input_tokens_details": {"image_tokens": 0, "text_tokens": 0},
}


class ImageEditRequest(ImageGenerationRequest):
    """The text fields of POST /v1/images/edits (the files come apart), with muestra's image-to-image fields."""

    strength: float | None = None
    mask_blur: int | None = Field(None, ge=0, le=UINT32_MAX)
    padding_mask_crop: int | None = Field(None, ge=0, le=UINT32_MAX)
    invert_mask: bool = False
    # gpt-image-1's: one answer here.
    input_fidelity: str | None = None
    background: str | None = None


# The multipart form: at most an image, a mask, and a few dozen text fields.
MAX_FORM_FILES = 3
MAX_FORM_FIELDS = 64


def preview_steps(total: int, wanted: int) -> set[int]:
    """The steps (1..total) whose previews make `wanted` evenly spaced partial images (fewer if total is less)."""
    return {min(total, max(1, round(total * (k + 1) / (wanted + 1)))) for k in range(wanted)}


def _b64(png: bytes) -> str:
    return base64.b64encode(png).decode()


def _error(exc: BaseException, renames: dict[str, str]) -> OpenAIError:
    if isinstance(exc, MuestraError):
        return from_muestra(exc, renames)
    log.error("internal error", exc_info=exc)
    return internal(request_id_var.get())


def _event(payload: dict) -> str:
    return f"event: {payload['type']}\n" + sse(payload)


async def respond_edits(engine: Engine, http: Request) -> Response:
    form = await http.form(max_files=MAX_FORM_FILES, max_fields=MAX_FORM_FIELDS)
    files = {key: [v for v in form.getlist(key) if isinstance(v, UploadFile)] for key in ("image", "image[]", "mask")}
    images = files["image"] + files["image[]"]
    if len(images) != 1:
        raise bad_request("image", "one image file is required" if not images else "only one image is supported")
    if len(files["mask"]) > 1:
        raise bad_request("mask", "only one mask is supported")
    fields = {key: value for key, value in form.multi_items() if not isinstance(value, UploadFile)}
    try:
        body = ImageEditRequest.model_validate(fields)
    except ValidationError as exc:
        raise from_validation(list(exc.errors())) from None
    request, renames = image_request(body)
    request.init_image = await images[0].read()
    if files["mask"]:
        request.mask_image = await files["mask"][0].read()
        request.mask_from_alpha = True
    if body.strength is not None:
        request.strength = body.strength
    if body.padding_mask_crop is not None:
        request.padding_mask_crop = body.padding_mask_crop
    request.mask_blur = body.mask_blur or 0
    request.invert_mask = body.invert_mask
    renames = {**renames, "init_image": "image", "mask_image": "mask"}
    return await respond_image_request(engine, request, renames, body, http)


async def respond_images(engine: Engine, body: ImageGenerationRequest, http: Request) -> Response:
    request, renames = image_request(body)
    return await respond_image_request(engine, request, renames, body, http)


async def respond_image_request(
    engine: Engine,
    request: diffusion_pb2.ImageRequest,
    renames: dict[str, str],
    body: ImageGenerationRequest,
    http: Request,
) -> Response:
    if body.stream:
        return await _stream(engine, request, body.partial_images, renames, http)

    async def generate() -> list[diffusion_pb2.GeneratedImage]:
        images = []
        async with contextlib.aclosing(engine.generate_image(request)) as stream:
            async for message in stream:
                if message.WhichOneof("kind") == "image":
                    images.append(message.image)
        return images

    try:
        images = await cancel_on_disconnect(http, generate())
    except ClientGone:
        return Response(status_code=499)
    except MuestraError as exc:
        raise from_muestra(exc, renames) from None
    data = [
        {"b64_json": _b64(image.png), "revised_prompt": None, "seed": image.seed, "parameters": image.parameters}
        for image in sorted(images, key=lambda image: image.index)
    ]
    return JSONResponse({"created": int(time.time()), "data": data})


async def _stream(
    engine: Engine,
    request: diffusion_pb2.ImageRequest,
    partial_images: int | None,
    renames: dict[str, str],
    http: Request,
) -> Response:
    stream = engine.generate_image(request)
    try:  # the status line waits for the first message, so that a refused request gets its own status
        first = await cancel_on_disconnect(http, anext(stream, None))
    except ClientGone:  # cancelling the wait for the first message cancelled the diffusion call
        return Response(status_code=499)
    except Exception as exc:  # noqa: BLE001 - every failure becomes an OpenAI error
        await stream.aclose()
        raise _error(exc, renames) from None
    size = f"{request.width}x{request.height}" if request.width and request.height else "auto"
    return ClosingStreamingResponse(
        _events(stream, first, size, partial_images, renames), media_type="text/event-stream"
    )


async def _events(stream, first, size: str, partial_images: int | None, renames: dict[str, str]):
    """The SSE stream; closing it early (the client left) closes `stream`, which cancels the diffusion call."""
    partials: dict[int, int] = {}  # image index -> partial images sent for it
    message = first
    try:
        while message is not None:
            if message.WhichOneof("kind") == "progress":
                p = message.progress
                progress = {"image_index": p.image_index, "step": p.step, "total": p.total, "elapsed_s": p.elapsed_s}
                chosen = not partial_images or p.step in preview_steps(p.total, partial_images)
                if p.preview_png and chosen:
                    k = partials.get(p.image_index, 0)
                    partials[p.image_index] = k + 1
                    yield _event({
                        "type": "image_generation.partial_image", "b64_json": _b64(p.preview_png),
                        "partial_image_index": k, "created_at": int(time.time()), "size": size, **PNG_FIELDS,
                        **progress,
                    })  # fmt: skip
                else:
                    yield _event({"type": "muestra.image_generation.progress", **progress})
            else:
                image = message.image
                yield _event({
                    "type": "image_generation.completed", "b64_json": _b64(image.png),
                    "created_at": int(time.time()), "size": f"{image.width}x{image.height}", **PNG_FIELDS,
                    "usage": NO_USAGE, "index": image.index, "seed": image.seed, "parameters": image.parameters,
                })  # fmt: skip
            message = await anext(stream, None)
    except Exception as exc:  # noqa: BLE001 - the stream has started: the error goes in the stream
        yield sse(_error(exc, renames).body())
    finally:
        await stream.aclose()
    yield SSE_DONE

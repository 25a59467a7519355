"""AUTOMATIC1111's web-UI API (/sdapi/v1/*) on the gateway's HTTP port, over the same GenerateImage.

Field names and response shapes are A1111's (modules/api/models.py, modules/processing.py); unknown fields
are ignored as A1111 ignores them, but an A1111 feature muestra does not have (hires fix, face restoration,
scripts, ...) is refused when it is switched on. Width, height, steps and cfg_scale default to the model's.
Errors are A1111's: {"detail": message} with a 4xx status, and 422 with FastAPI's list for a body that does
not validate. /progress and /interrupt see the A1111 jobs of this gateway process.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import dataclasses
import json
import logging
import time
from typing import Any

import grpc
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from muestra.gateway.openai.errors import from_muestra
from muestra.gateway.openai.streams import ClientGone, cancel_on_disconnect
from muestra.gateway.server import GatewayServicer
from muestra.runtime.errors import MuestraError
from muestra.v1 import diffusion_pb2

log = logging.getLogger("muestra.gateway.a1111")
LIST_TIMEOUT_S = 5.0
UINT32_MAX = 2**32 - 1
# A1111's schedulers (its "Schedule type") that name one of ours together with the sampler.
A1111_SCHEDULERS = {"automatic": "", "karras": "Karras"}
# GET /sdapi/v1/schedulers: those two, as A1111 lists them.
SCHEDULER_LISTING = [
    {"name": "automatic", "label": "Automatic", "aliases": None, "default_rho": -1, "need_inner_model": False},
    {"name": "karras", "label": "Karras", "aliases": None, "default_rho": 7.0, "need_inner_model": False},
]
# Our field names -> A1111's, for the messages of errors the diffusion service sends back.
RENAMES = {
    "init_image": "init_images[0]",
    "mask_image": "mask",
    "strength": "denoising_strength",
    "padding_mask_crop": "inpaint_full_res_padding",
    "guidance_scale": "cfg_scale",
    "num_images": "batch_size",
    "sampler": "sampler_name",
}


class A1111Error(Exception):
    def __init__(self, status: int, detail: Any) -> None:
        super().__init__(str(detail))
        self.status = status
        self.detail = detail


class Txt2ImgRequest(BaseModel):
    """StableDiffusionTxt2ImgProcessingAPI: the fields muestra reads, and those it can only leave off."""

    model_config = ConfigDict(extra="ignore")

    prompt: str = ""
    negative_prompt: str = ""
    seed: int = Field(-1, ge=-1, le=2**64 - 1)
    sampler_name: str | None = None
    sampler_index: str | None = None
    scheduler: str | None = None
    batch_size: int = Field(1, ge=1, le=UINT32_MAX)
    n_iter: int = Field(1, ge=1, le=UINT32_MAX)
    steps: int | None = Field(None, ge=1, le=UINT32_MAX)
    cfg_scale: float | None = None
    width: int | None = Field(None, ge=0, le=UINT32_MAX)
    height: int | None = Field(None, ge=0, le=UINT32_MAX)
    override_settings: dict[str, Any] | None = None
    # Features muestra does not have: accepted only when off.
    enable_hr: bool = False
    restore_faces: bool | None = None
    tiling: bool | None = None
    subseed_strength: float = 0.0
    styles: list[str] | None = None
    script_name: str | None = None
    alwayson_scripts: dict[str, Any] | None = None
    send_images: bool = True


class Img2ImgRequest(Txt2ImgRequest):
    """StableDiffusionImg2ImgProcessingAPI."""

    init_images: list[str] = Field(min_length=1)
    resize_mode: int = 0
    denoising_strength: float = 0.75
    mask: str | None = None
    mask_blur: int | None = Field(None, ge=0, le=UINT32_MAX)
    mask_blur_x: int = Field(4, ge=0, le=UINT32_MAX)
    mask_blur_y: int = Field(4, ge=0, le=UINT32_MAX)
    inpainting_mask_invert: int = Field(0, ge=0, le=1)
    inpaint_full_res: bool = True
    inpaint_full_res_padding: int = Field(0, ge=0, le=UINT32_MAX)
    # diffusers' inpainting starts from the original image under the mask; A1111's other fills have no
    # counterpart, and its default (0, "fill") is accepted as that.
    inpainting_fill: int = 0
    include_init_images: bool = False


OFF_FEATURES = (
    ("enable_hr", "hires fix"),
    ("restore_faces", "face restoration"),
    ("tiling", "tiling"),
    ("subseed_strength", "variation seeds"),
    ("styles", "styles"),
    ("script_name", "scripts"),
    ("alwayson_scripts", "scripts"),
)


@dataclasses.dataclass
class Job:
    """One A1111 request on its way, as /progress reports it."""

    images: int
    started: float = dataclasses.field(default_factory=time.perf_counter)
    timestamp: str = dataclasses.field(default_factory=lambda: time.strftime("%Y%m%d%H%M%S"))
    image_index: int = 0
    step: int = 0
    total: int = 0
    preview: bytes = b""
    interrupted: bool = False
    task: asyncio.Future | None = None

    def fraction(self) -> float:
        if not self.total:
            return 0.0
        return min(1.0, (self.image_index * self.total + self.step) / (self.images * self.total))


class Jobs:
    """The A1111 jobs of this gateway, oldest first; the current one is the oldest that has begun to denoise."""

    def __init__(self) -> None:
        self.running: list[Job] = []
        # The model the A1111 routes use (POST /sdapi/v1/options sd_model_checkpoint); empty: the gateway's default.
        self.checkpoint = ""

    def current(self) -> Job | None:
        return next((job for job in self.running if job.step), self.running[0] if self.running else None)


def _decode_b64(field: str, text: str) -> bytes:
    """A1111 clients send bare base64 or a data URL."""
    if text.startswith("data:") and "," in text:
        text = text.split(",", 1)[1]
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise A1111Error(400, f"{field}: not valid base64 image data") from None


def _validation_detail(exc: ValidationError) -> list[dict]:
    return [{"loc": ["body", *e["loc"]], "msg": e["msg"], "type": e["type"]} for e in exc.errors()]


async def _body(http: Request, model: Any) -> Any:
    raw = await http.body()
    try:
        data = json.loads(raw or b"null")
    except ValueError as exc:
        raise A1111Error(422, [{"loc": ["body"], "msg": f"JSON decode error: {exc}", "type": "json_invalid"}]) from None
    try:
        return TypeAdapter(model).validate_python(data)
    except ValidationError as exc:
        raise A1111Error(422, _validation_detail(exc)) from None


def _display_name(info: diffusion_pb2.SchedulerInfo) -> str:
    """The A1111 name of a scheduler: its first alias that reads like one ("Euler a", "DPM++ 2M Karras")."""
    for alias in info.aliases:
        if alias[:1].isupper() and not alias.endswith("Scheduler"):
            return alias
    return info.name


async def _schedulers(model) -> list[diffusion_pb2.SchedulerInfo]:
    try:
        reply = await model.stub.ListSchedulers(diffusion_pb2.ListSchedulersRequest(), timeout=LIST_TIMEOUT_S)
    except grpc.aio.AioRpcError as exc:
        raise _unanswered(model, exc) from None
    return list(reply.schedulers)


def _unanswered(model, exc: grpc.aio.AioRpcError) -> A1111Error:
    return A1111Error(503, f"the diffusion service of {model.name!r} did not answer ({exc.code().name})")


async def _sampler(model, body: Txt2ImgRequest) -> str:
    """Our scheduler name for A1111's sampler_name (or the older sampler_index) and its scheduler."""
    name = body.sampler_name or body.sampler_index or ""
    schedule = (body.scheduler or "automatic").strip()
    if schedule.lower() not in A1111_SCHEDULERS:
        known = ", ".join(v or k.title() for k, v in A1111_SCHEDULERS.items())
        raise A1111Error(404, f"Scheduler not found: {body.scheduler!r}; known: {known}")
    if not name:
        return ""
    suffix = A1111_SCHEDULERS[schedule.lower()]
    wanted = f"{name} {suffix}" if suffix and not name.endswith(suffix) else name
    schedulers = await _schedulers(model)
    for info in schedulers:
        if wanted.lower() in {n.lower() for n in (info.name, *info.aliases)}:
            return info.name
    known = ", ".join(_display_name(info) for info in schedulers)
    raise A1111Error(404, f"Sampler not found: {wanted!r}; known: {known}")


def _check_off(body: Txt2ImgRequest) -> None:
    for field, feature in OFF_FEATURES:
        if getattr(body, field):
            raise A1111Error(400, f"{field}: muestra has no {feature}; leave it off")
    settings = dict(body.override_settings or {})
    settings.pop("sd_model_checkpoint", None)
    if settings:
        raise A1111Error(400, f"override_settings: only sd_model_checkpoint is supported, got {', '.join(settings)}")


def _model(servicer: GatewayServicer, checkpoint: str):
    try:
        return servicer.registry.image_model(checkpoint)
    except MuestraError as exc:
        raise A1111Error(404, f"Model not found: {exc}") from None


async def _image_request(
    servicer: GatewayServicer, body: Txt2ImgRequest, checkpoint: str
) -> diffusion_pb2.ImageRequest:
    _check_off(body)
    model = _model(servicer, (body.override_settings or {}).get("sd_model_checkpoint") or checkpoint)
    request = diffusion_pb2.ImageRequest(
        model=model.name,
        prompt=body.prompt,
        negative_prompt=body.negative_prompt,
        width=body.width or 0,
        height=body.height or 0,
        steps=body.steps or 0,
        sampler=await _sampler(model, body),
        num_images=body.batch_size * body.n_iter,
        preview_every=1,  # /progress shows the current image
    )
    if body.cfg_scale is not None:
        request.guidance_scale = body.cfg_scale
    if body.seed != -1:
        request.seed = body.seed
    if isinstance(body, Img2ImgRequest):
        _image_fields(body, request)
    return request


def _image_fields(body: Img2ImgRequest, request: diffusion_pb2.ImageRequest) -> None:
    if len(body.init_images) > 1:
        raise A1111Error(400, f"init_images: only one image is supported, got {len(body.init_images)}")
    if body.resize_mode != 0:
        raise A1111Error(400, f"resize_mode: only 0 (just resize) is supported, got {body.resize_mode}")
    request.init_image = _decode_b64("init_images[0]", body.init_images[0])
    request.strength = body.denoising_strength
    if not body.mask:
        return
    request.mask_image = _decode_b64("mask", body.mask)
    if body.mask_blur is None and body.mask_blur_x != body.mask_blur_y:
        raise A1111Error(400, "mask_blur_x, mask_blur_y: one blur for both axes is supported; give mask_blur")
    request.mask_blur = body.mask_blur if body.mask_blur is not None else body.mask_blur_x
    request.invert_mask = bool(body.inpainting_mask_invert)
    if body.inpaint_full_res:
        request.padding_mask_crop = body.inpaint_full_res_padding


def _settings(parameters: str) -> dict[str, str]:
    """The unquoted "key: value" pairs of the parameters text's last line (the defaults the service filled in)."""
    pairs = (pair.split(": ", 1) for pair in parameters.splitlines()[-1].split(", "))
    return {pair[0]: pair[1] for pair in pairs if len(pair) == 2 and not pair[1].startswith('"')}


def _info(body: Txt2ImgRequest, request, images: list, job: Job) -> dict:
    """The `info` object A1111 returns (as a JSON string), with the fields muestra has answers for."""
    seeds = [image.seed for image in images]
    first = images[0] if images else None
    used = _settings(first.parameters) if first else {}
    return {
        "prompt": body.prompt,
        "all_prompts": [body.prompt] * len(images),
        "negative_prompt": body.negative_prompt,
        "all_negative_prompts": [body.negative_prompt] * len(images),
        "seed": seeds[0] if seeds else body.seed,
        "all_seeds": seeds,
        "subseed": -1,
        "all_subseeds": [-1] * len(images),
        "subseed_strength": 0,
        "width": first.width if first else request.width,
        "height": first.height if first else request.height,
        "sampler_name": body.sampler_name or body.sampler_index or used.get("Sampler", request.sampler),
        "cfg_scale": float(used["CFG scale"]) if "CFG scale" in used else body.cfg_scale,
        "steps": int(used["Steps"]) if "Steps" in used else body.steps or job.total,
        "batch_size": body.batch_size,
        "restore_faces": False,
        "face_restoration_model": None,
        "sd_model_name": request.model,
        "sd_model_hash": None,
        "sd_vae_name": None,
        "sd_vae_hash": None,
        "seed_resize_from_w": -1,
        "seed_resize_from_h": -1,
        "denoising_strength": request.strength if request.HasField("strength") else None,
        "extra_generation_params": {},
        "index_of_first_image": 0,
        "infotexts": [image.parameters for image in images],
        "styles": [],
        "job_timestamp": job.timestamp,
        "clip_skip": 1,
        "is_using_inpainting_conditioning": False,
        "version": "muestra",
        "interrupted": job.interrupted,
    }


def add_a1111(app: FastAPI, servicer: GatewayServicer) -> None:
    """The /sdapi/v1 routes."""
    jobs = Jobs()

    @app.exception_handler(A1111Error)
    async def a1111_error(request: Request, exc: A1111Error) -> JSONResponse:
        return JSONResponse({"detail": exc.detail}, status_code=exc.status)

    async def run(body: Txt2ImgRequest, http: Request) -> JSONResponse:
        request = await _image_request(servicer, body, jobs.checkpoint)
        job = Job(images=request.num_images)
        images: list[diffusion_pb2.GeneratedImage] = []

        async def collect() -> None:
            async with contextlib.aclosing(servicer.GenerateImage(request, None)) as stream:
                async for message in stream:
                    if message.WhichOneof("kind") == "image":
                        images.append(message.image)
                        continue
                    p = message.progress
                    job.image_index, job.step, job.total = p.image_index, p.step, p.total
                    job.preview = p.preview_png or job.preview

        job.task = asyncio.ensure_future(collect())
        jobs.running.append(job)
        try:
            await cancel_on_disconnect(http, job.task)
        except ClientGone:
            if not job.interrupted:
                return JSONResponse({"detail": "client closed the request"}, status_code=499)
        except MuestraError as exc:
            error = from_muestra(exc, RENAMES)
            raise A1111Error(error.status, error.message) from None
        finally:
            jobs.running.remove(job)
        images.sort(key=lambda image: image.index)
        parameters = body.model_dump()
        if isinstance(body, Img2ImgRequest) and not body.include_init_images:
            parameters.update(init_images=None, mask=None)
        return JSONResponse({
            "images": [base64.b64encode(image.png).decode() for image in images] if body.send_images else [],
            "parameters": parameters,
            "info": json.dumps(_info(body, request, images, job)),
        })  # fmt: skip

    @app.post("/sdapi/v1/txt2img")
    async def txt2img(http: Request) -> JSONResponse:
        return await run(await _body(http, Txt2ImgRequest), http)

    @app.post("/sdapi/v1/img2img")
    async def img2img(http: Request) -> JSONResponse:
        return await run(await _body(http, Img2ImgRequest), http)

    @app.get("/sdapi/v1/progress")
    async def progress(skip_current_image: bool = False) -> dict:
        job = jobs.current()
        fraction = job.fraction() if job else 0.0
        elapsed = time.perf_counter() - job.started if job else 0.0
        preview = job.preview if job and not skip_current_image else b""
        return {
            "progress": fraction,
            "eta_relative": elapsed / fraction - elapsed if fraction else 0.0,
            "state": {
                "skipped": False,
                "interrupted": bool(job and job.interrupted),
                "job": "muestra" if job else "",
                "job_count": len(jobs.running),
                "job_timestamp": job.timestamp if job else "0",
                "job_no": job.image_index if job else 0,
                "sampling_step": job.step if job else 0,
                "sampling_steps": job.total if job else 0,
            },
            "current_image": base64.b64encode(preview).decode() if preview else None,
            "textinfo": None,
        }

    @app.post("/sdapi/v1/interrupt")
    async def interrupt() -> dict:
        job = jobs.current()
        if job is not None and job.task is not None:
            job.interrupted = True
            job.task.cancel()  # closes the GenerateImage stream: the diffusion loop stops after its current step
        return {}

    @app.get("/sdapi/v1/samplers")
    async def samplers() -> list[dict]:
        listing = await _schedulers(servicer.registry.image_model(""))
        answer = []
        for info in listing:
            name = _display_name(info)
            aliases = [n for n in (info.name, *info.aliases) if n != name]
            answer.append({"name": name, "aliases": aliases, "options": {}})
        return answer

    @app.get("/sdapi/v1/schedulers")
    async def schedulers() -> list[dict]:
        return SCHEDULER_LISTING

    @app.get("/sdapi/v1/options")
    async def options() -> dict:
        return {"sd_model_checkpoint": _model(servicer, jobs.checkpoint).name}

    @app.post("/sdapi/v1/options")
    async def set_options(http: Request) -> None:
        body = await _body(http, dict[str, Any])
        unknown = sorted(set(body) - {"sd_model_checkpoint"})
        if unknown:
            raise A1111Error(400, f"{', '.join(unknown)}: only sd_model_checkpoint can be set here")
        if "sd_model_checkpoint" in body:
            jobs.checkpoint = _model(servicer, str(body["sd_model_checkpoint"])).name

    @app.get("/sdapi/v1/sd-models")
    async def sd_models() -> list[dict]:
        return [
            {"title": m.name, "model_name": m.name, "hash": None, "sha256": None, "filename": m.name, "config": None}
            for m in servicer.registry.image.values()
        ]

    @app.get("/sdapi/v1/loras")
    async def loras() -> list[dict]:
        model = servicer.registry.image_model("")
        try:
            reply = await model.stub.ListLoras(diffusion_pb2.ListLorasRequest(), timeout=LIST_TIMEOUT_S)
        except grpc.aio.AioRpcError as exc:
            raise _unanswered(model, exc) from None
        return [{"name": lora.name, "alias": lora.name, "path": lora.file, "metadata": {}} for lora in reply.loras]

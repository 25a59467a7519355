"""The /sdapi/v1 routes, and the A1111 jobs of this gateway that /progress and /interrupt see."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import dataclasses
import json
import time
from typing import Annotated, Any

import grpc
from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse

from muestra.gateway.engine.clients import DiffusionClient
from muestra.gateway.engine.engine import Engine
from muestra.gateway.http.a1111 import infotext, sizes
from muestra.gateway.http.a1111.convert import (
    LIST_TIMEOUT_S,
    RENAMES,
    display_name,
    image_model,
    image_request,
    info,
    list_schedulers,
    parameters,
    unanswered,
)
from muestra.gateway.http.a1111.schemas import A1111Error, Img2ImgRequest, Txt2ImgRequest, read_body
from muestra.gateway.http.errors import from_muestra
from muestra.gateway.http.state import EngineDep
from muestra.gateway.http.streams import ClientGone, cancel_on_disconnect
from muestra.runtime.errors import MuestraError
from muestra.v1 import diffusion_pb2

# GET /sdapi/v1/schedulers: the two A1111 schedulers convert.A1111_SCHEDULERS reads, as A1111 lists them.
SCHEDULER_LISTING = [
    {"name": "automatic", "label": "Automatic", "aliases": None, "default_rho": -1, "need_inner_model": False},
    {"name": "karras", "label": "Karras", "aliases": None, "default_rho": 7.0, "need_inner_model": False},
]


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


async def _jobs(request: Request) -> Jobs:
    return request.app.state.a1111_jobs


A1111Jobs = Annotated[Jobs, Depends(_jobs)]
router = APIRouter(prefix="/sdapi/v1")


async def a1111_error(request: Request, exc: A1111Error) -> JSONResponse:
    """The exception handler for A1111Error: A1111's {"detail": ...}."""
    return JSONResponse({"detail": exc.detail}, status_code=exc.status, headers=exc.headers)


async def _generate(engine: Engine, body: Txt2ImgRequest, jobs: Jobs, http: Request) -> JSONResponse:
    """txt2img and img2img: the images, the parameters as used and the `info` as a JSON string."""
    request, plan = await image_request(engine, body, jobs.checkpoint)
    job = Job(images=request.num_images)
    images: list[diffusion_pb2.GeneratedImage] = []

    async def collect() -> None:
        async with contextlib.aclosing(engine.generate_image(request)) as stream:
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
    try:
        names = infotext.a1111_names(await list_schedulers(image_model(engine, request.model)))
    except A1111Error:  # the images are made: they keep the service's sampler name rather than being lost
        names = {}
    images = [infotext.renamed_image(image, names) for image in images]
    if plan.resized:
        images = await asyncio.to_thread(lambda: [sizes.resize(image, plan) for image in images])
    used = info(body, request, plan, images, job)
    return JSONResponse({
        "images": [base64.b64encode(image.png).decode() for image in images] if body.send_images else [],
        "parameters": parameters(body, used),
        "info": json.dumps(used),
    })  # fmt: skip


@router.post("/txt2img")
async def txt2img(http: Request, engine: EngineDep, jobs: A1111Jobs) -> JSONResponse:
    return await _generate(engine, await read_body(http, Txt2ImgRequest), jobs, http)


@router.post("/img2img")
async def img2img(http: Request, engine: EngineDep, jobs: A1111Jobs) -> JSONResponse:
    return await _generate(engine, await read_body(http, Img2ImgRequest), jobs, http)


@router.get("/progress")
async def progress(jobs: A1111Jobs, skip_current_image: bool = False) -> dict:
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


@router.post("/interrupt")
async def interrupt(jobs: A1111Jobs) -> dict:
    job = jobs.current()
    if job is not None and job.task is not None:
        job.interrupted = True
        job.task.cancel()  # closes the GenerateImage stream: the diffusion loop stops after its current step
    return {}


@router.post("/skip")
async def skip(jobs: A1111Jobs) -> None:
    """A1111 skips the current image and goes on with the batch; one GenerateImage stream cannot go on after
    a cancel, so here skip stops the current job as /interrupt does (answered with A1111's null)."""
    await interrupt(jobs)


@router.get("/samplers")
async def samplers(engine: EngineDep) -> list[dict]:
    listing = await list_schedulers(engine.registry.image_model(""))
    answer = []
    for scheduler in listing:
        name = display_name(scheduler)
        aliases = [n for n in (scheduler.name, *scheduler.aliases) if n != name]
        answer.append({"name": name, "aliases": aliases, "options": {}})
    return answer


@router.get("/schedulers")
async def schedulers() -> list[dict]:
    return SCHEDULER_LISTING


@router.get("/options")
async def options(engine: EngineDep, jobs: A1111Jobs) -> dict:
    return {"sd_model_checkpoint": image_model(engine, jobs.checkpoint).name}


@router.post("/options")
async def set_options(http: Request, engine: EngineDep, jobs: A1111Jobs) -> None:
    body = await read_body(http, dict[str, Any])
    unknown = sorted(set(body) - {"sd_model_checkpoint"})
    if unknown:
        raise A1111Error(400, f"{', '.join(unknown)}: only sd_model_checkpoint can be set here")
    if "sd_model_checkpoint" in body:
        jobs.checkpoint = image_model(engine, str(body["sd_model_checkpoint"])).name


@router.get("/sd-models")
async def sd_models(engine: EngineDep) -> list[dict]:
    return [
        {"title": m.name, "model_name": m.name, "hash": None, "sha256": None, "filename": m.name, "config": None}
        for m in engine.registry.image.values()
    ]


@router.get("/loras")
async def loras(engine: EngineDep) -> list[dict]:
    model = engine.registry.image_model("")
    try:
        loras = await DiffusionClient(model, LIST_TIMEOUT_S).loras()
    except grpc.aio.AioRpcError as exc:
        raise unanswered(model, exc) from None
    return [{"name": lora.name, "alias": lora.name, "path": lora.file, "metadata": {}} for lora in loras]

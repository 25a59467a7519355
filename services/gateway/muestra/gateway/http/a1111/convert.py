"""An A1111 body as the gateway's ImageRequest, and the generated images as A1111's `info` object."""

from __future__ import annotations

import base64
import binascii

import grpc

from muestra.gateway.engine.clients import DiffusionClient
from muestra.gateway.engine.engine import Engine
from muestra.gateway.http.a1111 import sizes
from muestra.gateway.http.a1111.schemas import OFF_FEATURES, A1111Error, Img2ImgRequest, Txt2ImgRequest
from muestra.runtime.errors import MuestraError
from muestra.v1 import diffusion_pb2

LIST_TIMEOUT_S = 5.0
# A1111's schedulers (its "Schedule type") that name one of ours together with the sampler.
A1111_SCHEDULERS = {"automatic": "", "karras": "Karras"}
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


def decode_b64(field: str, text: str) -> bytes:
    """A1111 clients send bare base64 or a data URL."""
    if text.startswith("data:") and "," in text:
        text = text.split(",", 1)[1]
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise A1111Error(400, f"{field}: not valid base64 image data") from None


def display_name(info: diffusion_pb2.SchedulerInfo) -> str:
    """The A1111 name of a scheduler: its first alias that reads like one ("Euler a", "DPM++ 2M Karras")."""
    for alias in info.aliases:
        if alias[:1].isupper() and not alias.endswith("Scheduler"):
            return alias
    return info.name


async def list_schedulers(model) -> list[diffusion_pb2.SchedulerInfo]:
    try:
        return await DiffusionClient(model, LIST_TIMEOUT_S).schedulers()
    except grpc.aio.AioRpcError as exc:
        raise unanswered(model, exc) from None


async def describe(model) -> diffusion_pb2.DescribeDiffusionResponse:
    try:
        return await DiffusionClient(model, LIST_TIMEOUT_S).describe()
    except grpc.aio.AioRpcError as exc:
        raise unanswered(model, exc) from None


def unanswered(model, exc: grpc.aio.AioRpcError) -> A1111Error:
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
    schedulers = await list_schedulers(model)
    for info in schedulers:
        if wanted.lower() in {n.lower() for n in (info.name, *info.aliases)}:
            return info.name
    known = ", ".join(display_name(info) for info in schedulers)
    raise A1111Error(404, f"Sampler not found: {wanted!r}; known: {known}")


def _check_off(body: Txt2ImgRequest) -> None:
    for field, feature in OFF_FEATURES:
        if getattr(body, field):
            raise A1111Error(400, f"{field}: muestra has no {feature}; leave it off")
    settings = dict(body.override_settings or {})
    settings.pop("sd_model_checkpoint", None)
    if settings:
        raise A1111Error(400, f"override_settings: only sd_model_checkpoint is supported, got {', '.join(settings)}")


def image_model(engine: Engine, checkpoint: str):
    """The image model a checkpoint name picks (empty: the gateway's default); A1111's 404 when none does."""
    try:
        return engine.registry.image_model(checkpoint)
    except MuestraError as exc:
        raise A1111Error(404, f"Model not found: {exc}") from None


async def image_request(
    engine: Engine, body: Txt2ImgRequest, checkpoint: str
) -> tuple[diffusion_pb2.ImageRequest, sizes.Plan]:
    """The request for the diffusion service, and the size plan (sizes.py) its images are resized by."""
    _check_off(body)
    model = image_model(engine, (body.override_settings or {}).get("sd_model_checkpoint") or checkpoint)
    plan = sizes.plan(body.width or 0, body.height or 0, await describe(model))
    request = diffusion_pb2.ImageRequest(
        model=model.name,
        prompt=body.prompt,
        negative_prompt=body.negative_prompt,
        width=plan.width,
        height=plan.height,
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
    return request, plan


def _image_fields(body: Img2ImgRequest, request: diffusion_pb2.ImageRequest) -> None:
    if len(body.init_images) > 1:
        raise A1111Error(400, f"init_images: only one image is supported, got {len(body.init_images)}")
    if body.resize_mode != 0:
        raise A1111Error(400, f"resize_mode: only 0 (just resize) is supported, got {body.resize_mode}")
    request.init_image = decode_b64("init_images[0]", body.init_images[0])
    request.strength = body.denoising_strength
    if not body.mask:
        return
    request.mask_image = decode_b64("mask", body.mask)
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


def info(body: Txt2ImgRequest, request, plan: sizes.Plan, images: list, job) -> dict:
    """The `info` object A1111 returns (as a JSON string), with the values the service used: its own defaults
    where the body left a field out, and the size of the images returned."""
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
        "width": first.width if first else plan.out_width,
        "height": first.height if first else plan.out_height,
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
        "extra_generation_params": sizes.infotext_pairs(plan) if plan.resized else {},
        "index_of_first_image": 0,
        "infotexts": [image.parameters for image in images],
        "styles": [],
        "job_timestamp": job.timestamp,
        "clip_skip": 1,
        "is_using_inpainting_conditioning": False,
        "version": "muestra",
        "interrupted": job.interrupted,
    }


# The `parameters` fields a client may leave out, echoed as the service used them (A1111 echoes its defaults).
USED = ("seed", "sampler_name", "steps", "cfg_scale", "width", "height")


def parameters(body: Txt2ImgRequest, used: dict) -> dict:
    """The body as A1111 echoes it in `parameters`, with the values used where the client left them out."""
    echoed = body.model_dump()
    echoed.update({field: used[field] for field in USED})
    echoed["scheduler"] = body.scheduler or "automatic"
    if isinstance(body, Img2ImgRequest) and not body.include_init_images:
        echoed.update(init_images=None, mask=None)
    return echoed

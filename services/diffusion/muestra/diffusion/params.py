"""An ImageRequest checked against the service's limits, with defaults filled in."""

from __future__ import annotations

import dataclasses
import math
import secrets
from typing import Any

from google.protobuf import json_format, struct_pb2
from PIL import Image

from muestra.diffusion.input_images import InputLimits, open_image, read_mask
from muestra.diffusion.loras import LoraFile, LoraFolder, split_prompt_loras
from muestra.diffusion.registry import SchedulerEntry, SchedulerRegistry
from muestra.runtime.errors import InvalidArgument, NotFound, check_limit
from muestra.v1 import diffusion_pb2

MAX_SEED = 2**64 - 1
MAX_EXTRA_BYTES = 16 * 1024
EXTRA_KEYS = ("scheduler",)
# A1111's largest mask blur.
MAX_MASK_BLUR = 64
# The largest LoRA weight either way; A1111 users go up to about 2.
MAX_LORA_WEIGHT = 10.0


@dataclasses.dataclass(frozen=True)
class Limits:
    min_size: int
    max_width: int
    max_height: int
    max_steps: int
    max_images: int
    max_prompt_bytes: int
    # The size the model was trained at, and how many times its side a request may ask (0: any).
    native_width: int = 0
    native_height: int = 0
    max_size_factor: float = 0.0
    # init_image and mask_image: encoded bytes, and decoded pixels.
    max_input_image_bytes: int = 16 * 1024 * 1024
    max_input_image_pixels: int = 4096 * 4096
    # Most LoRA adapters per request.
    max_loras: int = 0


@dataclasses.dataclass(frozen=True)
class Defaults:
    model: str
    width: int
    height: int
    steps: int
    guidance_scale: float
    # The pipelines' own default strengths.
    img2img_strength: float = 0.8
    inpaint_strength: float = 1.0
    # What the folder can do: an inpainting folder only inpaints.
    tasks: tuple[str, ...] = ("txt2img", "img2img", "inpaint")


@dataclasses.dataclass(frozen=True)
class GenerationParams:
    """An ImageRequest parsed and checked once; the worker and the engine take it as it is."""

    prompt: str
    negative_prompt: str
    width: int
    height: int
    steps: int
    guidance_scale: float
    # Image i is made from seed + i.
    seed: int
    num_images: int
    # The registered scheduler, or one standing for the pipeline's own.
    sampler: SchedulerEntry
    # Overrides of the scheduler's config, from extra["scheduler"].
    scheduler_options: dict[str, Any]
    preview_every: int
    # img2img with init_image (already width x height), inpainting with mask_image as well ("L", same size).
    init_image: Image.Image | None = None
    mask_image: Image.Image | None = None
    strength: float = 1.0
    invert_mask: bool = False
    mask_blur: int = 0
    padding_mask_crop: int | None = None
    # LoRA adapters and their weights, from `loras` and the prompt's <lora:name:weight> tags.
    loras: tuple[tuple[LoraFile, float], ...] = ()

    @property
    def seeds(self) -> list[int]:
        return [self.seed + i for i in range(self.num_images)]

    @property
    def task(self) -> str:
        """The task: txt2img, img2img (init_image) or inpaint (init_image and mask_image)."""
        if self.init_image is None:
            return "txt2img"
        return "img2img" if self.mask_image is None else "inpaint"

    @property
    def denoise_steps(self) -> int:
        """The steps the pipeline runs: img2img and inpainting run the last int(steps * strength)."""
        return self.steps if self.init_image is None else min(int(self.steps * self.strength), self.steps)


def _check_text(field: str, text: str, limit: int) -> None:
    size = len(text.encode("utf-8"))
    if size > limit:
        raise InvalidArgument(field, f"is {size} bytes; the limit is {limit} bytes")


def _check_size(field: str, value: int, native: int, limits: Limits, high: int) -> int:
    """A side: a multiple of 8, from --min-size to the lower of `high` (--max-width/--max-height) and
    --max-size-factor times the model's trained size (a side far above it costs minutes and draws tiled
    nonsense). The message names the limit that applies, and why."""
    if value % 8:
        raise InvalidArgument(field, f"must be a multiple of 8, got {value}")
    factor = limits.max_size_factor
    why = ""
    if factor > 0 and native and native * factor < high:
        high = int(native * factor)
        why = (
            f": at most {factor:g}x the {limits.native_width}x{limits.native_height} the model was trained at (at "
            f"most {high} here; the service's --max-size-factor sets this)"
        )
    if not (limits.min_size <= value <= high):
        reason = why if value > high else ""
        raise InvalidArgument(field, f"must be between {limits.min_size} and {high}, got {value}{reason}")
    return value


def _check_finite(field: str, value: struct_pb2.Struct | struct_pb2.ListValue | struct_pb2.Value) -> None:
    """InvalidArgument naming the first NaN or infinity in a Struct (JSON, and so MessageToDict, has none)."""
    if isinstance(value, struct_pb2.Struct):
        for key, item in value.fields.items():
            _check_finite(f"{field}.{key}", item)
    elif isinstance(value, struct_pb2.ListValue):
        for i, item in enumerate(value.values):
            _check_finite(f"{field}[{i}]", item)
    elif value.WhichOneof("kind") == "number_value" and not math.isfinite(value.number_value):
        raise InvalidArgument(field, f"must be a finite number, got {value.number_value}")
    elif value.WhichOneof("kind") in ("struct_value", "list_value"):
        _check_finite(field, getattr(value, value.WhichOneof("kind")))


def _scheduler_options(request: diffusion_pb2.ImageRequest) -> dict[str, Any]:
    if not request.HasField("extra"):
        return {}
    if request.extra.ByteSize() > MAX_EXTRA_BYTES:
        raise InvalidArgument("extra", f"is {request.extra.ByteSize()} bytes; the limit is {MAX_EXTRA_BYTES} bytes")
    _check_finite("extra", request.extra)
    extra = json_format.MessageToDict(request.extra)
    unknown = sorted(set(extra) - set(EXTRA_KEYS))
    if unknown:
        raise InvalidArgument("extra", f"unknown key {unknown[0]!r}; known: {', '.join(EXTRA_KEYS)}")
    options = extra.get("scheduler", {})
    if not isinstance(options, dict):
        raise InvalidArgument("extra.scheduler", "must be a struct of scheduler config options")
    return options


def _typed_options(entry_name: str, config: dict[str, Any], options: dict[str, Any]) -> dict[str, Any]:
    """Options coerced to the types of the scheduler's own config (a Struct carries every number as a float)."""
    typed = {}
    for key, value in options.items():
        field = f"extra.scheduler.{key}"
        if key not in config or key.startswith("_"):
            known = ", ".join(sorted(k for k in config if not k.startswith("_")))
            raise InvalidArgument(field, f"not an option of sampler {entry_name!r}; its options: {known}")
        current = config[key]
        if isinstance(current, bool) or current is None or isinstance(current, str):
            if current is not None and not isinstance(value, type(current)):
                raise InvalidArgument(field, f"must be a {type(current).__name__}, got {value!r}")
        elif isinstance(current, int):
            if isinstance(value, bool) or not isinstance(value, float | int) or value != int(value):
                raise InvalidArgument(field, f"must be an integer, got {value!r}")
            value = int(value)
        elif isinstance(current, float):
            if isinstance(value, bool) or not isinstance(value, float | int) or not math.isfinite(value):
                raise InvalidArgument(field, f"must be a finite number, got {value!r}")
            value = float(value)
        else:
            raise InvalidArgument(field, "cannot be overridden")
        typed[key] = value
    return typed


def parse_image_request(
    request: diffusion_pb2.ImageRequest,
    limits: Limits,
    defaults: Defaults,
    registry: SchedulerRegistry,
    default_sampler: SchedulerEntry,
    base_scheduler_config: dict[str, Any],
    lora_folder: LoraFolder | None = None,
) -> GenerationParams:
    """Validate every field (InvalidArgument names the field and its limit) and fill in the defaults."""
    if request.model and request.model != defaults.model:
        raise NotFound(f"model {request.model!r} is not served here; this service serves {defaults.model!r}")
    _check_text("prompt", request.prompt, limits.max_prompt_bytes)
    prompt, loras = _loras(request, limits, lora_folder or LoraFolder(None))
    _check_text("negative_prompt", request.negative_prompt, limits.max_prompt_bytes)
    init = _open_init_image(request, limits)
    default_width, default_height = (defaults.width, defaults.height) if init is None else _multiple_of_8(init)
    # Without width or height, the size comes from init_image: say so when it is the size that is refused.
    width_field = "width" if request.width or init is None else "init_image's width"
    height_field = "height" if request.height or init is None else "init_image's height"
    width = _check_size(width_field, request.width or default_width, limits.native_width, limits, limits.max_width)
    height = _check_size(
        height_field, request.height or default_height, limits.native_height, limits, limits.max_height
    )
    steps = request.steps or defaults.steps
    check_limit("steps", steps, 1, limits.max_steps)
    num_images = request.num_images or 1
    check_limit("num_images", num_images, 1, limits.max_images)
    guidance_scale = request.guidance_scale if request.HasField("guidance_scale") else defaults.guidance_scale
    if not math.isfinite(guidance_scale):
        raise InvalidArgument("guidance_scale", f"must be a finite number between 0 and 50, got {guidance_scale}")
    check_limit("guidance_scale", guidance_scale, 0, 50)
    if request.HasField("seed"):
        seed = request.seed
        check_limit("seed", seed, 0, MAX_SEED - (num_images - 1))
    else:
        seed = secrets.randbelow(2**32)
    sampler = registry.resolve(request.sampler) if request.sampler else default_sampler
    options = _scheduler_options(request)
    if options:
        config = dict(sampler.build(base_scheduler_config).config)
        options = _typed_options(sampler.name, config, options)
    # Let the scheduler check its config and the step count now, rather than fail inside the denoising loop.
    try:
        sampler.build(base_scheduler_config, options).set_timesteps(steps)
    except Exception as exc:  # e.g. an unknown timestep_spacing, or PNDM's PRK warm-up needing 4 steps
        if options:
            raise InvalidArgument("extra.scheduler", f"sampler {sampler.name!r} rejects these options: {exc}") from exc
        raise InvalidArgument("steps", f"sampler {sampler.name!r} cannot run {steps} steps: {exc}") from exc
    init, mask, strength, padding = _image_inputs(request, init, width, height, steps, limits, defaults)
    if "txt2img" not in defaults.tasks and mask is None:
        missing = "init_image" if init is None else "mask_image"
        raise InvalidArgument(missing, f"is required: model {defaults.model!r} is an inpainting model")
    return GenerationParams(
        prompt=prompt,
        negative_prompt=request.negative_prompt,
        width=width,
        height=height,
        steps=steps,
        guidance_scale=float(guidance_scale),
        seed=seed,
        num_images=num_images,
        sampler=sampler,
        scheduler_options=options,
        preview_every=request.preview_every,
        init_image=init,
        mask_image=mask,
        strength=strength,
        invert_mask=request.invert_mask,
        mask_blur=request.mask_blur,
        padding_mask_crop=padding,
        loras=loras,
    )


def _loras(
    request: diffusion_pb2.ImageRequest, limits: Limits, folder: LoraFolder
) -> tuple[str, tuple[tuple[LoraFile, float], ...]]:
    """The prompt without <lora:...> tags, and every adapter asked for, resolved in the folder and checked."""
    prompt, tags = split_prompt_loras(request.prompt)
    asked: list[tuple[str, str, float]] = []  # (field, name, weight)
    for i, lora in enumerate(request.loras):
        weight = lora.weight
        if not math.isfinite(weight):
            raise InvalidArgument(f"loras[{i}].weight", f"must be a finite number, got {weight}")
        check_limit(f"loras[{i}].weight", weight, -MAX_LORA_WEIGHT, MAX_LORA_WEIGHT)
        asked.append((f"loras[{i}].name", lora.name, float(weight)))
    for name, text in tags:
        tag = f"<lora:{name}{':' + text if text else ''}>"
        try:
            weight = float(text) if text else 1.0
        except ValueError:
            raise InvalidArgument("prompt", f"{tag}: the weight must be a number") from None
        if not (math.isfinite(weight) and abs(weight) <= MAX_LORA_WEIGHT):
            raise InvalidArgument(
                "prompt", f"{tag}: the weight must be between {-MAX_LORA_WEIGHT:g} and {MAX_LORA_WEIGHT:g}"
            )
        asked.append(("prompt", name, weight))
    if not asked:
        return prompt, ()
    if len(asked) > limits.max_loras:
        where = "this service has no --lora-dir" if not limits.max_loras else f"the limit is {limits.max_loras}"
        raise InvalidArgument("loras", f"{len(asked)} LoRA adapters asked for; {where}")
    files = folder.files()
    resolved: dict[str, tuple[LoraFile, float]] = {}
    for field, name, weight in asked:
        if name not in files:
            known = ", ".join(files) or "none"
            raise InvalidArgument(field, f"unknown LoRA {name!r}; known: {known}")
        if name in resolved:
            raise InvalidArgument(field, f"LoRA {name!r} is named twice")
        resolved[name] = (files[name], weight)
    return prompt, tuple(resolved.values())


def _multiple_of_8(image: Image.Image) -> tuple[int, int]:
    """init_image's size rounded down to a multiple of 8 (what diffusers' image processor would make of it)."""
    width, height = image.width - image.width % 8, image.height - image.height % 8
    if not width or not height:
        raise InvalidArgument("init_image", f"is {image.width}x{image.height}; each side must be at least 8 pixels")
    return width, height


def _input_limits(limits: Limits) -> InputLimits:
    return InputLimits(max_bytes=limits.max_input_image_bytes, max_pixels=limits.max_input_image_pixels)


def _open_init_image(request: diffusion_pb2.ImageRequest, limits: Limits) -> Image.Image | None:
    """init_image decoded (None without one), after the fields that need it are checked for it."""
    if not request.init_image:
        needs = [
            name
            for name, given in (
                ("strength", request.HasField("strength")),
                ("mask_image", bool(request.mask_image)),
            )
            if given
        ]
        if needs:
            raise InvalidArgument(needs[0], "needs init_image (img2img and inpainting start from an image)")
        return None
    return open_image("init_image", request.init_image, _input_limits(limits))


def _image_inputs(
    request: diffusion_pb2.ImageRequest,
    init: Image.Image | None,
    width: int,
    height: int,
    steps: int,
    limits: Limits,
    defaults: Defaults,
) -> tuple[Image.Image | None, Image.Image | None, float, int | None]:
    """init_image and mask_image resized to width x height, the strength and padding_mask_crop, all checked."""
    mask_options = [
        name
        for name, given in (
            ("mask_from_alpha", request.mask_from_alpha),
            ("invert_mask", request.invert_mask),
            ("mask_blur", request.mask_blur > 0),
            ("padding_mask_crop", request.HasField("padding_mask_crop")),
        )
        if given
    ]
    if not request.mask_image and mask_options:
        raise InvalidArgument(mask_options[0], "needs mask_image (it is an inpainting option)")
    if init is None:
        return None, None, 1.0, None
    mask = None
    if request.mask_image:
        mask = read_mask(request.mask_image, _input_limits(limits), request.mask_from_alpha, request.invert_mask)
        if mask.size != init.size:
            raise InvalidArgument(
                "mask_image",
                f"is {mask.width}x{mask.height}; it must be the size of init_image, {init.width}x{init.height}",
            )
    check_limit("mask_blur", request.mask_blur, 0, MAX_MASK_BLUR)
    padding = request.padding_mask_crop if request.HasField("padding_mask_crop") else None
    if padding is not None:
        check_limit("padding_mask_crop", padding, 0, max(width, height))
    default_strength = defaults.img2img_strength if mask is None else defaults.inpaint_strength
    strength = request.strength if request.HasField("strength") else default_strength
    if not (math.isfinite(strength) and 0 < strength <= 1):
        raise InvalidArgument("strength", f"must be in (0, 1], got {strength}")
    if int(steps * strength) < 1:
        raise InvalidArgument(
            "strength", f"{strength:g} of {steps} steps leaves int(steps * strength) = 0 steps to run; raise either"
        )
    init = init.convert("RGB")
    if init.size != (width, height):  # A1111's "Just resize", with the resampling diffusers' processor uses
        init = init.resize((width, height), Image.LANCZOS)
        mask = mask.resize((width, height), Image.LANCZOS) if mask is not None else None
    return init, mask, float(strength), padding

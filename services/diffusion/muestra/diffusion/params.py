"""An ImageRequest checked against the service's limits, with defaults filled in."""

from __future__ import annotations

import dataclasses
import math
import secrets
from typing import Any

from google.protobuf import json_format, struct_pb2

from muestra.diffusion.registry import SchedulerEntry, SchedulerRegistry
from muestra.runtime.errors import InvalidArgument, NotFound, check_limit
from muestra.v1 import diffusion_pb2

MAX_SEED = 2**64 - 1
MAX_EXTRA_BYTES = 16 * 1024
EXTRA_KEYS = ("scheduler",)


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


@dataclasses.dataclass(frozen=True)
class Defaults:
    model: str
    width: int
    height: int
    steps: int
    guidance_scale: float


@dataclasses.dataclass(frozen=True)
class GenerationParams:
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

    @property
    def seeds(self) -> list[int]:
        return [self.seed + i for i in range(self.num_images)]


def _check_text(field: str, text: str, limit: int) -> None:
    size = len(text.encode("utf-8"))
    if size > limit:
        raise InvalidArgument(field, f"is {size} bytes; the limit is {limit} bytes")


def _check_size(field: str, value: int, default: int, low: int, high: int) -> int:
    if value == 0:
        return default
    if value % 8:
        raise InvalidArgument(field, f"must be a multiple of 8, got {value}")
    check_limit(field, value, low, high)
    return value


def _check_native(field: str, value: int, native: int, limits: Limits) -> None:
    """A side far above the model's training size costs minutes and draws tiled nonsense: refuse it."""
    factor = limits.max_size_factor
    if factor > 0 and native and value > native * factor:
        raise InvalidArgument(
            field,
            f"{value} is more than {factor:g}x the {limits.native_width}x{limits.native_height} the model was "
            f"trained at (at most {int(native * factor)} here; the service's --max-size-factor sets this)",
        )


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
) -> GenerationParams:
    """Validate every field (InvalidArgument names the field and its limit) and fill in the defaults."""
    if request.model and request.model != defaults.model:
        raise NotFound(f"model {request.model!r} is not served here; this service serves {defaults.model!r}")
    _check_text("prompt", request.prompt, limits.max_prompt_bytes)
    _check_text("negative_prompt", request.negative_prompt, limits.max_prompt_bytes)
    width = _check_size("width", request.width, defaults.width, limits.min_size, limits.max_width)
    height = _check_size("height", request.height, defaults.height, limits.min_size, limits.max_height)
    _check_native("width", width, limits.native_width, limits)
    _check_native("height", height, limits.native_height, limits)
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
    return GenerationParams(
        prompt=request.prompt,
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
    )

"""The gRPC surface of the diffusion service: muestra.v1.Diffusion."""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path

import grpc

from muestra.diffusion.config import DiffusionConfig
from muestra.diffusion.embeddings import RedisTextEmbeddingCache
from muestra.diffusion.engine import DiffusionEngine
from muestra.diffusion.loras import LoraFolder
from muestra.diffusion.params import Defaults, Limits, parse_image_request
from muestra.diffusion.registry import SchedulerRegistry, load_scheduler_registry
from muestra.diffusion.worker import GenerationWorker
from muestra.runtime import ServiceSpec
from muestra.runtime.cache_mac import CacheMac
from muestra.v1 import diffusion_pb2, diffusion_pb2_grpc

log = logging.getLogger("muestra.diffusion")
SERVICE_NAME = diffusion_pb2.DESCRIPTOR.services_by_name["Diffusion"].full_name


# Below this many UNet parameters, one torch thread is faster than several: the tensors are too small
# to split, and idle threads spinning against other processes on the same cores cost far more (the
# 1.5M-parameter default image model: 0.75 s an image with one thread, 38-88 s with torch's default
# two on a 2-core machine shared with the lm service).
SMALL_UNET_PARAMETERS = 20_000_000


def torch_threads(configured: int, engine: DiffusionEngine) -> int:
    """The torch threads to run with: --torch-threads when set, else 1 for a small UNet, else torch's default."""
    if configured > 0:
        return configured
    if engine.device.type != "cpu":
        return 0
    parameters = engine.unet_parameters
    if parameters < SMALL_UNET_PARAMETERS:
        log.info("torch threads: 1 (a UNet of %.1fM parameters runs fastest on one thread)", parameters / 1e6)
        return 1
    return 0


class DiffusionServicer(diffusion_pb2_grpc.DiffusionServicer):
    def __init__(self, engine: DiffusionEngine, registry: SchedulerRegistry, config: DiffusionConfig) -> None:
        self.engine = engine
        self.registry = registry
        self.lora_folder = LoraFolder(config.lora_dir or None)
        self.limits = Limits(
            # The model's own default size is always allowed (a small model may be trained below --min-size).
            min_size=min(config.min_size, engine.default_width, engine.default_height),
            max_width=config.max_width,
            max_height=config.max_height,
            max_steps=config.max_steps,
            max_images=config.max_images,
            max_prompt_bytes=config.max_prompt_bytes,
            native_width=engine.default_width,
            native_height=engine.default_height,
            max_size_factor=config.max_size_factor,
            max_input_image_bytes=config.max_input_image_bytes,
            max_input_image_pixels=config.max_input_image_pixels,
            max_loras=config.max_loras if config.lora_dir else 0,
        )
        self.defaults = Defaults(
            model=engine.name,
            width=engine.default_width,
            height=engine.default_height,
            steps=min(config.default_steps or engine.default_steps, config.max_steps),
            guidance_scale=(
                config.default_guidance_scale if config.default_guidance_scale >= 0 else engine.default_guidance_scale
            ),
            img2img_strength=engine.img2img_strength,
            inpaint_strength=engine.inpaint_strength,
            tasks=engine.tasks,
        )
        self.default_sampler = registry.model_default(engine.base_scheduler)
        self.worker = GenerationWorker(engine, config.max_queue, torch_threads(config.torch_threads, engine))

    async def Describe(self, request, context):
        return diffusion_pb2.DescribeDiffusionResponse(
            model=self.engine.name,
            device=self.engine.device.type,
            dtype=str(self.engine.dtype).removeprefix("torch."),
            pipeline=self.engine.pipeline_class,
            default_width=self.defaults.width,
            default_height=self.defaults.height,
            max_width=self.limits.max_width,
            max_height=self.limits.max_height,
            max_steps=self.limits.max_steps,
            max_images=self.limits.max_images,
            max_input_image_bytes=self.limits.max_input_image_bytes,
            max_input_image_pixels=self.limits.max_input_image_pixels,
            max_loras=self.limits.max_loras,
            max_size_factor=self.limits.max_size_factor,
        )

    async def ListSchedulers(self, request, context):
        return diffusion_pb2.ListSchedulersResponse(
            schedulers=[
                diffusion_pb2.SchedulerInfo(
                    name=entry.name,
                    aliases=entry.aliases,
                    plugin=entry.plugin,
                    distribution=entry.distribution,
                    version=entry.version,
                )
                for entry in self.registry.entries()
            ]
        )

    async def ListLoras(self, request, context):
        files = await asyncio.to_thread(self.lora_folder.files)
        return diffusion_pb2.ListLorasResponse(
            loras=[
                diffusion_pb2.LoraInfo(name=f.name, file=f.path.name, size_bytes=f.size_bytes) for f in files.values()
            ]
        )

    async def Generate(self, request, context):
        started = time.perf_counter()
        # Off the event loop: decoding an init or mask image takes a while, and other streams are running.
        params = await asyncio.to_thread(
            parse_image_request,
            request,
            self.limits,
            self.defaults,
            self.registry,
            self.default_sampler,
            self.engine.base_scheduler_config,
            self.lora_folder,
        )
        generation = self.worker.submit(params, started)
        log.info(
            "generate %s %dx%d steps=%d sampler=%s images=%d seed=%d loras=%s",
            params.task, params.width, params.height, params.steps, params.sampler.name, params.num_images, params.seed,
            ",".join(f"{lora.name}:{weight:g}" for lora, weight in params.loras) or "-",
        )  # fmt: skip
        try:
            async for response in generation.events():
                yield response
        finally:
            # The client went away (or the stream failed): the loop stops after its current step.
            generation.cancel()


def build_service(config: DiffusionConfig) -> ServiceSpec:
    """Load the model and the scheduler plugins, and describe the service to the runtime."""
    engine = DiffusionEngine.load(config.model, config.model_name, config.device, config.dtype)
    if config.redis_url:
        cache = RedisTextEmbeddingCache(
            config.redis_url, config.text_embedding_ttl_s, CacheMac(config.cache_key, "text-embedding cache"),
            timeout_s=config.redis_timeout_s, password=config.redis_password,
        )  # fmt: skip
        engine.use_embedding_cache(cache, config.model)
    if config.lora_dir:
        if not Path(config.lora_dir).is_dir():
            raise SystemExit(f"--lora-dir {config.lora_dir}: not a folder")
        engine.use_loras(max(config.lora_cache_size, config.max_loras))
    registry = load_scheduler_registry()
    registry.keep_buildable(engine.base_scheduler_config)
    servicer = DiffusionServicer(engine, registry, config)

    async def register(server: grpc.aio.Server) -> list[str]:
        diffusion_pb2_grpc.add_DiffusionServicer_to_server(servicer, server)
        return [SERVICE_NAME]

    async def close() -> None:
        await asyncio.to_thread(servicer.worker.close)

    return ServiceSpec(name="diffusion", register=register, close=close)

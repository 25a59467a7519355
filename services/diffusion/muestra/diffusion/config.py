"""The diffusion service's settings."""

from __future__ import annotations

import dataclasses

from muestra.runtime import ServiceConfig
from muestra.runtime.config import RedisConfig, secret


@dataclasses.dataclass
class DiffusionConfig(ServiceConfig, RedisConfig):
    model: str = dataclasses.field(
        default="", metadata={"help": "diffusers Stable Diffusion folder (model_index.json, unet/, vae/, ...)"}
    )
    model_name: str = dataclasses.field(
        default="", metadata={"help": "name the model is served under (default: the folder's name)"}
    )
    device: str = dataclasses.field(default="auto", metadata={"help": "auto, cpu or cuda"})
    dtype: str = dataclasses.field(
        default="auto", metadata={"help": "auto (float16 on cuda, float32 on cpu), float16, bfloat16 or float32"}
    )
    torch_threads: int = dataclasses.field(
        default=0,
        metadata={"help": "torch intra-op threads (0: 1 for a UNet under 20M parameters on CPU, else torch's default)"},
    )
    default_steps: int = dataclasses.field(
        default=0, metadata={"help": "steps when a request gives 0 (0: the pipeline's own default, 50)"}
    )
    default_guidance_scale: float = dataclasses.field(
        default=-1.0,
        metadata={"help": "guidance_scale when a request gives none (negative: the pipeline's own, 7.5 SD, 5 SDXL)"},
    )
    min_size: int = dataclasses.field(default=64, metadata={"help": "smallest width or height in pixels"})
    max_width: int = dataclasses.field(default=2048, metadata={"help": "largest width in pixels"})
    max_height: int = dataclasses.field(default=2048, metadata={"help": "largest height in pixels"})
    max_size_factor: float = dataclasses.field(
        default=4.0,
        metadata={"help": "largest width or height as a multiple of the model's trained size (0: no such limit)"},
    )
    max_steps: int = dataclasses.field(default=150, metadata={"help": "most denoising steps per image"})
    max_images: int = dataclasses.field(default=8, metadata={"help": "most images per request"})
    max_prompt_bytes: int = dataclasses.field(
        default=4096, metadata={"help": "longest prompt or negative_prompt, in UTF-8 bytes"}
    )
    max_input_image_bytes: int = dataclasses.field(
        default=16 * 1024 * 1024, metadata={"help": "largest init_image or mask_image, in encoded bytes"}
    )
    max_input_image_pixels: int = dataclasses.field(
        default=4096 * 4096,
        metadata={"help": "largest init_image or mask_image, in pixels (checked before the image is decoded)"},
    )
    lora_dir: str = dataclasses.field(
        default="", metadata={"help": "folder of LoRA adapters (*.safetensors, diffusers or kohya format; empty: none)"}
    )
    max_loras: int = dataclasses.field(default=4, metadata={"help": "most LoRA adapters one request may apply"})
    lora_cache_size: int = dataclasses.field(
        default=8, metadata={"help": "LoRA adapters kept loaded between requests (at least --max-loras)"}
    )
    max_queue: int = dataclasses.field(
        default=16, metadata={"help": "requests that may wait while one runs; more get RESOURCE_EXHAUSTED"}
    )
    cache_key: str = secret(
        "",
        "secret that keys the MAC on cached text embeddings; replicas sharing a Redis need the same one "
        "(empty: a random key per process)",
    )
    text_embedding_ttl_s: int = dataclasses.field(
        default=7 * 24 * 3600, metadata={"help": "seconds a cached text embedding lives in Redis (0: no TTL)"}
    )

"""The diffusion service's settings."""

from __future__ import annotations

import dataclasses

from muestra.runtime import ServiceConfig
from muestra.runtime.config import RedisConfig, secret, setting


@dataclasses.dataclass
class DiffusionConfig(ServiceConfig, RedisConfig):
    model: str = setting("", "diffusers Stable Diffusion folder (model_index.json, unet/, vae/, ...)")
    model_name: str = setting("", "name the model is served under (default: the folder's name)")
    device: str = setting("auto", "auto, cpu or cuda")
    dtype: str = setting("auto", "auto (float16 on cuda, float32 on cpu), float16, bfloat16 or float32")
    torch_threads: int = setting(
        0, "torch intra-op threads (0: 1 for a UNet under 20M parameters on CPU, else torch's default)"
    )
    default_steps: int = setting(0, "steps when a request gives 0 (0: the pipeline's own default, 50)")
    default_guidance_scale: float = setting(
        -1.0, "guidance_scale when a request gives none (negative: the pipeline's own, 7.5 SD, 5 SDXL)"
    )
    min_size: int = setting(64, "smallest width or height in pixels")
    max_width: int = setting(2048, "largest width in pixels")
    max_height: int = setting(2048, "largest height in pixels")
    max_size_factor: float = setting(
        4.0, "largest width or height as a multiple of the model's trained size (0: no such limit)"
    )
    max_steps: int = setting(150, "most denoising steps per image")
    max_images: int = setting(8, "most images per request")
    max_prompt_bytes: int = setting(4096, "longest prompt or negative_prompt, in UTF-8 bytes")
    max_input_image_bytes: int = setting(16 * 1024 * 1024, "largest init_image or mask_image, in encoded bytes")
    max_input_image_pixels: int = setting(
        4096 * 4096, "largest init_image or mask_image, in pixels (checked before the image is decoded)"
    )
    lora_dir: str = setting("", "folder of LoRA adapters (*.safetensors, diffusers or kohya format; empty: none)")
    max_loras: int = setting(4, "most LoRA adapters one request may apply")
    lora_cache_size: int = setting(8, "LoRA adapters kept loaded between requests (at least --max-loras)")
    max_queue: int = setting(16, "requests that may wait while one runs; more get RESOURCE_EXHAUSTED")
    cache_key: str = secret(
        "",
        "secret that keys the MAC on cached text embeddings; replicas sharing a Redis need the same one "
        "(empty: a random key per process)",
    )
    text_embedding_ttl_s: int = setting(7 * 24 * 3600, "seconds a cached text embedding lives in Redis (0: no TTL)")

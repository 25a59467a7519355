"""The pipelines behind the service: a diffusers folder's text-to-image, img2img and inpainting."""

from __future__ import annotations

import inspect
import logging
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import diffusers
import torch
import transformers
from diffusers.utils.torch_utils import randn_tensor
from PIL import Image

from muestra.diffusion.denoised import DenoisedEstimate
from muestra.diffusion.embeddings import TextEmbeddingCache, embedding_key, text_encoder_fingerprint
from muestra.diffusion.loras import LoadedAdapters
from muestra.diffusion.metrics import DENOISE_STEPS
from muestra.diffusion.model_folder import pipeline_class_name
from muestra.diffusion.params import GenerationParams
from muestra.diffusion.preview import service_preview

log = logging.getLogger("muestra.diffusion.engine")

TASKS = ("txt2img", "img2img", "inpaint")
DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}


class GenerationCancelled(Exception):
    """Raised from the step callback to leave the denoising loop."""


# Called after each step with (step, total, latents): the step's estimate of the final latents when previews
# were asked for (the latents between steps are mostly noise), else the latents between steps.
StepCallback = Callable[[int, int, torch.Tensor], None]


def resolve_device(device: str, dtype: str) -> tuple[torch.device, torch.dtype]:
    """Resolve "auto": CUDA with float16 when torch sees a GPU, else the CPU with float32."""
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit(f"--device {device}: torch sees no CUDA device")
    if dtype == "auto":
        dtype = "float16" if device.startswith("cuda") else "float32"
    if dtype not in DTYPES:
        raise SystemExit(f"--dtype {dtype}: expected auto, {', '.join(DTYPES)}")
    return torch.device(device), DTYPES[dtype]


class DiffusionEngine:
    """A loaded diffusers text-to-image pipeline, and img2img and inpainting on the same modules.

    Not thread-safe: one call at a time.
    """

    def __init__(self, pipe: Any, name: str) -> None:
        self.pipe = pipe
        if "Inpaint" in type(pipe).__name__:
            # A dedicated inpainting UNet (9 input channels) cannot denoise without a mask: it only inpaints.
            self.tasks: tuple[str, ...] = ("inpaint",)
            self.img2img, self.inpaint = None, pipe
        else:
            self.tasks = TASKS
            # from_pipe shares every module (UNet, VAE, text encoders) with `pipe`: no second copy of the weights.
            self.img2img = diffusers.AutoPipelineForImage2Image.from_pipe(pipe)
            self.inpaint = diffusers.AutoPipelineForInpainting.from_pipe(pipe)
            for task_pipe in (self.img2img, self.inpaint):
                task_pipe.set_progress_bar_config(disable=True)
        self.name = name
        self.device: torch.device = pipe.device
        self.dtype: torch.dtype = pipe.unet.dtype
        self.pipeline_class = type(pipe).__name__
        self.unet_parameters = sum(p.numel() for p in pipe.unet.parameters())
        self.preview = service_preview(pipe.vae)  # the published factors of SD's VAEs, else a decode by this one
        # Every request builds a fresh scheduler from the model's own config; keep a pristine copy of it.
        self.base_scheduler = pipe.scheduler
        self.base_scheduler_config = dict(pipe.scheduler.config)
        default = pipe.unet.config.sample_size * pipe.vae_scale_factor
        self.default_width = self.default_height = int(default)
        call = inspect.signature(type(pipe).__call__).parameters
        self.default_steps = int(call["num_inference_steps"].default)
        self.default_guidance_scale = float(call["guidance_scale"].default)
        img2img = type(self.img2img or self.inpaint)
        self.img2img_strength = float(inspect.signature(img2img.__call__).parameters["strength"].default)
        self.inpaint_strength = float(inspect.signature(type(self.inpaint).__call__).parameters["strength"].default)
        self.embedding_cache: TextEmbeddingCache | None = None
        self.adapters: LoadedAdapters | None = None
        self._fingerprint = b""

    def use_loras(self, cache_size: int) -> None:
        """Accept LoRA adapters, keeping at most `cache_size` loaded (in the UNet and text encoders all tasks share)."""
        self.adapters = LoadedAdapters(self.pipe, cache_size)

    def use_embedding_cache(self, cache: TextEmbeddingCache, folder: str | Path) -> None:
        """Look up text-encoder outputs in `cache` (Stable Diffusion 1.x/2.x only; SDXL encodes as usual)."""
        if self.pipeline_class != "StableDiffusionPipeline":
            log.info("text-embedding cache not used: %s has two text encoders and pooled outputs", self.pipeline_class)
            return
        self._fingerprint = text_encoder_fingerprint(Path(folder), self.dtype, self.device)
        self.embedding_cache = cache

    def _text_embeddings(self, text: str) -> torch.Tensor:
        """The text encoder's output for `text`, exactly as the pipeline computes it, through the cache."""
        tokenizer = self.pipe.tokenizer
        ids = tokenizer(text, padding="max_length", max_length=tokenizer.model_max_length, truncation=True).input_ids
        key = embedding_key(self._fingerprint, ids)
        cached = self.embedding_cache.get(key)
        if cached is not None:
            return cached.to(self.device)
        embeddings, _ = self.pipe.encode_prompt(text, self.device, 1, False)
        self.embedding_cache.put(key, embeddings)
        return embeddings

    @classmethod
    def load(cls, path: str | Path, name: str = "", device: str = "auto", dtype: str = "auto") -> DiffusionEngine:
        """Load a local diffusers folder; never touches the network."""
        folder = Path(path)
        class_name = pipeline_class_name(folder)
        pipeline_cls = getattr(diffusers, class_name)
        torch_device, torch_dtype = resolve_device(device, dtype)
        kwargs: dict[str, Any] = {"dtype": torch_dtype, "local_files_only": True}
        if "safety_checker" in inspect.signature(pipeline_cls.__init__).parameters:
            kwargs.update(safety_checker=None, feature_extractor=None, requires_safety_checker=False)
        diffusers.utils.logging.disable_progress_bar()
        transformers.utils.logging.disable_progress_bar()
        pipe = pipeline_cls.from_pretrained(folder, **kwargs).to(torch_device)
        pipe.set_progress_bar_config(disable=True)
        log.info("loaded %s from %s on %s (%s)", class_name, folder, torch_device, torch_dtype)
        return cls(pipe, name or folder.resolve().name)

    def generate(
        self, params: GenerationParams, seed: int, on_step: StepCallback, cancel: threading.Event
    ) -> Image.Image:
        """One image of the request. Its noise comes from a CPU generator seeded with `seed`, whatever the device.

        `cancel` is checked after every denoising iteration; once set, GenerationCancelled leaves the loop.
        """
        generator = torch.Generator("cpu").manual_seed(seed)
        steps_done = 0
        total = params.denoise_steps

        def callback(pipe, i: int, timestep, tensors: dict) -> dict:
            nonlocal steps_done
            # diffusers' progress-bar rule: second-order and warm-up iterations are not steps of their own.
            iterations, order = pipe.num_timesteps, pipe.scheduler.order
            warmup = iterations - total * order
            is_step = i == iterations - 1 or ((i + 1) > warmup and (i + 1) % order == 0)
            if is_step:
                steps_done += 1
                DENOISE_STEPS.inc()
                latents = tensors["latents"] if denoised is None or denoised.latest is None else denoised.latest
                on_step(steps_done, total, latents)
            if cancel.is_set():
                raise GenerationCancelled(f"stopped after step {steps_done} of {total}")
            return tensors

        if self.adapters is not None:
            self.adapters.apply(list(params.loras))
        text: dict[str, Any] = {"prompt": params.prompt, "negative_prompt": params.negative_prompt or None}
        # An adapter may change the text encoder, whose cached outputs are the base model's.
        if self.embedding_cache is not None and not params.loras:
            guided = params.guidance_scale > 1 and self.pipe.unet.config.time_cond_proj_dim is None
            text = {"prompt_embeds": self._text_embeddings(params.prompt)}
            if guided:  # the pipeline's unconditional input: the negative prompt, or ""
                text["negative_prompt_embeds"] = self._text_embeddings(params.negative_prompt)
        pipe, task = self._task(params, generator)
        # The request's sampler and options on the model's own scheduler config, built anew for every image.
        pipe.scheduler = params.sampler.build(self.base_scheduler_config, params.scheduler_options)
        denoised = DenoisedEstimate(pipe.scheduler) if params.preview_every else None
        try:
            result = pipe(
                **text,
                **task,
                num_inference_steps=params.steps,
                guidance_scale=params.guidance_scale,
                generator=generator,
                callback_on_step_end=callback,
                output_type="pil",
            )
        finally:
            pipe.scheduler = self.base_scheduler
        image = result.images[0]
        if params.mask_blur and params.padding_mask_crop is None:
            # A1111 pastes the result over the original through the blurred mask (with padding_mask_crop the
            # pipeline does so itself, with the mask it was given), so the kept area keeps its pixels.
            image = self.inpaint.image_processor.apply_overlay(task["mask_image"], params.init_image, image)
        return image

    def _task(self, params: GenerationParams, generator: torch.Generator) -> tuple[Any, dict[str, Any]]:
        """The pipeline for the request's task, and the arguments only that task takes."""
        if params.init_image is None:
            shape = (
                1,
                self.pipe.unet.config.in_channels,
                params.height // self.pipe.vae_scale_factor,
                params.width // self.pipe.vae_scale_factor,
            )
            # Draw the initial noise exactly as the pipeline would on the CPU, in float32, then move it; the same
            # generator then feeds stochastic schedulers, so its state matches a plain pipeline call.
            latents = randn_tensor(shape, generator=generator, device=torch.device("cpu"), dtype=torch.float32)
            latents = latents.to(self.device, self.dtype)
            return self.pipe, {"width": params.width, "height": params.height, "latents": latents}
        if params.mask_image is None:
            # The image is already width x height; the img2img pipelines take their size from it.
            return self.img2img, {"image": params.init_image, "strength": params.strength}
        mask = params.mask_image
        if params.mask_blur:
            mask = self.inpaint.mask_processor.blur(mask, blur_factor=params.mask_blur)
        return self.inpaint, {
            "image": params.init_image,
            "mask_image": mask,
            "strength": params.strength,
            "width": params.width,
            "height": params.height,
            "padding_mask_crop": params.padding_mask_crop,
        }

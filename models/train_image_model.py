"""Train muestra's default image model from scratch: a tiny Stable Diffusion 1.x-layout pipeline on 8x8 digits.

    .venv/bin/python models/train_image_model.py            # writes models/muestra-image (make models-image)
    .venv/bin/python models/train_image_model.py --out /tmp/img --unet-steps 200   # a quick try

Stages: a CLIP-layout BPE tokenizer learnt from the captions; an AutoencoderKL (32x32x3 -> 8x8x4) trained and
frozen; a CLIPTextModel warmed up as a caption -> digit classifier; then the text encoder and a
UNet2DConditionModel trained together on the latents with DDPM noise (epsilon prediction, 10% empty captions
for classifier-free guidance). Inference runs DDIM, at the pipeline's default 50 steps and guidance 7.5.
Seeds are fixed and training uses one torch thread (2 threads on 2 busy cores were seven times slower); the
same torch version gives the same weights.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from imagegen.config import ImageModelConfig  # noqa: E402


def parse_args(argv: list[str] | None) -> tuple[ImageModelConfig, Path]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(HERE / "muestra-image"), help="folder to write (replaced at the end)")
    defaults = ImageModelConfig()
    for field in dataclasses.fields(ImageModelConfig):
        value = getattr(defaults, field.name)
        if isinstance(value, tuple):
            continue
        parser.add_argument(f"--{field.name.replace('_', '-')}", type=type(value), default=value)
    args = vars(parser.parse_args(argv))
    out = Path(args.pop("out"))
    return dataclasses.replace(defaults, **args), out


def main(argv: list[str] | None = None) -> int:
    config, out = parse_args(argv)
    import diffusers
    import torch
    from diffusers import DDIMScheduler, StableDiffusionPipeline
    from imagegen.data import all_captions, load_digit_images
    from imagegen.denoiser import NOISE_SCHEDULE, train_denoiser
    from imagegen.tokenizer import train_clip_tokenizer
    from imagegen.vae import encode_posterior, train_vae
    from transformers import CLIPTokenizer

    torch.set_num_threads(config.threads)
    torch.manual_seed(config.seed)
    started = time.perf_counter()
    timings = {}
    # Work in the system temp folder; `out` is only replaced once the model is complete.
    staging = Path(tempfile.mkdtemp(prefix="muestra-image-"))
    try:
        captions = all_captions()
        tokenizer = train_clip_tokenizer(
            [c for digit_captions in captions for c in digit_captions],
            staging / "tokenizer-src",
            vocab_size=config.vocab_size,
            model_max_length=config.max_length,
        )
        images, labels = load_digit_images(config.image_size)
        print(f"{len(images)} digits at {config.image_size}x{config.image_size}, {len(tokenizer)} tokens", flush=True)

        t0 = time.perf_counter()
        vae = train_vae(images, config)
        timings["vae_s"] = round(time.perf_counter() - t0, 1)
        latent_mean, latent_std = encode_posterior(vae, images)

        t0 = time.perf_counter()
        text_encoder, unet = train_denoiser(
            latent_mean, latent_std, vae.config.scaling_factor, labels, captions, tokenizer, config
        )
        timings["unet_s"] = round(time.perf_counter() - t0, 1)

        # The service runs the model's own scheduler by default, at the pipeline's default 50 steps.
        scheduler = DDIMScheduler(
            **NOISE_SCHEDULE, clip_sample=False, set_alpha_to_one=False, steps_offset=1, timestep_spacing="trailing"
        )
        pipe = StableDiffusionPipeline(
            vae=vae,
            text_encoder=text_encoder,
            tokenizer=CLIPTokenizer.from_pretrained(staging / "tokenizer-src"),
            unet=unet,
            scheduler=scheduler,
            safety_checker=None,
            feature_extractor=None,
            requires_safety_checker=False,
        )
        pipe.save_pretrained(staging / "model")
        # Keep the vocab.json + merges.txt that Stable Diffusion folders ship beside tokenizer.json.
        for name in ("vocab.json", "merges.txt"):
            shutil.copy(staging / "tokenizer-src" / name, staging / "model" / "tokenizer" / name)
        timings["total_s"] = round(time.perf_counter() - started, 1)
        record = {
            "config": dataclasses.asdict(config),
            "timings": timings,
            "versions": {
                "torch": torch.__version__,
                "diffusers": diffusers.__version__,
                "python": platform.python_version(),
            },
        }
        (staging / "model" / "training.json").write_text(json.dumps(record, indent=2) + "\n")
        partial = out.with_name(out.name + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        shutil.copytree(staging / "model", partial)
        if out.exists():
            shutil.rmtree(out)
        os.replace(partial, out)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    size = sum(f.stat().st_size for f in out.rglob("*") if f.is_file())
    print(f"wrote {out} ({size / 1e6:.1f} MB) in {timings['total_s']:.0f} s: {timings}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""How well linear latent previews would match a model's images (the service previews other VAEs than SD's by
decoding the step's estimate with the model's VAE instead: muestra/diffusion/preview.py, service_preview).

    python scripts/preview_factors.py models/muestra-image

Prints the latent-to-RGB factors the service would use (preview.preview_for: published for SD's VAEs,
else fitted to the model's VAE at load), fits them again on the final latents of a few of the model's
own images (the best any linear preview can do), and for each prompt the correlation of the last step's
preview with the decoded image: with the service's factors, the refit ones, and SD 1.x's (what every
model got before).
"""

from __future__ import annotations

import argparse

import numpy as np
import torch
import torch.nn.functional as F
from diffusers import StableDiffusionPipeline

from muestra.diffusion.preview import SD1_FACTORS, LatentPreview, least_squares_factors, preview_for

PROMPTS = ["a handwritten nine", "a red circle", "a blue square", "a green triangle", "a handwritten three"]


def correlation(preview: LatentPreview, latents: torch.Tensor, image: torch.Tensor) -> float:
    """Pearson correlation of the preview's pixels with the image's, averaged to the preview's size."""
    shown = preview.rgb(latents).permute(2, 0, 1).flatten().numpy()
    target = F.adaptive_avg_pool2d(image[None].float(), latents.shape[-2:])[0].flatten().numpy()
    return float(np.corrcoef(shown, target)[0, 1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model", help="a diffusers folder")
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args()
    pipe = StableDiffusionPipeline.from_pretrained(args.model, safety_checker=None)
    pipe.set_progress_bar_config(disable=True)
    service = preview_for(pipe.vae)
    print("factors [C, 3]:", service.factors.tolist(), "bias:", service.bias.tolist())
    finals, images = [], []
    for i, prompt in enumerate(PROMPTS):
        out = pipe(prompt, num_inference_steps=args.steps, output_type="latent", generator=torch.manual_seed(i))
        finals.append(out.images)
        with torch.no_grad():
            images.append(pipe.vae.decode(out.images / pipe.vae.config.scaling_factor).sample.clamp(-1, 1))
    refit = LatentPreview(*least_squares_factors(torch.cat(finals), torch.cat(images)))
    print(f"{'prompt':24} service  refit  SD1.x")
    for prompt, latents, image in zip(PROMPTS, finals, images, strict=True):
        scores = [correlation(p, latents, image[0]) for p in (service, refit, LatentPreview(SD1_FACTORS))]
        print(f"{prompt:24} " + "  ".join(f"{s:6.3f}" for s in scores))


if __name__ == "__main__":
    main()

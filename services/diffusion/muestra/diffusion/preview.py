"""Previews: a step's latents (its estimate of the final ones, see denoised.py) to a small RGB image.

Stable Diffusion 1.x/2.x and SDXL VAEs use a linear projection with the well-known least-squares factors
(A1111's "Approx cheap" preview, ComfyUI's latent formats), no VAE decode. Those factors belong to those
VAEs. Any other VAE (models/muestra-image's own, the tests' random ones) decodes the preview itself
(A1111's "Full" preview): no linear projection follows models/muestra-image's VAE, even one fitted to its
own images (`fit_preview`, `scripts/preview_factors.py`: correlations of 0.2 to 0.9 with the image).
"""

from __future__ import annotations

import io

import torch
import torch.nn.functional as F
from PIL import Image

SD1_FACTORS = (
    (0.3512, 0.2297, 0.3227),
    (0.3250, 0.4974, 0.2350),
    (-0.2829, 0.1762, 0.2721),
    (-0.2120, -0.2616, -0.7177),
)
SDXL_FACTORS = (
    (0.3651, 0.4232, 0.4341),
    (-0.2533, -0.0042, 0.1068),
    (0.1076, 0.1111, -0.0362),
    (-0.3165, -0.2492, -0.2188),
)
SDXL_BIAS = (0.1084, -0.0175, -0.0011)
# The scaling_factor in a VAE's config names the published VAE the factors above were fitted to.
KNOWN_VAES = {0.18215: (SD1_FACTORS, (0.0, 0.0, 0.0)), 0.13025: (SDXL_FACTORS, SDXL_BIAS)}


class LatentPreview:
    """Turns a [1, C, h, w] latent into a small PNG (h x w pixels): rgb = latent . factors + bias."""

    def __init__(self, factors=SD1_FACTORS, bias=(0.0, 0.0, 0.0)) -> None:
        self.factors = torch.as_tensor(factors, dtype=torch.float32)
        self.bias = torch.as_tensor(bias, dtype=torch.float32)

    def supports(self, latents: torch.Tensor) -> bool:
        return latents.ndim == 4 and latents.shape[1] == self.factors.shape[0]

    def rgb(self, latents: torch.Tensor) -> torch.Tensor:
        """[h, w, 3] in about [-1, 1], as the VAE would decode the first latent (roughly)."""
        latent = latents[0].detach().to("cpu", torch.float32)
        return torch.einsum("chw,cr->hwr", latent, self.factors) + self.bias

    def png(self, latents: torch.Tensor) -> bytes:
        return rgb_png(self.rgb(latents))


class VaePreview:
    """Turns a [1, C, h, w] latent into a small PNG (h x w pixels): decoded by the VAE, then averaged to h x w.

    One VAE decode per preview: cheap for the small VAEs without published factors that it serves.
    """

    def __init__(self, vae) -> None:
        self.vae = vae

    def supports(self, latents: torch.Tensor) -> bool:
        return latents.ndim == 4 and latents.shape[1] == self.vae.config.latent_channels

    @torch.no_grad()
    def rgb(self, latents: torch.Tensor) -> torch.Tensor:
        """[h, w, 3] in [-1, 1]: the first latent decoded as the pipeline decodes its output, area-averaged."""
        latent = latents[:1].to(self.vae.device, self.vae.dtype) / self.vae.config.scaling_factor
        image = self.vae.decode(latent).sample.float().clamp(-1, 1)
        return F.adaptive_avg_pool2d(image, latents.shape[-2:])[0].permute(1, 2, 0).cpu()

    def png(self, latents: torch.Tensor) -> bytes:
        return rgb_png(self.rgb(latents))


def rgb_png(rgb: torch.Tensor) -> bytes:
    """A PNG of [h, w, 3] pixels in [-1, 1], rounded as the pipeline rounds its images."""
    pixels = ((rgb + 1.0) * 127.5).clamp(0, 255).round().to(torch.uint8).numpy()
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG", compress_level=1)
    return buffer.getvalue()


def least_squares_factors(latents: torch.Tensor, images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Factors [C, 3] and bias [3] that best map latents [N, C, h, w] to images [N, 3, H, W] in [-1, 1]."""
    pooled = F.adaptive_avg_pool2d(images.float(), latents.shape[-2:])  # each latent pixel's patch of the image
    x = latents.float().permute(0, 2, 3, 1).reshape(-1, latents.shape[1])
    y = pooled.permute(0, 2, 3, 1).reshape(-1, 3)
    solution = torch.linalg.lstsq(torch.cat([x, torch.ones(len(x), 1)], dim=1), y).solution
    return solution[:-1], solution[-1]


def probe_images(count: int = 16, size: int = 64, seed: int = 0) -> torch.Tensor:
    """[count, 3, size, size] in [-1, 1]: smooth colour fields, each with a bright and a dark disc."""
    generator = torch.Generator().manual_seed(seed)
    coarse = torch.rand(count, 3, 4, 4, generator=generator) * 2 - 1
    images = F.interpolate(coarse, size=(size, size), mode="bicubic", align_corners=False)
    grid = torch.linspace(0, 1, size)
    y, x = torch.meshgrid(grid, grid, indexing="ij")
    for image in images:
        for colour in (torch.rand(3, generator=generator), -torch.rand(3, generator=generator)):
            cx, cy, r = (torch.rand(3, generator=generator) * torch.tensor([1.0, 1.0, 0.3]) + 0.1).tolist()
            disc = (x - cx) ** 2 + (y - cy) ** 2 < r**2
            image[:, disc] = colour[:, None]
    return images.clamp(-1, 1)


@torch.no_grad()
def fit_preview(vae) -> LatentPreview:
    """Factors fitted to this VAE: probe images encoded, decoded, and the decoded pixels regressed on the latents.

    The latents are scaled as the UNet sees them (times scaling_factor), so the factors apply to the
    denoising loop's latents directly. A few 64x64 images: milliseconds for a small VAE.
    """
    scale = vae.config.scaling_factor
    parameter = next(vae.parameters())
    images = probe_images().to(parameter.device, torch.float32)
    latents, decoded = [], []
    for chunk in images.split(4):
        dtype = parameter.dtype
        mean = vae.encode(chunk.to(dtype)).latent_dist.mean
        latents.append((mean * scale).float().cpu())
        decoded.append(vae.decode(mean).sample.float().clamp(-1, 1).cpu())
    factors, bias = least_squares_factors(torch.cat(latents), torch.cat(decoded))
    return LatentPreview(factors, bias)


def published_preview(vae) -> LatentPreview | None:
    """The published factors for a VAE they were fitted to, else None."""
    known = KNOWN_VAES.get(round(float(vae.config.scaling_factor), 5))
    if known is not None and vae.config.latent_channels == 4:
        return LatentPreview(*known)
    return None


def preview_for(vae) -> LatentPreview:
    """The best linear preview for `vae`: the published factors, else factors fitted to it now."""
    return published_preview(vae) or fit_preview(vae)


def service_preview(vae) -> LatentPreview | VaePreview:
    """What the diffusion service previews with: the published factors for SD's VAEs, else the VAE itself."""
    return published_preview(vae) or VaePreview(vae)

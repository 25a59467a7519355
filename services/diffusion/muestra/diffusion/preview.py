"""Cheap previews: latents to RGB by a fixed linear projection, no VAE.

The factors are the well-known least-squares fits of the VAE's output colours to its latents
(as used by A1111's "Approx cheap" preview and ComfyUI's latent formats).
"""

from __future__ import annotations

import io

import torch
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


class LatentPreview:
    """Turns a [1, 4, h, w] latent into a small PNG (h x w pixels)."""

    def __init__(self, factors=SD1_FACTORS, bias=(0.0, 0.0, 0.0)) -> None:
        self.factors = torch.tensor(factors, dtype=torch.float32)
        self.bias = torch.tensor(bias, dtype=torch.float32)

    def supports(self, latents: torch.Tensor) -> bool:
        return latents.ndim == 4 and latents.shape[1] == self.factors.shape[0]

    def png(self, latents: torch.Tensor) -> bytes:
        latent = latents[0].detach().to("cpu", torch.float32)
        rgb = torch.einsum("chw,cr->hwr", latent, self.factors) + self.bias
        pixels = ((rgb + 1.0) * 127.5).clamp(0, 255).round().to(torch.uint8).numpy()
        buffer = io.BytesIO()
        Image.fromarray(pixels).save(buffer, format="PNG", compress_level=1)
        return buffer.getvalue()

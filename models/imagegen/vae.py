"""Stage 1: a small AutoencoderKL (32x32x3 -> 8x8x4), trained on the digits and then frozen."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from diffusers import AutoencoderKL
from tqdm import tqdm

from imagegen.config import ImageModelConfig


def build_vae(config: ImageModelConfig) -> AutoencoderKL:
    blocks = len(config.vae_channels)
    return AutoencoderKL(
        in_channels=3,
        out_channels=3,
        latent_channels=config.vae_latent_channels,
        block_out_channels=config.vae_channels,
        down_block_types=("DownEncoderBlock2D",) * blocks,
        up_block_types=("UpDecoderBlock2D",) * blocks,
        layers_per_block=1,
        norm_num_groups=min(32, config.vae_channels[0]),
        sample_size=config.image_size,
    )


def train_vae(images: torch.Tensor, config: ImageModelConfig) -> AutoencoderKL:
    """Reconstruction (MSE + L1) plus a light KL term; returns the VAE in eval mode with its scaling_factor set."""
    generator = torch.Generator().manual_seed(config.seed)
    vae = build_vae(config)
    optimizer = torch.optim.AdamW(vae.parameters(), lr=config.vae_lr, weight_decay=0.0)
    schedule = torch.optim.lr_scheduler.OneCycleLR(
        optimizer, config.vae_lr, total_steps=config.vae_steps, pct_start=0.05
    )
    vae.train()
    progress = tqdm(range(config.vae_steps), desc="vae", unit="step")
    for _ in progress:
        batch = images[torch.randint(len(images), (config.vae_batch,), generator=generator)]
        posterior = vae.encode(batch).latent_dist
        latents = posterior.mean + posterior.std * torch.randn(posterior.mean.shape, generator=generator)
        reconstruction = vae.decode(latents).sample
        mse = F.mse_loss(reconstruction, batch)
        loss = mse + 0.1 * F.l1_loss(reconstruction, batch) + config.vae_kl_weight * posterior.kl().mean()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        schedule.step()
        progress.set_postfix(mse=f"{mse.item():.4f}", refresh=False)
    vae.eval().requires_grad_(False)
    latents, _ = encode_posterior(vae, images)
    # Stable Diffusion's convention: latents times scaling_factor have unit variance.
    vae.register_to_config(scaling_factor=float(1.0 / latents.std()))
    return vae


@torch.no_grad()
def encode_posterior(vae: AutoencoderKL, images: torch.Tensor, batch: int = 256) -> tuple[torch.Tensor, torch.Tensor]:
    """The posterior means and standard deviations of `images`' latents, unscaled."""
    posteriors = [vae.encode(images[i : i + batch]).latent_dist for i in range(0, len(images), batch)]
    return torch.cat([p.mean for p in posteriors]), torch.cat([p.std for p in posteriors])

"""Stage 2: the text encoder (warmed up first) and the UNet, trained together on the frozen VAE's latents.

DDPM noise on Stable Diffusion 1.x's schedule, epsilon prediction, an EMA of the weights, and empty captions
`caption_dropout` of the time so that classifier-free guidance has an unconditional embedding.
"""

from __future__ import annotations

import copy
import math
import random

import torch
import torch.nn.functional as F
from diffusers import DDPMScheduler, UNet2DConditionModel
from tqdm import tqdm
from transformers import CLIPTextModel

from imagegen.config import ImageModelConfig
from imagegen.text import build_text_encoder, caption_token_ids, warm_up_text_encoder

# Stable Diffusion 1.x's noise schedule.
NOISE_SCHEDULE = {
    "num_train_timesteps": 1000,
    "beta_start": 0.00085,
    "beta_end": 0.012,
    "beta_schedule": "scaled_linear",
    "prediction_type": "epsilon",
}


def build_unet(config: ImageModelConfig, latent_size: int) -> UNet2DConditionModel:
    blocks = len(config.unet_channels)
    return UNet2DConditionModel(
        sample_size=latent_size,
        in_channels=config.vae_latent_channels,
        out_channels=config.vae_latent_channels,
        block_out_channels=config.unet_channels,
        layers_per_block=1,
        down_block_types=("CrossAttnDownBlock2D",) * (blocks - 1) + ("DownBlock2D",),
        up_block_types=("UpBlock2D",) + ("CrossAttnUpBlock2D",) * (blocks - 1),
        cross_attention_dim=config.text_hidden,
        attention_head_dim=config.unet_attention_heads,
        norm_num_groups=min(32, config.unet_channels[0]),
        # The prompt also reaches every ResNet block through the time embedding (attention-pooled, as in
        # DeepFloyd IF), which makes the digit condition far quicker to learn than cross-attention alone.
        addition_embed_type="text",
        addition_embed_type_num_heads=config.unet_attention_heads,
    )


def _ema_update(ema: torch.nn.Module, model: torch.nn.Module, decay: float) -> None:
    with torch.no_grad():
        for target, source in zip(ema.parameters(), model.parameters(), strict=True):
            target.lerp_(source, 1 - decay)


def train_denoiser(
    latent_mean: torch.Tensor,
    latent_std: torch.Tensor,
    scaling_factor: float,
    labels: torch.Tensor,
    captions: list[list[str]],
    tokenizer,
    config: ImageModelConfig,
) -> tuple[CLIPTextModel, UNet2DConditionModel]:
    """Train on latents sampled from the VAE posterior (times scaling_factor); return the EMA text encoder and UNet."""
    generator = torch.Generator().manual_seed(config.seed + 1)
    pick = random.Random(config.seed + 1)
    # Every caption's token ids once; row 0 is the empty caption that stands for "no prompt".
    token_ids, classes = caption_token_ids(tokenizer, captions, config.max_length)
    first = [1]
    for digit_captions in captions:
        first.append(first[-1] + len(digit_captions))

    text_encoder = build_text_encoder(config, tokenizer)
    warm_up_text_encoder(text_encoder, token_ids, classes, config)
    unet = build_unet(config, latent_mean.shape[-1])
    ema_text_encoder, ema_unet = copy.deepcopy(text_encoder), copy.deepcopy(unet)
    noise_scheduler = DDPMScheduler(**NOISE_SCHEDULE)
    parameters = [*text_encoder.parameters(), *unet.parameters()]
    optimizer = torch.optim.AdamW(parameters, lr=config.unet_lr, weight_decay=1e-2)

    def lr_factor(step: int) -> float:
        if step < config.unet_warmup:
            return (step + 1) / config.unet_warmup
        progress = (step - config.unet_warmup) / max(1, config.unet_steps - config.unet_warmup)
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress))

    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_factor)
    text_encoder.train()
    unet.train()
    progress = tqdm(range(config.unet_steps), desc="unet", unit="step")
    for step in progress:
        rows = torch.randint(len(latent_mean), (config.unet_batch,), generator=generator)
        caption_index = [
            0 if pick.random() < config.caption_dropout else pick.randrange(first[digit], first[digit + 1])
            for digit in labels[rows].tolist()
        ]
        # Encode each distinct caption of the batch once.
        unique, inverse = torch.unique(torch.tensor(caption_index), return_inverse=True)
        hidden = text_encoder(token_ids[unique]).last_hidden_state[inverse]

        posterior_noise = torch.randn(latent_mean[rows].shape, generator=generator)
        latents = (latent_mean[rows] + latent_std[rows] * posterior_noise) * scaling_factor
        noise = torch.randn(latents.shape, generator=generator)
        timesteps = torch.randint(noise_scheduler.config.num_train_timesteps, (len(rows),), generator=generator)
        noisy = noise_scheduler.add_noise(latents, noise, timesteps)
        loss = F.mse_loss(unet(noisy, timesteps, hidden).sample, noise)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(parameters, 1.0)
        optimizer.step()
        schedule.step()
        # EMA warm-up (as in diffusers' EMAModel): average over fewer steps early on.
        decay = min(config.ema_decay, (1 + step) / (10 + step))
        _ema_update(ema_text_encoder, text_encoder, decay)
        _ema_update(ema_unet, unet, decay)
        progress.set_postfix(loss=f"{loss.item():.4f}", refresh=False)
    return ema_text_encoder.eval(), ema_unet.eval()

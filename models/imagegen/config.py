"""Every size and training setting of the default image model, in one place."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class ImageModelConfig:
    seed: int = 0
    # Torch intra-op threads while training; the same count (and torch version) gives the same weights.
    threads: int = 1
    image_size: int = 32
    # Text encoder (a small CLIPTextModel) and its tokenizer.
    vocab_size: int = 1000  # at most; the captions yield about 650 tokens
    max_length: int = 16
    text_hidden: int = 64
    text_layers: int = 2
    text_heads: int = 4
    # The text encoder's warm-up as a caption -> digit classifier (imagegen/text.py).
    text_warmup_steps: int = 300
    text_warmup_lr: float = 1e-3
    # VAE: 32x32x3 -> 8x8x4 (three blocks, two of them downsampling).
    vae_channels: tuple[int, ...] = (16, 32, 32)
    vae_latent_channels: int = 4
    vae_steps: int = 500
    vae_batch: int = 32
    vae_lr: float = 2e-3
    vae_kl_weight: float = 1e-6
    # UNet on the 8x8 latents.
    unet_channels: tuple[int, ...] = (32, 64, 64)
    unet_attention_heads: int = 4
    unet_steps: int = 1500
    unet_batch: int = 64
    unet_lr: float = 1e-3
    unet_warmup: int = 100
    ema_decay: float = 0.995
    # Share of captions replaced by "" so that classifier-free guidance has an unconditional embedding.
    caption_dropout: float = 0.1

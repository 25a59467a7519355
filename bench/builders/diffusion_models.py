"""Random Stable Diffusion pipelines (SD 1.x, inpainting, SDXL) and LoRAs for them, built from configs on the fly.

Nothing is downloaded: the CLIP tokenizer is a byte-level BPE trained here on a few prompts, and every model has
random weights (seeded, so a folder is the same on every run).
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

_CORPUS = [
    "a photo of a cat sitting on a red chair",
    "an astronaut riding a horse on the moon, highly detailed",
    "a watercolor painting of a lighthouse at sunset",
    "portrait of an old man with a beard, oil on canvas",
    "blurry, low quality, watermark, text, deformed hands",
    "a bowl of fruit on a wooden table in the morning light",
]


@dataclasses.dataclass(frozen=True)
class RandomSDConfig:
    """Sizes of a random Stable Diffusion 1.x-layout pipeline."""

    unet_channels: tuple[int, ...] = (32, 64)
    unet_layers_per_block: int = 1
    unet_attention_head_dim: int = 8
    vae_channels: tuple[int, ...] = (16, 16, 16, 16)
    text_hidden: int = 32
    text_layers: int = 2
    # Latent size; the default image size is this times the VAE's scale factor (2 ** (len(vae_channels) - 1)).
    sample_size: int = 8
    seed: int = 0
    # A dedicated inpainting model: a 9-channel UNet (latents, mask, masked image) in a StableDiffusionInpaintPipeline.
    inpainting: bool = False


TINY = RandomSDConfig()
# A UNet of about 70M parameters (the bench's "mid-size" model), 256x256 by default.
MID = RandomSDConfig(
    unet_channels=(128, 256, 384, 384),
    unet_layers_per_block=1,
    unet_attention_head_dim=32,
    vae_channels=(32, 64, 64, 64),
    text_hidden=256,
    text_layers=4,
    sample_size=32,
)


def train_clip_tokenizer(folder: Path) -> None:
    """Write a CLIP-layout tokenizer (vocab.json + merges.txt) whose BPE merges are trained on _CORPUS."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, trainers
    from transformers import CLIPTokenizer

    bpe = Tokenizer(models.BPE(unk_token="<|endoftext|>", end_of_word_suffix="</w>"))
    bpe.normalizer = normalizers.Sequence([normalizers.NFC(), normalizers.Lowercase()])
    bpe.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Whitespace(), pre_tokenizers.ByteLevel(add_prefix_space=False)]
    )
    trainer = trainers.BpeTrainer(
        vocab_size=700, min_frequency=2, end_of_word_suffix="</w>", show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )  # fmt: skip
    bpe.train_from_iterator(_CORPUS * 4, trainer)
    merges = [" ".join(pair) for pair in json.loads(bpe.to_str())["model"]["merges"]]
    # CLIP's vocabulary order: every byte symbol, the same with "</w>", the merges, the two specials.
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    tokens = [*alphabet, *(symbol + "</w>" for symbol in alphabet)]
    tokens += [merge.replace(" ", "") for merge in merges]
    tokens = [*dict.fromkeys(tokens), "<|startoftext|>", "<|endoftext|>"]
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "vocab.json").write_text(json.dumps({token: i for i, token in enumerate(tokens)}, ensure_ascii=False))
    (folder / "merges.txt").write_text("#version: 0.2\n" + "\n".join(merges) + "\n")
    tokenizer = CLIPTokenizer(vocab=str(folder / "vocab.json"), merges=str(folder / "merges.txt"), model_max_length=77)
    tokenizer.save_pretrained(folder)


def build_random_sd(folder: Path, config: RandomSDConfig = TINY) -> Path:
    """Save a random StableDiffusionPipeline (no safety checker) into `folder`; return the folder."""
    import torch
    from diffusers import (
        AutoencoderKL,
        EulerDiscreteScheduler,
        StableDiffusionInpaintPipeline,
        StableDiffusionPipeline,
        UNet2DConditionModel,
    )
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTokenizer

    if (folder / "model_index.json").exists():
        return folder
    staging = folder.with_name(folder.name + ".partial")
    train_clip_tokenizer(staging / "tokenizer-src")
    tokenizer = CLIPTokenizer.from_pretrained(staging / "tokenizer-src")
    torch.manual_seed(config.seed)
    blocks = len(config.unet_channels)
    unet = UNet2DConditionModel(
        sample_size=config.sample_size,
        in_channels=9 if config.inpainting else 4,
        out_channels=4,
        block_out_channels=config.unet_channels,
        layers_per_block=config.unet_layers_per_block,
        down_block_types=("DownBlock2D",) + ("CrossAttnDownBlock2D",) * (blocks - 1),
        up_block_types=("CrossAttnUpBlock2D",) * (blocks - 1) + ("UpBlock2D",),
        cross_attention_dim=config.text_hidden,
        attention_head_dim=config.unet_attention_head_dim,
        norm_num_groups=min(32, config.unet_channels[0]),
    )
    vae_blocks = len(config.vae_channels)
    vae = AutoencoderKL(
        in_channels=3,
        out_channels=3,
        latent_channels=4,
        block_out_channels=config.vae_channels,
        down_block_types=("DownEncoderBlock2D",) * vae_blocks,
        up_block_types=("UpDecoderBlock2D",) * vae_blocks,
        layers_per_block=1,
        norm_num_groups=min(32, config.vae_channels[0]),
        sample_size=config.sample_size * 2 ** (vae_blocks - 1),
    )
    text_encoder = CLIPTextModel(
        CLIPTextConfig(
            vocab_size=len(tokenizer),
            hidden_size=config.text_hidden,
            intermediate_size=config.text_hidden * 2,
            num_hidden_layers=config.text_layers,
            num_attention_heads=4,
            max_position_embeddings=77,
            bos_token_id=tokenizer.bos_token_id,
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
        )
    )
    scheduler = EulerDiscreteScheduler(
        beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear", num_train_timesteps=1000,
        steps_offset=1, timestep_spacing="leading",
    )  # fmt: skip
    pipeline_class = StableDiffusionInpaintPipeline if config.inpainting else StableDiffusionPipeline
    pipe = pipeline_class(
        vae=vae,
        text_encoder=text_encoder,
        tokenizer=tokenizer,
        unet=unet,
        scheduler=scheduler,
        safety_checker=None,
        feature_extractor=None,
        requires_safety_checker=False,
    )
    pipe.save_pretrained(staging)
    # Keep the vocab.json + merges.txt that real Stable Diffusion folders ship beside tokenizer.json.
    for name in ("vocab.json", "merges.txt"):
        os.replace(staging / "tokenizer-src" / name, staging / "tokenizer" / name)
    _remove_tree(staging / "tokenizer-src")
    os.replace(staging, folder)
    return folder


def build_random_sdxl(folder: Path, seed: int = 0) -> Path:
    """Save a tiny random StableDiffusionXLPipeline (two text encoders, text_time conditioning) into `folder`."""
    import torch
    from diffusers import AutoencoderKL, EulerDiscreteScheduler, StableDiffusionXLPipeline, UNet2DConditionModel
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTextModelWithProjection, CLIPTokenizer

    if (folder / "model_index.json").exists():
        return folder
    staging = folder.with_name(folder.name + ".partial")
    train_clip_tokenizer(staging / "tokenizer-src")
    tokenizer = CLIPTokenizer.from_pretrained(staging / "tokenizer-src")
    torch.manual_seed(seed)
    text_config = CLIPTextConfig(
        vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        max_position_embeddings=77, projection_dim=32, bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
    )  # fmt: skip
    unet = UNet2DConditionModel(
        sample_size=8, in_channels=4, out_channels=4, block_out_channels=(32, 64), layers_per_block=1,
        down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"), up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"),
        attention_head_dim=(2, 4), use_linear_projection=True, transformer_layers_per_block=(1, 2),
        # Cross-attention sees both encoders' hidden states; the added embedding is 6 time ids x 8 + 32 pooled.
        cross_attention_dim=64, addition_embed_type="text_time", addition_time_embed_dim=8,
        projection_class_embeddings_input_dim=80, norm_num_groups=32,
    )  # fmt: skip
    vae = AutoencoderKL(
        in_channels=3, out_channels=3, latent_channels=4, block_out_channels=(16, 16, 16, 16),
        down_block_types=("DownEncoderBlock2D",) * 4, up_block_types=("UpDecoderBlock2D",) * 4,
        layers_per_block=1, norm_num_groups=16, sample_size=64,
    )  # fmt: skip
    scheduler = EulerDiscreteScheduler(
        beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear", steps_offset=1, timestep_spacing="leading"
    )
    pipe = StableDiffusionXLPipeline(
        vae=vae,
        text_encoder=CLIPTextModel(text_config),
        text_encoder_2=CLIPTextModelWithProjection(text_config),
        tokenizer=tokenizer,
        tokenizer_2=tokenizer,
        unet=unet,
        scheduler=scheduler,
    )
    pipe.save_pretrained(staging)
    _remove_tree(staging / "tokenizer-src")
    os.replace(staging, folder)
    return folder


# The linear layers a LoRA for Stable Diffusion adapts: the UNet's attention and the CLIP text encoder's.
LORA_UNET_LAYERS = tuple(
    f"{attn}.{proj}" for attn in ("attn1", "attn2") for proj in ("to_q", "to_k", "to_v", "to_out.0")
)
LORA_TEXT_LAYERS = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.out_proj")


def build_random_lora(folder: Path, model: Path, name: str, seed: int, rank: int = 4, kohya_copy: bool = False) -> Path:
    """Random LoRA weights for `model`'s UNet and text encoders (both of SDXL's), saved as `name`.safetensors in
    diffusers' (peft) layout; with `kohya_copy`, the same weights again as `name`_kohya.safetensors in kohya's
    layout (SD 1.x)."""
    import torch
    from diffusers import UNet2DConditionModel
    from safetensors.torch import save_file
    from transformers import CLIPTextModel, CLIPTextModelWithProjection

    generator = torch.Generator().manual_seed(seed)
    layers = {}
    modules = [
        ("unet", UNet2DConditionModel, LORA_UNET_LAYERS),
        ("text_encoder", CLIPTextModel, LORA_TEXT_LAYERS),
        ("text_encoder_2", CLIPTextModelWithProjection, LORA_TEXT_LAYERS),  # SDXL's second encoder
    ]
    for prefix, module_class, suffixes in modules:
        if not (model / prefix).is_dir():
            continue
        module = module_class.from_pretrained(model / prefix)
        for layer, linear in module.named_modules():
            if isinstance(linear, torch.nn.Linear) and layer.endswith(suffixes):
                down = torch.randn(rank, linear.in_features, generator=generator) * 0.3 / linear.in_features**0.5
                up = torch.randn(linear.out_features, rank, generator=generator) * 0.3
                layers[(prefix, layer)] = (down, up)
    folder.mkdir(parents=True, exist_ok=True)
    diffusers_layout = {}
    for (prefix, layer), (down, up) in layers.items():
        diffusers_layout[f"{prefix}.{layer}.lora_A.weight"] = down
        diffusers_layout[f"{prefix}.{layer}.lora_B.weight"] = up
    save_file(diffusers_layout, folder / f"{name}.safetensors")
    if kohya_copy:  # lora_unet_down_blocks_1_..._to_q.lora_down.weight; alpha = rank makes the scale 1 (SD 1.x)
        kohya = {}
        for (prefix, layer), (down, up) in layers.items():
            key = {"unet": "lora_unet_", "text_encoder": "lora_te_"}[prefix] + layer.replace(".", "_")
            kohya[f"{key}.lora_down.weight"] = down
            kohya[f"{key}.lora_up.weight"] = up
            kohya[f"{key}.alpha"] = torch.tensor(float(rank))
        save_file(kohya, folder / f"{name}_kohya.safetensors")
    return folder / f"{name}.safetensors"


def _remove_tree(path: Path) -> None:
    for child in path.iterdir():
        child.unlink()
    path.rmdir()

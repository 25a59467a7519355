"""The text encoder (a small CLIPTextModel), and its warm-up as a caption classifier before the UNet sees it.

Seven, 7 and siete are different tokens; learning that they mean the same digit is cheap on text alone, and
the UNet's training then starts from embeddings that already tell the digits apart.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from tqdm import tqdm
from transformers import CLIPTextConfig, CLIPTextModel

from imagegen.config import ImageModelConfig


def build_text_encoder(config: ImageModelConfig, tokenizer) -> CLIPTextModel:
    return CLIPTextModel(
        CLIPTextConfig(
            vocab_size=len(tokenizer),
            hidden_size=config.text_hidden,
            intermediate_size=config.text_hidden * 4,
            num_hidden_layers=config.text_layers,
            num_attention_heads=config.text_heads,
            max_position_embeddings=config.max_length,
            bos_token_id=tokenizer.bos_token_id,
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
        )
    )


def caption_token_ids(tokenizer, captions: list[list[str]], max_length: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(token ids [C, max_length], class [C]): row 0 is the empty caption (class 10), then every digit's captions."""
    texts = [""] + [caption for digit_captions in captions for caption in digit_captions]
    classes = [10] + [digit for digit, digit_captions in enumerate(captions) for _ in digit_captions]
    ids = tokenizer(texts, padding="max_length", max_length=max_length, truncation=True, return_tensors="pt")
    return ids.input_ids, torch.tensor(classes)


def warm_up_text_encoder(
    text_encoder: CLIPTextModel, token_ids: torch.Tensor, classes: torch.Tensor, config: ImageModelConfig
) -> None:
    """Train the encoder, through the mean of its hidden states and a throw-away linear head, to name the digit."""
    generator = torch.Generator().manual_seed(config.seed + 2)
    head = torch.nn.Linear(config.text_hidden, 11)
    optimizer = torch.optim.AdamW([*text_encoder.parameters(), *head.parameters()], lr=config.text_warmup_lr)
    text_encoder.train()
    progress = tqdm(range(config.text_warmup_steps), desc="text encoder", unit="step")
    for _ in progress:
        rows = torch.randint(len(token_ids), (64,), generator=generator)
        hidden = text_encoder(token_ids[rows]).last_hidden_state
        loss = F.cross_entropy(head(hidden.mean(dim=1)), classes[rows])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        progress.set_postfix(loss=f"{loss.item():.3f}", refresh=False)

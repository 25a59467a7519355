"""Which transformers architectures we export, and the flat-tensor wrapper the ONNX tracer sees."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from transformers import DynamicCache, PretrainedConfig


@dataclass(frozen=True)
class Family:
    """How one `config.model_type` maps onto the ONNX layout."""

    name: str
    # ALiBi families (BLOOM) derive positions from the attention mask, so the graph has no position_ids input.
    position_ids: bool


FAMILIES: dict[str, Family] = {
    "llama": Family("llama", position_ids=True),
    "qwen2": Family("qwen2", position_ids=True),
    "mistral": Family("mistral", position_ids=True),
    "gpt2": Family("gpt2", position_ids=True),
    "bloom": Family("bloom", position_ids=False),
}


@dataclass(frozen=True)
class KVShape:
    """The KV-cache geometry read from a transformers config."""

    num_layers: int
    num_kv_heads: int
    head_dim: int


def kv_shape(config: PretrainedConfig) -> KVShape:
    """Layer count, KV heads and head dim, whatever the config calls them."""
    num_layers = config.num_hidden_layers
    num_heads = config.num_attention_heads
    num_kv_heads = getattr(config, "num_key_value_heads", None) or num_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // num_heads
    return KVShape(num_layers=num_layers, num_kv_heads=num_kv_heads, head_dim=head_dim)


def input_names(family: Family, num_layers: int) -> list[str]:
    names = ["input_ids", "attention_mask"]
    if family.position_ids:
        names.append("position_ids")
    for i in range(num_layers):
        names += [f"past_key_values.{i}.key", f"past_key_values.{i}.value"]
    return names


def output_names(num_layers: int) -> list[str]:
    names = ["logits"]
    for i in range(num_layers):
        names += [f"present.{i}.key", f"present.{i}.value"]
    return names


def dynamic_axes(family: Family, num_layers: int, last_logits_only: bool) -> dict[str, dict[int, str]]:
    axes: dict[str, dict[int, str]] = {
        "input_ids": {0: "batch", 1: "sequence"},
        "attention_mask": {0: "batch", 1: "past_sequence + sequence"},
        "logits": {0: "batch"} if last_logits_only else {0: "batch", 1: "sequence"},
    }
    if family.position_ids:
        axes["position_ids"] = {0: "batch", 1: "sequence"}
    for i in range(num_layers):
        for kind in ("key", "value"):
            axes[f"past_key_values.{i}.{kind}"] = {0: "batch", 2: "past_sequence"}
            axes[f"present.{i}.{kind}"] = {0: "batch", 2: "past_sequence + sequence"}
    return axes


class FlatCacheLM(nn.Module):
    """A causal LM whose forward takes and returns flat KV tensors instead of a transformers Cache object.

    The legacy (TorchScript) ONNX exporter can only trace tensors in and out, so the cache is rebuilt as a
    `DynamicCache` inside the traced function and flattened again on the way out.
    """

    def __init__(self, model: nn.Module, family: Family, num_layers: int, last_logits_only: bool):
        super().__init__()
        self.model = model
        self.family = family
        self.num_layers = num_layers
        self.last_logits_only = last_logits_only

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, *rest: torch.Tensor):
        kwargs = {}
        if self.family.position_ids:
            kwargs["position_ids"], rest = rest[0], rest[1:]
        past = [(rest[2 * i], rest[2 * i + 1]) for i in range(self.num_layers)]
        out = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            cache=DynamicCache(ddp_cache_data=past),
            use_cache=True,
            # 1 keeps only the last position, before the vocabulary projection; 0 keeps all positions.
            logits_to_keep=1 if self.last_logits_only else 0,
            **kwargs,
        )
        presents = []
        for layer in out.cache.layers:
            presents += [layer.keys, layer.values]
        # Samplers work in float32 whatever the weights are; the cast costs [batch, 1, vocab] floats.
        return (out.logits.float(), *presents)

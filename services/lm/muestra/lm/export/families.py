"""Which transformers architectures we export, and the flat-tensor wrapper the ONNX tracer sees."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import nn
from transformers import DynamicCache, PretrainedConfig

# BigScience trained every BLOOM at 2,048 tokens; BLOOM's config names no length (ALiBi has no position table).
BLOOM_TRAINED_CONTEXT = 2048


@dataclass(frozen=True)
class Family:
    """How one `config.model_type` maps onto the ONNX layout: only where families differ.

    Everything else (attention, norms, MLP, soft-capping, sliding windows, the KV geometry) is
    transformers' own code, traced as it runs; the exporter checks each graph against it.
    """

    name: str
    # ALiBi families (BLOOM) derive positions from the attention mask, so the graph has no position_ids input.
    position_ids: bool = True
    # The config fields that give the trained context length, first one set wins.
    context_fields: tuple[str, ...] = ("max_position_embeddings",)
    # The context length when the config names none.
    trained_context: int | None = None
    # Returns why this config cannot be exported (a variant of the family we do not trace), or None.
    refuse: Callable[[PretrainedConfig], str | None] | None = None
    # Whether the fused layout (GroupQueryAttention over a shared KV buffer, fused.py) can hold
    # the family's attention; ALiBi (BLOOM) adds a per-head bias the operator has no input for.
    fused: bool = True


def _falcon_refusal(config: PretrainedConfig) -> str | None:
    if getattr(config, "alibi", False):
        return (
            "Falcon with alibi=true (the falcon-rw models) is not supported: transformers rounds its ALiBi "
            "slopes through bfloat16, which the ONNX exporter cannot trace; Falcon with rotary positions "
            "(alibi=false: Falcon 7B/40B/180B, Falcon 2, Falcon 3) is"
        )
    return None


FAMILIES: dict[str, Family] = {
    family.name: family
    for family in (
        Family("llama"),
        Family("qwen2"),
        Family("qwen3"),
        Family("mistral"),
        Family("phi3"),
        Family("gemma"),
        Family("gemma2"),
        Family("gpt_neox"),
        Family("stablelm"),
        Family("opt"),
        Family("falcon", refuse=_falcon_refusal),
        Family("gpt2", context_fields=("n_positions", "n_ctx")),
        Family(
            "bloom",
            position_ids=False,
            context_fields=("seq_length",),
            trained_context=BLOOM_TRAINED_CONTEXT,
            fused=False,
        ),
    )
}


def is_dynamic_rope(kind: str) -> bool:
    """Rotary kinds transformers recomputes in forward as the length grows (`dynamic_rope_update`).

    A traced graph keeps their short-sequence frequencies, so such a model is served up to the
    length it was trained at before scaling.
    """
    return "dynamic" in kind or kind == "longrope"


def rope_type(config: PretrainedConfig) -> str:
    """The config's rotary kind ("default" when it has none), in transformers 4 or 5 spelling."""
    scaling = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
    return str(scaling.get("rope_type") or scaling.get("type") or "default")


def context_length(family: Family, config: PretrainedConfig) -> tuple[int | None, str]:
    """The longest sequence the exported graph computes as transformers does, and where that came from."""
    found = next(((f, getattr(config, f)) for f in family.context_fields if getattr(config, f, None)), None)
    if found is None:
        if family.trained_context is None:
            return None, f"config.json names none of {', '.join(family.context_fields)}"
        return family.trained_context, f"{family.name} models are trained at {family.trained_context} tokens"
    field, length = found
    kind = rope_type(config)
    if is_dynamic_rope(kind):
        scaling = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
        original = scaling.get("original_max_position_embeddings") or getattr(
            config, "original_max_position_embeddings", None
        )
        if original and original < length:
            return int(original), (
                f"{kind} rotary scaling changes with the length at run time; the graph keeps the "
                f"unscaled frequencies, exact up to original_max_position_embeddings ({field} is {length})"
            )
    return int(length), f"config.json {field}"


@dataclass(frozen=True)
class KVShape:
    """The KV-cache geometry, as the model itself writes its cache."""

    num_layers: int
    num_kv_heads: int
    head_dim: int


def kv_shape(model: nn.Module) -> KVShape:
    """Layer count, KV heads and head dim, read from the cache one two-token forward writes.

    Families name these differently (Falcon's multi-query attention keeps one head whatever
    num_kv_heads says), so the model's own cache is the one answer that cannot be misread.
    """
    with torch.no_grad():
        out = model(input_ids=torch.tensor([[2, 3]]), use_cache=True)
    layers = out.cache.layers
    keys = layers[0].keys
    return KVShape(num_layers=len(layers), num_kv_heads=int(keys.shape[1]), head_dim=int(keys.shape[3]))


@contextmanager
def static_rope(model: nn.Module):
    """While tracing, rotary modules keep their initial (short-sequence) frequencies.

    transformers updates dynamic and longrope frequencies in place in forward, which the ONNX
    exporter cannot trace; the graph is then exact up to the length `context_length` reports.
    """
    changed = []
    for module in model.modules():
        kind = getattr(module, "rope_type", None)
        if isinstance(kind, str) and is_dynamic_rope(kind):
            changed.append((module, kind))
            module.rope_type = "default"
    try:
        yield
    finally:
        for module, kind in changed:
            module.rope_type = kind


# A graph that keeps only some positions' logits takes them as this input (default [-1], the last position):
# a speculative step asks for every position it verifies.
LOGITS_POSITIONS = "logits_positions"


def input_names(family: Family, num_layers: int, fused: bool = False, logits_positions: bool = False) -> list[str]:
    names = ["input_ids", "attention_mask"]
    if family.position_ids or fused:
        names.append("position_ids")
    for i in range(num_layers):
        names += [f"past_key_values.{i}.key", f"past_key_values.{i}.value"]
    if logits_positions:
        names.append(LOGITS_POSITIONS)
    return names


def output_names(num_layers: int) -> list[str]:
    names = ["logits"]
    for i in range(num_layers):
        names += [f"present.{i}.key", f"present.{i}.value"]
    return names


def dynamic_axes(inputs: list[str], num_layers: int, last_logits_only: bool, fused: bool = False) -> dict:
    """The symbolic axes; a fused graph's present is as long as its past when one buffer is bound as both."""
    axes: dict[str, dict[int, str]] = {
        "input_ids": {0: "batch", 1: "sequence"},
        "attention_mask": {0: "batch", 1: "past_sequence + sequence"},
        "logits": {0: "batch", 1: "kept"} if last_logits_only else {0: "batch", 1: "sequence"},
    }
    if LOGITS_POSITIONS in inputs:
        axes[LOGITS_POSITIONS] = {0: "kept"}
    if "position_ids" in inputs:
        axes["position_ids"] = {0: "batch", 1: "sequence"}
    past, present = ("past_sequence", "present_sequence") if fused else ("past_sequence", "past_sequence + sequence")
    for i in range(num_layers):
        for kind in ("key", "value"):
            axes[f"past_key_values.{i}.{kind}"] = {0: "batch", 2: past}
            axes[f"present.{i}.{kind}"] = {0: "batch", 2: present}
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
        # The positions whose logits are kept (LOGITS_POSITIONS, after the pasts), or 0: every position.
        keep = rest[2 * self.num_layers] if self.last_logits_only else 0
        out = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            cache=DynamicCache(ddp_cache_data=past),
            use_cache=True,
            # Positions picked before the vocabulary projection; 0 keeps all positions.
            logits_to_keep=keep,
            **kwargs,
        )
        presents = []
        for layer in out.cache.layers:
            presents += [layer.keys, layer.values]
        # Samplers work in float32 whatever the weights are; the cast costs [batch, 1, vocab] floats.
        return (out.logits.float(), *presents)

"""The fused layout: each attention traced as onnxruntime's GroupQueryAttention over one KV buffer.

The graph has onnxruntime-genai's inputs and outputs: input_ids, attention_mask (from which it
derives each row's length and the batch's total length), position_ids, and one
past_key_values.<i>.key|value buffer [batch, kv_heads, capacity, head_dim] per layer and kind
that the lm binds as the present too, so a decode step writes its one new position in place
instead of copying the whole past (kv.SharedKV). Rows are right-padded.

Everything but the attention kernel is transformers' own code, traced as it runs: the
projections, the family's rotary (partial, interleaved, long-context), Qwen3's and Gemma's
norms. The attention function registered here receives the rotated queries and keys, and the
traced graph calls GroupQueryAttention with the family's scale, logit soft-capping and sliding
window. onnxruntime then applies its own fusions (RMSNorm, skip-add) when it loads the graph.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch
from torch import nn
from transformers import AttentionInterface, DynamicCache

ATTENTION = "muestra_gqa"
# com.microsoft's version of GroupQueryAttention that the graph names.
MS_OPSET = 1


class _GroupQueryAttention(torch.autograd.Function):
    """Traced as one com.microsoft GroupQueryAttention node; run eagerly only to give the tracer shapes.

    The eager forward is the operator's meaning for rows with no padding: the new keys and values
    written after the past's `seqlens_k + 1 - new` valid positions, causal attention over them.
    """

    @staticmethod
    def forward(
        ctx, query, key, value, past_key, past_value, seqlens_k, total, heads, kv_heads, scale, softcap, window
    ):
        batch, new, _ = query.shape
        head_dim = past_key.shape[-1]
        q = query.view(batch, new, heads, head_dim).transpose(1, 2)
        k = key.view(batch, new, kv_heads, head_dim).transpose(1, 2)
        v = value.view(batch, new, kv_heads, head_dim).transpose(1, 2)
        start = int(seqlens_k[0]) + 1 - new
        present_key, present_value = past_key.clone(), past_value.clone()
        present_key[:, :, start : start + new] = k
        present_value[:, :, start : start + new] = v
        keys = present_key[:, :, : start + new].repeat_interleave(heads // kv_heads, dim=1)
        values = present_value[:, :, : start + new].repeat_interleave(heads // kv_heads, dim=1)
        scores = q @ keys.transpose(-1, -2) * scale
        if softcap > 0:
            scores = torch.tanh(scores / softcap) * softcap
        rows = torch.arange(start, start + new)[:, None]
        cols = torch.arange(start + new)[None, :]
        allowed = cols <= rows
        if window > 0:
            allowed &= cols > rows - window
        scores = scores.masked_fill(~allowed, float("-inf"))
        out = torch.softmax(scores.float(), dim=-1).to(q.dtype) @ values
        return out.transpose(1, 2).reshape(batch, new, heads * head_dim), present_key, present_value

    @staticmethod
    def symbolic(g, query, key, value, past_key, past_value, seqlens_k, total, heads, kv_heads, scale, softcap, window):
        out, present_key, present_value = g.op(
            "com.microsoft::GroupQueryAttention",
            query, key, value, past_key, past_value, seqlens_k, total,
            num_heads_i=heads, kv_num_heads_i=kv_heads, scale_f=scale, softcap_f=softcap,
            local_window_size_i=window, outputs=3,
        )  # fmt: skip
        # The tracer has no shape inference for com.microsoft operators: the outputs take their inputs' types.
        out.setType(query.type())
        present_key.setType(past_key.type())
        present_value.setType(past_value.type())
        return out, present_key, present_value


class _Layers:
    """What the traced forward shares with the attention calls: each layer's past and present."""

    def __init__(self, past: list[tuple[torch.Tensor, torch.Tensor]], seqlens_k: torch.Tensor, total: torch.Tensor):
        self.past = past
        self.present: list[tuple[torch.Tensor, torch.Tensor] | None] = [None] * len(past)
        self.seqlens_k = seqlens_k
        self.total = total


_active: _Layers | None = None


class _NewOnlyCache(DynamicCache):
    """A cache that hands each layer's new keys and values back as they are: the kernel holds the past."""

    def update(self, key_states, value_states, layer_idx, *args, **kwargs):
        return key_states, value_states


def _window(module: nn.Module, kwargs: dict) -> int:
    """onnxruntime's local_window_size: transformers' sliding window, which the same positions pass."""
    window = kwargs.get("sliding_window")
    if window is None:
        window = getattr(module, "sliding_window", None)
    return int(window) if window else -1


def _attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, softcap=None, **kwargs):
    """transformers' attention-function signature, computed by GroupQueryAttention over the layer's buffers."""
    if _active is None:
        raise RuntimeError(f"the {ATTENTION!r} attention runs only while the exporter traces a FusedLM")
    layer = module.layer_idx
    batch, _, new, _ = query.shape
    # The tracer hands shapes over as tensors; the operator's attributes must be plain numbers.
    heads, head_dim, kv_heads = int(query.shape[1]), int(query.shape[3]), int(key.shape[1])
    past_key, past_value = _active.past[layer]
    scale = float(scaling) if scaling is not None else head_dim**-0.5
    out, present_key, present_value = _GroupQueryAttention.apply(
        query.transpose(1, 2).reshape(batch, new, heads * head_dim),
        key.transpose(1, 2).reshape(batch, new, kv_heads * head_dim),
        value.transpose(1, 2).reshape(batch, new, kv_heads * head_dim),
        past_key, past_value, _active.seqlens_k, _active.total,
        heads, kv_heads, scale, float(softcap or 0.0), _window(module, kwargs),
    )  # fmt: skip
    _active.present[layer] = (present_key, present_value)
    return out.view(batch, new, heads, head_dim), None


AttentionInterface.register(ATTENTION, _attention)


@contextmanager
def fused_attention(model: nn.Module):
    """While tracing, the model's attention modules call GroupQueryAttention; eager attention again after."""
    before = model.config._attn_implementation
    model.set_attn_implementation(ATTENTION)
    try:
        yield
    finally:
        model.set_attn_implementation(before)


class FusedLM(nn.Module):
    """A causal LM with flat inputs (ids, mask, positions, one buffer per layer and kind) for the tracer."""

    def __init__(self, model: nn.Module, num_layers: int, last_logits_only: bool):
        super().__init__()
        self.model = model
        self.num_layers = num_layers
        self.last_logits_only = last_logits_only

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor, *rest):
        global _active
        # Each row's length less one, and the batch's total length, as GroupQueryAttention takes them.
        seqlens_k = (attention_mask.sum(dim=1) - 1).to(torch.int32)
        total = torch._shape_as_tensor(attention_mask)[1].to(torch.int32)
        past = [(rest[2 * i], rest[2 * i + 1]) for i in range(self.num_layers)]
        _active = _Layers(past, seqlens_k, total)
        try:
            out = self.model(
                input_ids=input_ids,
                position_ids=position_ids,
                cache=_NewOnlyCache(),
                use_cache=True,
                logits_to_keep=1 if self.last_logits_only else 0,
            )
            layers = _active.present
        finally:
            _active = None
        if any(p is None for p in layers):
            missing = [i for i, p in enumerate(layers) if p is None]
            raise RuntimeError(f"layers {missing} did not run the {ATTENTION!r} attention")
        presents = [t for pair in layers for t in pair]
        return (out.logits.float(), *presents)

"""The fused layout: each attention traced as onnxruntime's GroupQueryAttention over one KV buffer.

The graph has onnxruntime-genai's inputs and outputs: input_ids, attention_mask (from which it
derives each row's length and the batch's total length), position_ids, and one
past_key_values.<i>.key|value buffer [batch, kv_heads, capacity, head_dim] per layer and kind
that the lm binds as the present too, so a decode step writes its one new position in place
instead of copying the whole past (kv.SharedKV). Rows are right-padded.

Everything but the attention kernel is transformers' own code, traced as it runs: the
projections, Qwen3's and Gemma's norms, and the family's rotary where the kernel cannot apply
it (partial or interleaved rotary). The attention function registered here receives the
queries and keys, and the traced graph calls GroupQueryAttention with the family's scale, logit
soft-capping and sliding window. Where the family's rotary is the half-rotation over the whole
head (Llama, Qwen2, Qwen3, Mistral, Gemma, Gemma 2, Phi-3, Falcon), the kernel applies it too,
from cos/sin tables the model's own rotary module computes for every position of the context:
transformers' rotary function is traced as the identity, so the graph has no per-layer rotary
operators (about 16 a layer). onnxruntime then applies its own fusions (RMSNorm, skip-add)
when it loads the graph.
"""

from __future__ import annotations

import sys
from contextlib import contextmanager
from dataclasses import dataclass

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
        ctx, query, key, value, past_key, past_value, seqlens_k, total, cos, sin, positions,
        heads, kv_heads, scale, softcap, window,
    ):  # fmt: skip
        batch, new, _ = query.shape
        head_dim = past_key.shape[-1]
        q = query.view(batch, new, heads, head_dim).transpose(1, 2)
        k = key.view(batch, new, kv_heads, head_dim).transpose(1, 2)
        v = value.view(batch, new, kv_heads, head_dim).transpose(1, 2)
        if cos is not None:  # the kernel's rotary: rotate-half, the tables indexed by each token's position
            q, k = _rotate(q, cos, sin, positions), _rotate(k, cos, sin, positions)
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
    def symbolic(
        g, query, key, value, past_key, past_value, seqlens_k, total, cos, sin, positions,
        heads, kv_heads, scale, softcap, window,
    ):  # fmt: skip
        inputs = [query, key, value, past_key, past_value, seqlens_k, total]
        if cos is not None:
            inputs += [cos, sin, positions]
        out, present_key, present_value = g.op(
            "com.microsoft::GroupQueryAttention",
            *inputs,
            num_heads_i=heads, kv_num_heads_i=kv_heads, scale_f=scale, softcap_f=softcap,
            local_window_size_i=window, do_rotary_i=int(cos is not None), rotary_interleaved_i=0, outputs=3,
        )  # fmt: skip
        # The tracer has no shape inference for com.microsoft operators: the outputs take their inputs' types.
        out.setType(query.type())
        present_key.setType(past_key.type())
        present_value.setType(past_value.type())
        return out, present_key, present_value


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """x [batch, heads, new, head_dim] rotated by half-rotation, cos/sin [context, head_dim / 2] at `positions`."""
    c, s = cos[positions], sin[positions]  # [batch, new, head_dim / 2]
    c, s = torch.cat((c, c), dim=-1)[:, None], torch.cat((s, s), dim=-1)[:, None]
    half = x.shape[-1] // 2
    return x * c + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * s


@dataclass(frozen=True)
class KernelRotary:
    """The rotary tables GroupQueryAttention applies, and the modules whose rotary function it replaces."""

    cos: torch.Tensor  # [context, head_dim / 2]
    sin: torch.Tensor
    modules: tuple  # the transformers modeling modules whose apply_rotary_pos_emb the trace skips


def kernel_rotary(model: nn.Module, head_dim: int, context: int) -> KernelRotary | None:
    """The tables for the kernel's own rotary, or None where it cannot apply the family's.

    The kernel rotates the whole head by halves (rotary_interleaved=0). This holds when the model
    has one rotary module whose cos/sin cover the head as two equal halves, and its attention's
    `apply_rotary_pos_emb` computes exactly that (checked on random queries and keys); partial
    rotary (GPT-NeoX, StableLM) and anything else keep transformers' traced rotary.
    """
    rotaries = [m for m in model.modules() if type(m).__name__.endswith("RotaryEmbedding")]
    attentions = [m for m in model.modules() if type(m).__name__.endswith("Attention") and hasattr(m, "layer_idx")]
    modules = tuple({sys.modules[type(m).__module__] for m in attentions})
    if len(rotaries) != 1 or not attentions or not all(hasattr(m, "apply_rotary_pos_emb") for m in modules):
        return None
    dtype = next(model.parameters()).dtype
    with torch.no_grad():
        try:
            cos, sin = rotaries[0](torch.zeros(1, dtype=dtype), position_ids=torch.arange(context)[None])
        except TypeError:  # a rotary module with another signature
            return None
        if cos.dim() != 3 or cos.shape[-1] != head_dim:
            return None
        half = head_dim // 2
        if not (torch.equal(cos[..., :half], cos[..., half:]) and torch.equal(sin[..., :half], sin[..., half:])):
            return None
        cos, sin = cos[0, :, :half].contiguous(), sin[0, :, :half].contiguous()
        generator = torch.Generator().manual_seed(0)
        q = torch.randn(2, 3, 5, head_dim, generator=generator).to(dtype)
        k = torch.randn(2, 1, 5, head_dim, generator=generator).to(dtype)
        positions = torch.tensor([[0, 1, 2, 3, 4], [7, 8, 9, 10, 11]]).clamp(max=context - 1)
        full_cos, full_sin = torch.cat((cos, cos), -1)[positions], torch.cat((sin, sin), -1)[positions]
        for module in modules:
            got_q, got_k = module.apply_rotary_pos_emb(q, k, full_cos, full_sin)
            want_q, want_k = _rotate(q, cos, sin, positions), _rotate(k, cos, sin, positions)
            if not (torch.allclose(got_q, want_q, atol=1e-3) and torch.allclose(got_k, want_k, atol=1e-3)):
                return None
    return KernelRotary(cos, sin, modules)


def _unrotated(q, k, *args, **kwargs):
    return q, k


@contextmanager
def _rotary_in_kernel(modules: tuple):
    """While tracing, transformers' rotary function hands queries and keys on unrotated: the kernel rotates."""
    saved = [(module, module.apply_rotary_pos_emb) for module in modules]
    for module, _ in saved:
        module.apply_rotary_pos_emb = _unrotated
    try:
        yield
    finally:
        for module, function in saved:
            module.apply_rotary_pos_emb = function


class _Layers:
    """What the traced forward shares with the attention calls: each layer's past and present."""

    def __init__(
        self,
        past: list[tuple[torch.Tensor, torch.Tensor]],
        seqlens_k: torch.Tensor,
        total: torch.Tensor,
        rotary: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None,
    ):
        self.past = past
        self.present: list[tuple[torch.Tensor, torch.Tensor] | None] = [None] * len(past)
        self.seqlens_k = seqlens_k
        self.total = total
        # (cos table, sin table, position_ids) when the kernel applies the rotary.
        self.rotary = rotary


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
        past_key, past_value, _active.seqlens_k, _active.total, *(_active.rotary or (None, None, None)),
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

    def __init__(self, model: nn.Module, num_layers: int, last_logits_only: bool, rotary: KernelRotary | None = None):
        super().__init__()
        self.model = model
        self.num_layers = num_layers
        self.last_logits_only = last_logits_only
        self.rotary_modules = rotary.modules if rotary is not None else ()
        if rotary is not None:  # buffers: the tracer writes them as initializers
            self.register_buffer("rotary_cos", rotary.cos, persistent=False)
            self.register_buffer("rotary_sin", rotary.sin, persistent=False)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor, *rest):
        global _active
        # Each row's length less one, and the batch's total length, as GroupQueryAttention takes them.
        seqlens_k = (attention_mask.sum(dim=1) - 1).to(torch.int32)
        total = torch._shape_as_tensor(attention_mask)[1].to(torch.int32)
        past = [(rest[2 * i], rest[2 * i + 1]) for i in range(self.num_layers)]
        # The positions whose logits are kept (logits_positions, after the pasts), or 0: every position.
        keep = rest[2 * self.num_layers] if self.last_logits_only else 0
        rotary = (self.rotary_cos, self.rotary_sin, position_ids) if self.rotary_modules else None
        _active = _Layers(past, seqlens_k, total, rotary)
        try:
            with _rotary_in_kernel(self.rotary_modules):
                out = self.model(
                    input_ids=input_ids,
                    position_ids=position_ids,
                    cache=_NewOnlyCache(),
                    use_cache=True,
                    logits_to_keep=keep,
                )
            layers = _active.present
        finally:
            _active = None
        if any(p is None for p in layers):
            missing = [i for i, p in enumerate(layers) if p is None]
            raise RuntimeError(f"layers {missing} did not run the {ATTENTION!r} attention")
        presents = [t for pair in layers for t in pair]
        return (out.logits.float(), *presents)

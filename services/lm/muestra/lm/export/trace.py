"""Tracing a transformers causal LM to the ONNX graph the lm serves: the wrapper, its example inputs, its fusions."""

from __future__ import annotations

import shutil
import warnings
from contextlib import nullcontext
from pathlib import Path

import onnx
import torch

from muestra.lm.export.families import FlatCacheLM, dynamic_axes, input_names, kv_shape, output_names, static_rope
from muestra.lm.export.fuse import fuse_for_decode
from muestra.lm.export.fused import MS_OPSET, FusedLM, fused_attention
from muestra.lm.export.simplify import constant_reshapes

OPSET = 17


def trace_graph(
    model, family, num_layers: int, last_logits_only: bool, staging: Path, shared: bool, rotary, external_over: int
) -> tuple[bool, dict[str, int]]:
    """Trace the wrapped model and write staging/model.onnx, its weights in model.onnx.data beyond `external_over`
    bytes; returns whether they went there, and the fusions made."""
    # eval() on the wrapper too: the exporter restores the wrapper's mode afterwards, recursively.
    if shared:
        wrapper = FusedLM(model, num_layers, last_logits_only, rotary).eval()
    else:
        wrapper = FlatCacheLM(model, family, num_layers, last_logits_only).eval()
    kv = kv_shape(model)
    # Distinct sizes on every dynamic axis, so the tracer cannot confuse one axis with another; a
    # shared buffer has room beyond the positions the step fills.
    batch, seq, past = 2, 3, 5
    room = past + seq + 3 if shared else past
    ids = torch.randint(2, model.config.vocab_size, (batch, seq))
    mask = torch.ones(batch, past + seq, dtype=torch.int64)
    args = [ids, mask]
    if family.position_ids or shared:
        args.append(torch.arange(past, past + seq).expand(batch, seq).contiguous())
    dtype = next(model.parameters()).dtype
    for _ in range(2 * num_layers):
        args.append(torch.zeros(batch, kv.num_kv_heads, room, kv.head_dim, dtype=dtype))
    if last_logits_only:
        args.append(torch.tensor([0, seq - 1]))
    raw_dir = staging / "raw"
    raw_dir.mkdir()
    names = input_names(family, num_layers, shared, logits_positions=last_logits_only)
    fused = fused_attention(model) if shared else nullcontext()
    with torch.no_grad(), warnings.catch_warnings(), static_rope(model), fused:
        warnings.simplefilter("ignore")
        torch.onnx.export(
            wrapper,
            tuple(args),
            str(raw_dir / "model.onnx"),
            input_names=names,
            output_names=output_names(num_layers),
            dynamic_axes=dynamic_axes(names, num_layers, last_logits_only, shared),
            opset_version=OPSET,
            do_constant_folding=True,
            dynamo=False,
            custom_opsets={"com.microsoft": MS_OPSET} if shared else None,
        )
    graph = onnx.load(str(raw_dir / "model.onnx"))
    constant_reshapes(graph)
    fusions = fuse_for_decode(graph)
    weight_bytes = sum(len(t.raw_data) for t in graph.graph.initializer)
    external = weight_bytes > external_over
    onnx.save_model(
        graph,
        str(staging / "model.onnx"),
        save_as_external_data=external,
        all_tensors_to_one_file=True,
        location="model.onnx.data",
    )
    shutil.rmtree(raw_dir)
    return external, fusions

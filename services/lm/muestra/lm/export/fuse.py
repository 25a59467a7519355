"""Fewer, larger kernels per decode step: sibling MatMuls merged, residual Adds fused into the norms.

A decode step of a small model on a CPU spends a fifth of its time between kernels (onnxruntime's
profiler on the 100M Llama at int4: 179 kernel calls, about 6 us of dispatch each). Two rewrites cut
the count without changing what is computed:

- MatMuls that read the same activation with weights of their own (an attention layer's q, k and v
  projections; an MLP's gate and up projections) become one MatMul over the weights side by side,
  then a Split; the quantizers see one larger weight (block-wise 4-bit scales are per column block,
  so int4 weights come out the same). Where the three outputs are exactly a GroupQueryAttention's
  query, key and value, the kernel reads the packed projection itself and no Split is needed.
- onnxruntime's transformer optimizer fuses each residual Add into the RMSNorm after it
  (SkipSimplifiedLayerNormalization); onnxruntime does not do that when it loads a graph.

The exporter validates the rewritten graph against transformers as it does any other.
"""

from __future__ import annotations

import logging
from contextlib import contextmanager

import numpy as np
import onnx
from onnx import helper, numpy_helper

# Initializers above this many bytes leave the model while onnxruntime's fusions run their shape
# inference over it (protobuf serializes at most 2 GiB); none of the fusions reads their values.
_SET_ASIDE_BYTES = 4096


def fuse_for_decode(model: onnx.ModelProto) -> dict[str, int]:
    """Rewrite `model` in place; returns how many of each rewrite were made."""
    merged, packed = merge_sibling_matmuls(model)
    return {"merged_matmuls": merged, "packed_attention": packed, "skip_norms": skip_norms(model)}


def merge_sibling_matmuls(model: onnx.ModelProto) -> tuple[int, int]:
    """Merge MatMuls that share their activation input; returns (groups merged, attentions fed packed)."""
    graph = model.graph
    _bypass_identities(graph)
    weights = {t.name: t for t in graph.initializer}
    readers: dict[str, list] = {}
    for node in graph.node:
        for name in node.input:
            readers.setdefault(name, []).append(node)
    groups: dict[str, list] = {}
    for node in graph.node:
        if node.op_type == "MatMul" and _own_weight(node.input[1], weights, readers):
            groups.setdefault(node.input[0], []).append(node)

    merged = packed = 0
    for activation, nodes in groups.items():
        if len(nodes) < 2:
            continue
        biases = [_bias_add(node, weights, readers) for node in nodes]
        if any(b is None for b in biases) and not all(b is None for b in biases):
            biases = [None] * len(nodes)  # mixed: leave the Adds where they are
        arrays = [numpy_helper.to_array(weights[node.input[1]]) for node in nodes]
        if len({a.dtype for a in arrays}) != 1:
            continue
        widths = [a.shape[1] for a in arrays]
        stem = nodes[0].name or nodes[0].output[0]
        fused_weight = f"{stem}/merged_weight"
        graph.initializer.append(numpy_helper.from_array(np.concatenate(arrays, axis=1), fused_weight))
        fused_out = f"{stem}/merged_output"
        new_nodes = [helper.make_node("MatMul", [activation, fused_weight], [fused_out], name=f"{stem}/merged")]
        outputs = [node.output[0] for node in nodes]
        if biases[0] is not None:
            bias_name = f"{stem}/merged_bias"
            bias = np.concatenate([numpy_helper.to_array(weights[_constant_input(add, weights)]) for add in biases])
            graph.initializer.append(numpy_helper.from_array(bias, bias_name))
            biased = f"{stem}/merged_biased"
            new_nodes.append(helper.make_node("Add", [fused_out, bias_name], [biased], name=f"{stem}/merged_bias_add"))
            fused_out, outputs = biased, [add.output[0] for add in biases]
        attention = _packed_attention(outputs, readers, graph)
        if attention is not None:
            attention.input[0], attention.input[1], attention.input[2] = fused_out, "", ""
            packed += 1
        else:
            sizes = f"{stem}/merged_split_sizes"
            graph.initializer.append(numpy_helper.from_array(np.asarray(widths, dtype=np.int64), sizes))
            new_nodes.append(
                helper.make_node("Split", [fused_out, sizes], outputs, axis=-1, name=f"{stem}/merged_split")
            )
        old = set(id(n) for n in nodes) | set(id(b) for b in biases if b is not None)
        at = min(i for i, n in enumerate(graph.node) if id(n) in old)
        for node in [n for n in graph.node if id(n) in old]:
            graph.node.remove(node)
        for offset, node in enumerate(new_nodes):
            graph.node.insert(at + offset, node)
        merged += 1
    _drop_unused_initializers(model)
    return merged, packed


def skip_norms(model: onnx.ModelProto) -> int:
    """Fuse residual Adds into the RMSNorms after them with onnxruntime's own fusions; returns how many."""
    import onnxruntime.transformers  # noqa: F401  (puts the optimizer's modules on sys.path)
    from onnxruntime.transformers.fusion_simplified_layernorm import (
        FusionSimplifiedLayerNormalization,
        FusionSkipSimplifiedLayerNormalization,
    )
    from onnxruntime.transformers.onnx_model import OnnxModel

    quiet = logging.getLogger("onnxruntime.transformers")
    level = quiet.level
    quiet.setLevel(logging.ERROR)
    try:
        with _weights_set_aside(model):
            wrapped = OnnxModel(model)
            wrapped.remove_useless_cast_nodes()
            FusionSimplifiedLayerNormalization(wrapped).apply()
            FusionSkipSimplifiedLayerNormalization(wrapped).apply()
            wrapped.prune_graph(allow_remove_graph_inputs=False)
            # The fusions' shape inference leaves shapes for its sample sizes behind.
            del model.graph.value_info[:]
    finally:
        quiet.setLevel(level)
    return sum(node.op_type == "SkipSimplifiedLayerNormalization" for node in model.graph.node)


def _own_weight(name: str, weights: dict, readers: dict) -> bool:
    """A 2-D initializer that only this one MatMul reads (tied weights stay apart)."""
    tensor = weights.get(name)
    return tensor is not None and len(tensor.dims) == 2 and len(readers.get(name, ())) == 1


def _bias_add(node, weights: dict, readers: dict):
    """The Add of a 1-D bias that is this MatMul's only reader, or None."""
    after = readers.get(node.output[0], [])
    if len(after) != 1 or after[0].op_type != "Add":
        return None
    bias = _constant_input(after[0], weights)
    if bias is None or len(weights[bias].dims) != 1:
        return None
    return after[0]


def _constant_input(add, weights: dict) -> str | None:
    others = [name for name in add.input if name in weights]
    return others[0] if len(others) == 1 else None


def _packed_attention(outputs: list[str], readers: dict, graph):
    """The GroupQueryAttention whose query, key and value are exactly these outputs, or None."""
    if len(outputs) != 3 or any(o in {g.name for g in graph.output} for o in outputs):
        return None
    targets = []
    for index, name in enumerate(outputs):
        after = readers.get(name, [])
        if len(after) != 1 or after[0].op_type != "GroupQueryAttention" or list(after[0].input).index(name) != index:
            return None
        targets.append(after[0])
    return targets[0] if all(t is targets[0] for t in targets) else None


def _bypass_identities(graph) -> None:
    """Readers of an Identity read its input instead (the Identities left by constant_reshapes)."""
    kept_names = {o.name for o in graph.output}
    source = {}
    for node in graph.node:
        if node.op_type == "Identity" and node.output[0] not in kept_names:
            source[node.output[0]] = source.get(node.input[0], node.input[0])
    if not source:
        return
    for node in graph.node:
        for i, name in enumerate(node.input):
            if name in source:
                node.input[i] = source[name]
    for node in [n for n in graph.node if n.op_type == "Identity" and n.output[0] in source]:
        graph.node.remove(node)


def _drop_unused_initializers(model: onnx.ModelProto) -> None:
    graph = model.graph
    needed = {name for node in graph.node for name in node.input} | {o.name for o in graph.output}
    for tensor in [t for t in graph.initializer if t.name not in needed]:
        graph.initializer.remove(tensor)


@contextmanager
def _weights_set_aside(model: onnx.ModelProto):
    """Large initializers keep their names, types and shapes but not their bytes for the duration."""
    kept = {}
    for tensor in model.graph.initializer:
        if tensor.HasField("raw_data") and len(tensor.raw_data) > _SET_ASIDE_BYTES:
            kept[tensor.name] = tensor.raw_data
            tensor.ClearField("raw_data")
    try:
        yield
    finally:
        for tensor in model.graph.initializer:
            if tensor.name in kept:
                tensor.raw_data = kept.pop(tensor.name)
        if kept:
            raise RuntimeError(f"the fusions dropped initializers they should have kept: {sorted(kept)[:3]}")

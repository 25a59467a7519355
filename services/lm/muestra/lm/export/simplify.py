"""Constant Reshape targets where symbolic shapes allow: the traced graph computes each at run time.

The tracer writes every `view(*x.shape[:-1], heads, head_dim)` as Shape -> Gather -> Unsqueeze ->
Concat -> Reshape, because batch and sequence are dynamic axes. onnxruntime cannot fold such a
chain (its values depend on the input), so a decode step of a 12-layer Llama ran about 290 of
these small kernels, a quarter of its kernel time at int4. onnxruntime's symbolic shape inference
knows each Reshape's output in terms of the graph's dimension names (batch, sequence); where every
output dimension is a number, or the input's own dimension at that place (0: copy it), or at most
one is left (-1: inferred), the target becomes a constant, and onnxruntime then drops the unused
shape arithmetic when it loads the graph. A Reshape whose target equals its input's shape becomes
an Identity; a Reshape of a Reshape reads the first one's input. The exporter validates the
rewritten graph against transformers as it does any other.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

# Initializers above this many elements leave the copy that shape inference reads (their shapes are
# kept as graph inputs): the inference then never serializes the weights (protobuf caps it at 2 GiB).
_INFERENCE_WEIGHT_ELEMENTS = 1024


def constant_reshapes(model: onnx.ModelProto) -> int:
    """Rewrite `model`'s Reshape targets in place; returns how many Reshapes were rewritten."""
    from onnxruntime.tools.symbolic_shape_infer import SymbolicShapeInference

    _cancel_transposes(model)
    inferred = SymbolicShapeInference.infer_shapes(_without_weights(model), auto_merge=True)
    graph = inferred.graph
    shapes = {
        info.name: _dims(info)
        for info in (*graph.value_info, *graph.input, *graph.output, *model.graph.input)
        if info.type.HasField("tensor_type")
    }
    for tensor in model.graph.initializer:
        shapes[tensor.name] = list(tensor.dims)
    producers = {output: node for node in model.graph.node for output in node.output}

    rewritten = 0
    for node in model.graph.node:
        if node.op_type != "Reshape" or any(a.name == "allowzero" and a.i for a in node.attribute):
            continue
        source = _through_identities(node.input[0], producers)
        inner = producers.get(source)
        # A Reshape of a Reshape: the outer one's output depends only on the data, not the inner shape
        # (the inner one stays while anything else reads it).
        if inner is not None and inner.op_type == "Reshape":
            source = _through_identities(inner.input[0], producers)
        target = _target(shapes.get(source), shapes.get(node.output[0]))
        if target is None:
            continue
        if shapes[node.output[0]] == shapes[source]:  # the same shape: no reshape at all
            node.op_type = "Identity"
            del node.attribute[:]
            del node.input[1:]
            node.input[0] = source
        else:
            name = f"{node.output[0]}/constant_shape"
            model.graph.initializer.append(numpy_helper.from_array(np.asarray(target, dtype=np.int64), name))
            node.input[0], node.input[1] = source, name
        rewritten += 1
    _drop_unused(model)
    return rewritten


def _through_identities(name: str, producers: dict) -> str:
    while (node := producers.get(name)) is not None and node.op_type == "Identity":
        name = node.input[0]
    return name


def _cancel_transposes(model: onnx.ModelProto) -> None:
    """A Transpose of a Transpose whose permutations undo each other becomes an Identity of the first's input.

    The traced attention transposes heads to the front for transformers' rotary and back for the
    kernel; with the transposes gone, the Reshapes around them meet and cancel too.
    """
    producers = {output: node for node in model.graph.node for output in node.output}
    for node in model.graph.node:
        inner = producers.get(node.input[0]) if node.op_type == "Transpose" else None
        if inner is None or inner.op_type != "Transpose":
            continue
        outer_perm, inner_perm = _perm(node), _perm(inner)
        if outer_perm is None or inner_perm is None or len(outer_perm) != len(inner_perm):
            continue
        if [inner_perm[i] for i in outer_perm] == list(range(len(outer_perm))):
            node.op_type = "Identity"
            del node.attribute[:]
            node.input[0] = inner.input[0]


def _perm(node) -> list[int] | None:
    return next((list(a.ints) for a in node.attribute if a.name == "perm"), None)


def _dims(info) -> list[int | str] | None:
    shape = info.type.tensor_type.shape
    if not info.type.tensor_type.HasField("shape"):
        return None
    dims = []
    for dim in shape.dim:
        if dim.HasField("dim_value"):
            dims.append(dim.dim_value)
        elif dim.HasField("dim_param"):
            dims.append(dim.dim_param)
        else:
            return None
    return dims


def _target(source: list | None, output: list | None) -> list[int] | None:
    """The constant Reshape target for these symbolic shapes, or None where it must stay computed."""
    if source is None or output is None:
        return None
    target = []
    for j, dim in enumerate(output):
        if isinstance(dim, int):
            if dim == 0:  # 0 would mean "copy" in the target
                return None
            target.append(dim)
        elif j < len(source) and source[j] == dim:
            target.append(0)
        else:
            target.append(-1)
    return target if target.count(-1) <= 1 else None


def _without_weights(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy whose large initializers are graph inputs of the same type and shape."""
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    kept = []
    for tensor in copy.graph.initializer:
        elements = 1
        for dim in tensor.dims:
            elements *= dim
        if elements > _INFERENCE_WEIGHT_ELEMENTS:
            copy.graph.input.append(helper.make_tensor_value_info(tensor.name, tensor.data_type, list(tensor.dims)))
        else:
            kept.append(tensor)
    del copy.graph.initializer[:]
    copy.graph.initializer.extend(kept)
    del copy.graph.value_info[:]
    return copy


def _drop_unused(model: onnx.ModelProto) -> None:
    """Remove nodes and initializers nothing reads any more (the shape arithmetic behind the old targets)."""
    graph = model.graph
    if any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for n in graph.node for a in n.attribute):
        return  # a subgraph may read outer names: leave the pruning to onnxruntime
    while True:
        needed = {output.name for output in graph.output}
        for node in graph.node:
            needed.update(node.input)
        unused = [n for n in graph.node if not any(o in needed for o in n.output)]
        if not unused:
            break
        for node in unused:
            graph.node.remove(node)
    needed = {name for node in graph.node for name in node.input} | {o.name for o in graph.output}
    stale = [t for t in graph.initializer if t.name not in needed]
    for tensor in stale:
        graph.initializer.remove(tensor)

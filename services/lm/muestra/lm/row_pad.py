"""Row-invariant steps: a forward of one activation row runs the kernels a forward of several rows runs.

onnxruntime's MatMulNBits with float activations (accuracy levels 0 to 3: 4-bit weights computed in float,
the default model's layers) takes another kernel when a call has exactly one row of activations: a fused
dequantize-and-dot loop (`SQ4BitGemmM1Kernel_CompFp32`), where two or more rows dequantize a panel of the
weights and run the float GEMM kernel. The two sum each output in another order, so a row's result alone
differs from the same row beside others in the last bits (~3e-6 per layer, ~6e-5 on the default model's
logits), and a seeded sample that lands near a boundary between two tokens changes with the batch. The
multi-row path sums every row in the same order whatever the number of rows, so a row is bitwise the same
among 2, 3, 8 or 17 rows. With several threads, each 128-row slice of the rows is one call, so a slice of one
row (rows % 128 == 1) takes the one-row kernel too.

The pass here gives the graph an input, ROW_PADS, that appends that many zero rows to the batch after the
token embedding. They run through every row-wise operator beside the real rows, are cut off before each
GroupQueryAttention (the only operator that ties a row to its KV) and before the vocabulary projection, and
are appended again after each attention. A zero row stays zero through the layers (the RMS norm of zeros is
zero), so it costs its rows' work and nothing else. The lm feeds one when a step has rows % 128 == 1, so the
real rows get the several-row kernels whatever the batch. A step of one row alone (a lone request decoding)
costs about 1.7x its time that way, so it is padded only when its caller asks (DecodeRequest.row_invariant;
the gateway asks for requests that give a seed); every other such step always is.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper

from muestra.lm.int8_activations import quantizes_activations

# The graph input: int64 [6], the Pad op's pads for a [batch, positions, hidden] tensor (rows added at the end).
ROW_PADS = "muestra_row_pads"
# MLAS runs a MatMulNBits call's rows in slices of this many (one per thread's share).
ROW_SLICE = 128
_EMBEDDINGS = ("Gather", "GatherBlockQuantized")


_NONE = np.zeros(6, dtype=np.int64)
_ONE = np.array([0, 0, 0, 1, 0, 0], dtype=np.int64)


def pads(rows: int, lone: bool) -> np.ndarray:
    """ROW_PADS for a step of `rows` activation rows (batch rows x new positions). A step of one row alone is
    padded only when `lone` (it costs ~1.7x that step); a one-row slice of more rows costs next to nothing."""
    return _ONE if rows % ROW_SLICE == 1 and (rows > 1 or lone) else _NONE


def has_one_row_kernels(graph: onnx.GraphProto) -> bool:
    """Whether a node of the graph computes a row alone otherwise than beside others (see the module's text)."""
    # MatMulNBits on int8 activations (accuracy level 4) has no separate one-row kernel; on float ones it has.
    return any(node.op_type == "MatMulNBits" and not quantizes_activations(node) for node in graph.node)


def add_row_pads(model: onnx.ModelProto) -> str:
    """Add ROW_PADS to a GroupQueryAttention graph in place; "" when done, else why it was left as it is."""
    graph = model.graph
    if not has_one_row_kernels(graph):
        return "no operator has a one-row kernel"
    nodes = list(graph.node)
    attention = [n for n in nodes if n.op_type == "GroupQueryAttention"]
    if not attention:
        return "no GroupQueryAttention node (the pass cuts the padding rows off around it)"
    embedding = [n for n in nodes if n.op_type in _EMBEDDINGS and "input_ids" in n.input[:2]]
    if len(embedding) != 1:
        return f"{len(embedding)} embedding lookups of input_ids (want 1)"
    logits_at = [n for n in nodes if "logits_positions" in n.input]
    if len(logits_at) != 1:
        return f"{len(logits_at)} nodes take logits_positions (want 1)"

    added: list[onnx.NodeProto] = []
    uses: dict[str, list[tuple[onnx.NodeProto, int]]] = {}
    for node in nodes:
        for i, name in enumerate(node.input):
            uses.setdefault(name, []).append((node, i))

    def padded(name: str) -> None:
        """Every reader of `name` (other than the graph's outputs) reads it with the padding rows appended."""
        out = f"{name}/row_pad"
        readers = uses.get(name, [])
        added.append(helper.make_node("Pad", [name, ROW_PADS], [out], name=f"{name}/RowPad"))
        for node, i in readers:
            node.input[i] = out

    def cut(node: onnx.NodeProto, i: int) -> None:
        """`node` reads its input i without the padding rows."""
        name = node.input[i]
        out = f"{name}/row_cut"
        if not any(n.output[0] == out for n in added):
            added.append(
                helper.make_node("Slice", [name, "row_pad/zero", "row_pad/batch", "row_pad/zero"], [out], name=out)
            )
        node.input[i] = out

    batch = [  # the batch's real rows, from input_ids: int64 [1]
        helper.make_node("Shape", ["input_ids"], ["row_pad/shape"], name="row_pad/Shape"),
        helper.make_node(
            "Slice", ["row_pad/shape", "row_pad/zero", "row_pad/one"], ["row_pad/batch"], name="row_pad/Batch"
        ),
    ]
    padded(embedding[0].output[0])
    for node in attention:
        for i in range(3):  # query (or packed query, key, value), key, value
            if i < len(node.input) and node.input[i]:
                cut(node, i)
    for node in attention:  # after the cuts: a cut reads the padded tensor, the padded output is read by others
        padded(node.output[0])
    cut(logits_at[0], 0)

    graph.initializer.extend(
        [
            helper.make_tensor("row_pad/zero", TensorProto.INT64, [1], [0]),
            helper.make_tensor("row_pad/one", TensorProto.INT64, [1], [1]),
        ]
    )
    graph.input.append(helper.make_tensor_value_info(ROW_PADS, TensorProto.INT64, [6]))
    # Keep the graph in topological order: each added node goes right before the first node that reads it.
    first_reader: dict[str, int] = {}
    for index, node in enumerate(nodes):
        for name in node.input:
            first_reader.setdefault(name, index)
    before: dict[int, list[onnx.NodeProto]] = {}
    for node in added:
        before.setdefault(first_reader[node.output[0]], []).append(node)
    del graph.node[:]
    graph.node.extend(batch)
    for index, node in enumerate(nodes):
        graph.node.extend(before.get(index, []))
        graph.node.append(node)
    return ""

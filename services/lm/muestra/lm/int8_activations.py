"""Graphs that quantize activations to int8 on the way to their KV cannot verify drafts exactly.

A step over several positions runs other attention kernels than a one-token step; their results differ by
float rounding (~1e-6). A node that then quantizes activations to int8 turns some of those differences into
whole quantization steps, so the KV a drafted position leaves differs from a one-token step's (up to 0.03 in
the tests' fixture) and later greedy tokens change. A quantizing node that feeds only the logits (the
vocabulary projection) keeps its differences in that position's logits, where they matter only at a near-tie.
"""

from __future__ import annotations

from collections.abc import Collection

import onnx

# Operators that always quantize their float input to int8 (onnxruntime's dynamic quantization).
_ALWAYS_QUANTIZING = frozenset(
    {"DynamicQuantizeLinear", "MatMulInteger", "DynamicQuantizeMatMul", "MatMulIntegerToFloat"}
)
# MatMulNBits quantizes its activations to int8 at this accuracy level only (the others compute in floats).
_INT8_ACCURACY_LEVEL = 4


def quantizes_activations(node: onnx.NodeProto) -> bool:
    """Whether the node quantizes its float activations to int8."""
    if node.op_type == "MatMulNBits":
        return _accuracy_level(node) == _INT8_ACCURACY_LEVEL
    return node.op_type in _ALWAYS_QUANTIZING


def int8_activations_before_kv(graph: onnx.GraphProto, kv_outputs: Collection[str]) -> onnx.NodeProto | None:
    """The first node (in graph order) that quantizes activations to int8 and feeds a KV output, or None."""
    nodes = list(graph.node)
    producer = {name: i for i, node in enumerate(nodes) for name in node.output if name}
    # Walk producer edges backwards from the KV outputs: every node whose result reaches the KV.
    feeds_kv: set[int] = set()
    pending = [producer[name] for name in kv_outputs if name in producer]
    while pending:
        i = pending.pop()
        if i not in feeds_kv:
            feeds_kv.add(i)
            pending.extend(producer[name] for name in nodes[i].input if name in producer)
    return next((nodes[i] for i in sorted(feeds_kv) if quantizes_activations(nodes[i])), None)


def describe_quantizer(node: onnx.NodeProto) -> str:
    """'node <name>, <op>' (with MatMulNBits' accuracy level), for messages."""
    op = node.op_type
    if op == "MatMulNBits":
        op += f" accuracy_level {_accuracy_level(node)}"
    return f"node {node.name or node.output[0]}, {op}"


def _accuracy_level(node: onnx.NodeProto) -> int:
    # A MatMulNBits without the attribute runs at level 0.
    return next((a.i for a in node.attribute if a.name == "accuracy_level"), 0)

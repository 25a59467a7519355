"""muestra.lm.export.fuse: fewer kernels, the same outputs (small hand-built graphs; the exported
families are checked against transformers in test_export.py)."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from muestra.lm.export.fuse import fuse_for_decode, merge_sibling_matmuls

HIDDEN = 8


def _run(model: onnx.ModelProto, x: np.ndarray) -> list[np.ndarray]:
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, {"x": x})


def _graph(nodes, initializers, outputs) -> onnx.ModelProto:
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", HIDDEN])],
        [helper.make_tensor_value_info(name, TensorProto.FLOAT, None) for name in outputs],
        initializer=[numpy_helper.from_array(a, n) for n, a in initializers.items()],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def _weights(rng, *widths) -> dict[str, np.ndarray]:
    return {f"w{i}": rng.standard_normal((HIDDEN, w)).astype(np.float32) for i, w in enumerate(widths)}


def test_sibling_matmuls_become_one_matmul_and_a_split_with_the_same_outputs():
    rng = np.random.default_rng(0)
    init = _weights(rng, 4, 6, 3)
    nodes = [helper.make_node("MatMul", ["x", f"w{i}"], [f"y{i}"]) for i in range(3)]
    model = _graph(nodes, init, ["y0", "y1", "y2"])
    x = rng.standard_normal((2, 5, HIDDEN)).astype(np.float32)
    before = _run(model, x)
    assert merge_sibling_matmuls(model) == (1, 0)
    assert [n.op_type for n in model.graph.node] == ["MatMul", "Split"]
    for a, b in zip(before, _run(model, x), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)


def test_biases_are_merged_with_their_matmuls():
    rng = np.random.default_rng(1)
    init = _weights(rng, 4, 6)
    init |= {"b0": rng.standard_normal(4).astype(np.float32), "b1": rng.standard_normal(6).astype(np.float32)}
    nodes = []
    for i in range(2):
        nodes.append(helper.make_node("MatMul", ["x", f"w{i}"], [f"m{i}"]))
        # transformers' traced Linear adds the bias first or second; both are read.
        nodes.append(helper.make_node("Add", [f"b{i}", f"m{i}"] if i else [f"m{i}", f"b{i}"], [f"y{i}"]))
    model = _graph(nodes, init, ["y0", "y1"])
    x = rng.standard_normal((1, 3, HIDDEN)).astype(np.float32)
    before = _run(model, x)
    assert merge_sibling_matmuls(model) == (1, 0)
    assert [n.op_type for n in model.graph.node] == ["MatMul", "Add", "Split"]
    for a, b in zip(before, _run(model, x), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)


def test_a_weight_read_elsewhere_is_left_alone():
    """Tied weights (the same initializer read by two nodes) are never copied into a merged one."""
    rng = np.random.default_rng(2)
    init = _weights(rng, 4, 4)
    nodes = [
        helper.make_node("MatMul", ["x", "w0"], ["y0"]),
        helper.make_node("MatMul", ["x", "w1"], ["y1"]),
        helper.make_node("MatMul", ["y1", "w0"], ["y2"], name="reads_w0_again"),
    ]
    model = _graph(nodes, {**init, "w0": rng.standard_normal((HIDDEN, HIDDEN)).astype(np.float32)}, ["y0", "y2"])
    assert merge_sibling_matmuls(model) == (0, 0)
    assert [n.op_type for n in model.graph.node] == ["MatMul"] * 3


def test_residual_adds_fuse_into_the_rmsnorm_after_them():
    """x + h -> RMSNorm, as transformers traces it (Pow, ReduceMean, Add eps, Sqrt, Div, Mul, Mul scale),
    becomes onnxruntime's SkipSimplifiedLayerNormalization with the same output."""
    rng = np.random.default_rng(3)
    init = _weights(rng, HIDDEN)
    init |= {
        "two": np.array(2.0, np.float32),
        "eps": np.array(1e-6, np.float32),
        "one": np.array(1.0, np.float32),
        "scale": rng.standard_normal(HIDDEN).astype(np.float32),
    }
    nodes = [
        helper.make_node("MatMul", ["x", "w0"], ["h"]),
        helper.make_node("Add", ["x", "h"], ["r"]),
        helper.make_node("Pow", ["r", "two"], ["sq"]),
        helper.make_node("ReduceMean", ["sq"], ["ms"], axes=[-1], keepdims=1),
        helper.make_node("Add", ["ms", "eps"], ["mse"]),
        helper.make_node("Sqrt", ["mse"], ["rms"]),
        helper.make_node("Div", ["one", "rms"], ["inv"]),
        helper.make_node("Mul", ["r", "inv"], ["normed"]),
        helper.make_node("Mul", ["scale", "normed"], ["y"]),
        helper.make_node("MatMul", ["y", "w0"], ["out"]),
    ]
    model = _graph(nodes, init, ["out", "r"])
    model.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    x = rng.standard_normal((2, 3, HIDDEN)).astype(np.float32)
    before = _run(model, x)
    counts = fuse_for_decode(model)
    assert counts["skip_norms"] == 1
    assert "SkipSimplifiedLayerNormalization" in {n.op_type for n in model.graph.node}
    assert not {"Pow", "Sqrt", "Div"} & {n.op_type for n in model.graph.node}
    for a, b in zip(before, _run(model, x), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)

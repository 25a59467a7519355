"""Which graphs quantize activations to int8 before their KV (the lm refuses drafts on those, tests/lm/test_drafts.py).

The graphs here are hand-built and never run: only which nodes feed which outputs matters.
"""

from __future__ import annotations

import onnx
import pytest
from onnx import TensorProto, helper

from muestra.lm.int8_activations import describe_quantizer, int8_activations_before_kv
from tests.fixtures.default_model import default_model_or_skip
from tests.models.test_tiny_text_fixture import FIXTURE

KV = ["present.0.key", "present.0.value"]


def graph(*nodes: onnx.NodeProto) -> onnx.GraphProto:
    """A graph of `nodes` from input x to the outputs logits, present.0.key and present.0.value."""
    outputs = [helper.make_tensor_value_info(name, TensorProto.FLOAT, None) for name in ["logits", *KV]]
    return helper.make_graph(
        list(nodes), "tiny", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8])], outputs
    )


def matmul_nbits(output: str, **attributes) -> onnx.NodeProto:
    return helper.make_node(
        "MatMulNBits", ["normed", "weights", "scales"], [output], name="proj", domain="com.microsoft",
        K=8, N=8, bits=4, block_size=16, **attributes,
    )  # fmt: skip


def node(op: str, inputs: list[str], output: str) -> onnx.NodeProto:
    return helper.make_node(op, inputs, [output], name=output)


def kv_from(hidden: str) -> list[onnx.NodeProto]:
    return [node("Mul", [hidden, "rotary"], "present.0.key"), node("Identity", [hidden], "present.0.value")]


def test_an_int8_matmul_nbits_that_feeds_the_kv_is_found():
    layer = graph(
        node("Sigmoid", ["x"], "normed"),
        matmul_nbits("qkv", accuracy_level=4),
        *kv_from("qkv"),
        node("Identity", ["normed"], "logits"),
    )
    quantizer = int8_activations_before_kv(layer, KV)
    assert quantizer is not None and quantizer.name == "proj"
    assert describe_quantizer(quantizer) == "node proj, MatMulNBits accuracy_level 4"


def test_an_int8_matmul_nbits_that_feeds_only_the_logits_is_not():
    """The vocabulary projection: its differences stay in the logits of its own position."""
    head = graph(
        node("Sigmoid", ["x"], "normed"),
        *kv_from("normed"),
        matmul_nbits("logits", accuracy_level=4),
    )
    assert int8_activations_before_kv(head, KV) is None


@pytest.mark.parametrize("attributes", [{"accuracy_level": 0}, {}], ids=["level-0", "no-level"])
def test_a_matmul_nbits_on_float_activations_is_not(attributes):
    layer = graph(node("Sigmoid", ["x"], "normed"), matmul_nbits("qkv", **attributes), *kv_from("qkv"))
    assert int8_activations_before_kv(layer, KV) is None


def test_dynamic_quantize_linear_before_the_kv_is_found():
    """onnxruntime's quantize_dynamic: DynamicQuantizeLinear, then MatMulInteger on its int8 output."""
    layer = graph(
        helper.make_node("DynamicQuantizeLinear", ["x"], ["x_q", "x_scale", "x_zero"], name="quantize"),
        node("MatMulInteger", ["x_q", "weights_q", "x_zero", "weights_zero"], "product"),
        node("Cast", ["product"], "qkv"),
        *kv_from("qkv"),
        node("Identity", ["x"], "logits"),
    )
    quantizer = int8_activations_before_kv(layer, KV)
    assert quantizer is not None and describe_quantizer(quantizer) == "node quantize, DynamicQuantizeLinear"


def kv_outputs(model: onnx.ModelProto) -> list[str]:
    return [output.name for output in model.graph.output if output.name.startswith("present.")]


def test_the_fixture_quantizes_its_layers_activations():
    model = onnx.load(FIXTURE / "model.onnx", load_external_data=False)
    quantizer = int8_activations_before_kv(model.graph, kv_outputs(model))
    assert quantizer is not None
    assert describe_quantizer(quantizer).endswith(", MatMulNBits accuracy_level 4")


def test_the_default_model_quantizes_only_its_vocabulary_projection():
    """4-bit weights on float activations (accuracy level 0) in its layers; 8-bit on int8 for the logits."""
    model = onnx.load(default_model_or_skip() / "model.onnx", load_external_data=False)
    assert int8_activations_before_kv(model.graph, kv_outputs(model)) is None
    levels = [describe_quantizer(n) for n in model.graph.node if n.op_type == "MatMulNBits"]
    assert sum(level.endswith("accuracy_level 4") for level in levels) == 1

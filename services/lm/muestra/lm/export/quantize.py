"""Weight quantization of an fp32 export with onnxruntime's own quantizers.

int8 and int4: `MatMulNBitsQuantizer`, block-wise symmetric 8- or 4-bit weights (MatMulNBits,
vocabulary projection included), activations in float32 or, with accuracy level 4, int8 inside the
kernel, quantized row by row: a row's logits do not depend on the rows batched with it.
int8-dynamic: `quantize_dynamic` (int8 MatMul/Gemm weights, activations quantized per call). It is
1.24-1.37x faster than 8-bit MatMulNBits at 8 rows on the 100M Llama, but DynamicQuantizeLinear takes
one scale over the whole batch, so a row's logits change with its neighbours (0.37 max |Δlogit| on the
default text model), which breaks seeded replays and batch-invariant greedy decoding.
"""

from __future__ import annotations

import logging
from pathlib import Path

import onnx
from onnxruntime.quantization import QuantType, quantize_dynamic


def quantize_int8_dynamic(fp32_path: Path, int8_path: Path, external_threshold: int) -> bool:
    """Write int8_path (MatMul/Gemm weights as int8, activations quantized per call over the whole batch);
    returns whether external."""
    external = fp32_path.with_name(fp32_path.name + ".data").exists() or fp32_path.stat().st_size > external_threshold
    # quantize_dynamic logs a generic "consider pre-processing" warning on the root logger; ours needs none.
    quiet = _DropPreprocessingHint()
    logging.getLogger().addFilter(quiet)
    try:
        quantize_dynamic(
            model_input=fp32_path,
            model_output=int8_path,
            weight_type=QuantType.QInt8,
            # Gather is the embedding table: quantizing it saves memory but hurts quality; keep it fp32.
            op_types_to_quantize=["MatMul", "Gemm"],
            use_external_data_format=external,
            # onnx's shape inference stops at onnxruntime's own operators (SkipSimplifiedLayerNormalization):
            # the MatMuls after one have no inferred type, and every graph quantized here is float32.
            extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT},
        )
    finally:
        logging.getLogger().removeFilter(quiet)
    return external


class _DropPreprocessingHint(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return "pre-processing before quantization" not in record.getMessage()


def gemms_to_matmuls(graph: onnx.GraphProto) -> int:
    """Rewrite each Gemm whose B is a weight as MatMul (+ Add of its bias), which MatMulNBits quantizes and
    Gemm is not (GPT-2's Conv1D layers export as Gemm). Returns how many it rewrote."""
    from onnx import helper, numpy_helper

    weights = {t.name: t for t in graph.initializer}
    rewritten, nodes, transposed_from = 0, [], set()
    for node in graph.node:
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        if (
            node.op_type != "Gemm"
            or node.input[1] not in weights
            or attrs.get("transA", 0)
            or attrs.get("alpha", 1.0) != 1.0
            or attrs.get("beta", 1.0) != 1.0
        ):
            nodes.append(node)
            continue
        weight = node.input[1]
        if attrs.get("transB", 0):
            transposed_from.add(weight)
            transposed = numpy_helper.to_array(weights[weight]).T.copy()
            weight = f"{weight}_transposed"
            graph.initializer.append(numpy_helper.from_array(transposed, weight))
        has_bias = len(node.input) > 2 and node.input[2]
        product = f"{node.output[0]}_matmul" if has_bias else node.output[0]
        nodes.append(helper.make_node("MatMul", [node.input[0], weight], [product], name=f"{node.name}_matmul"))
        if has_bias:
            nodes.append(helper.make_node("Add", [product, node.input[2]], [node.output[0]], name=f"{node.name}_bias"))
        rewritten += 1
    del graph.node[:]
    graph.node.extend(nodes)
    # A weight that only transposed Gemms read is now stored transposed: drop the original.
    used = {name for node in graph.node for name in node.input} | {o.name for o in graph.output}
    unused = [t for t in graph.initializer if t.name in transposed_from and t.name not in used]
    for tensor in unused:
        graph.initializer.remove(tensor)
    return rewritten


# MatMulNBits defaults: the fastest on these CPUs in issue 15's measurements that keeps quality.
NBITS_BLOCK_SIZE = 32
NBITS_ACCURACY_LEVEL = 4


def quantize_nbits(
    fp32_path: Path,
    out_path: Path,
    external_threshold: int,
    *,
    bits: int = 4,
    block_size: int = NBITS_BLOCK_SIZE,
    accuracy_level: int = NBITS_ACCURACY_LEVEL,
) -> bool:
    """Write out_path with every weight MatMul as MatMulNBits; returns whether its weights are external."""
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    model = onnx.load(str(fp32_path))
    gemms_to_matmuls(model.graph)
    quantizer = MatMulNBitsQuantizer(
        model,
        bits=bits,
        block_size=block_size,
        is_symmetric=True,
        accuracy_level=accuracy_level,
        op_types_to_quantize=("MatMul",),
    )
    # The quantizer logs every node it skips (activation x activation MatMuls) at INFO.
    logger = logging.getLogger("onnxruntime.quantization.matmul_nbits_quantizer")
    level = logger.level
    logger.setLevel(logging.WARNING)
    try:
        quantizer.process()
    finally:
        logger.setLevel(level)
    graph = quantizer.model.model
    external = graph.ByteSize() > external_threshold
    onnx.save_model(
        graph, str(out_path), save_as_external_data=external, all_tensors_to_one_file=True,
        location=out_path.name + ".data",
    )  # fmt: skip
    return external

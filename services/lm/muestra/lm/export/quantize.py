"""Weight quantization of an fp32 export with onnxruntime's own quantizers.

int8: `quantize_dynamic` (int8 MatMul/Gemm weights, activations quantized per call), the fastest
8-bit path on these CPUs (issue 15's table: 143-175 tokens/s against 116 for MatMulNBits 8-bit).
int4: `MatMulNBitsQuantizer`, block-wise symmetric 4-bit weights (MatMulNBits, vocabulary
projection included), activations in float32 or, with accuracy level 4, int8 inside the kernel.
"""

from __future__ import annotations

import logging
from pathlib import Path

import onnx
from onnxruntime.quantization import QuantType, quantize_dynamic


def quantize_int8(fp32_path: Path, int8_path: Path, external_threshold: int) -> bool:
    """Write int8_path (MatMul/Gemm weights as int8, activations quantized per call); returns whether external."""
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

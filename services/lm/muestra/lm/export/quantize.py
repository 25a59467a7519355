"""int8 weight quantization of an fp32 export, with onnxruntime's dynamic quantizer."""

from __future__ import annotations

import logging
from pathlib import Path

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
        )
    finally:
        logging.getLogger().removeFilter(quiet)
    return external


class _DropPreprocessingHint(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return "pre-processing before quantization" not in record.getMessage()

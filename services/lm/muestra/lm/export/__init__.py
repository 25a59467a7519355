"""Export a local transformers causal LM to the ONNX folder layout the lm service serves.

The only part of muestra.lm that imports torch and transformers (the `export` extra).
"""

from muestra.lm.export.exporter import METADATA_FILE, ExportError, export_lm

__all__ = ["METADATA_FILE", "ExportError", "export_lm"]

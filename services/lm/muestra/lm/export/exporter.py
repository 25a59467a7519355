"""`export_lm`: a local transformers causal-LM folder -> the optimum-style ONNX folder the lm service loads.

The source is checked and read (source.py) and traced to ONNX (trace.py); the graph is checked against PyTorch,
may take a GGUF file's own quantized blocks or be quantized, and is written with muestra_export.json."""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

import onnx
import torch
import transformers
from transformers import AutoConfig, AutoModelForCausalLM

from muestra.lm.export import checks
from muestra.lm.export.errors import ExportError
from muestra.lm.export.families import FAMILIES, kv_shape, static_rope
from muestra.lm.export.fused import kernel_rotary
from muestra.lm.export.gguf_file import GGUFSource, find_gguf, inspect_gguf, to_transformers_folder
from muestra.lm.export.gguf_weights import RESCORE_TOP, keep_file_quantization
from muestra.lm.export.quantize import NBITS_ACCURACY_LEVEL, NBITS_BLOCK_SIZE, quantize_int8_dynamic, quantize_nbits
from muestra.lm.export.source import check_source, copy_side_files, eval_token_ids, gguf_metadata, served_context
from muestra.lm.export.trace import OPSET, trace_graph

METADATA_FILE = "muestra_export.json"
METADATA_FORMAT = 1
# Above this many bytes of weights the graph keeps its tensors in model.onnx.data (protobuf caps a file at 2 GiB).
EXTERNAL_DATA_THRESHOLD = 1_500_000_000
# An fp32 export whose logits differ more than this from PyTorch is broken, not merely imprecise.
FLOAT32_TOLERANCE = 1e-2
DTYPES = {"float32": torch.float32, "float16": torch.float16}
# int8, int4: MatMulNBits (block-wise, vocabulary projection included, activations quantized row by row);
# int8-dynamic: onnxruntime's dynamic quantizer (one activation scale per call: rows depend on their batch).
QUANTIZE = (None, "int8", "int4", "int8-dynamic")
NBITS = {"int8": 8, "int4": 4}
# fused: GroupQueryAttention over one KV buffer per layer, written in place (the default where the
# family allows it); concat: optimum's layout, whose graph concatenates past and new KV every step.
LAYOUTS = ("fused", "concat")


def export_lm(
    src: Path,
    out: Path,
    *,
    dtype: str = "float32",
    quantize: str | None = None,
    eval_text: str | None = None,
    progress: bool = True,
    last_logits_only: bool = True,
    max_context: int = 0,
    block_size: int = NBITS_BLOCK_SIZE,
    accuracy_level: int | None = None,
    layout: str | None = None,
    dequantize: bool = False,
) -> Path:
    """Export the causal LM in `src` to `out` (which must not exist or be empty) and return `out`.

    `src` is a transformers folder, a GGUF file, or a folder holding one GGUF file. A GGUF file's
    Q4_0, Q4_1 and Q8_0 weights are kept as they are unless `dequantize`; its other weights are
    exported at `dtype` / `quantize`. `max_context` > 0 sets the context length the lm serves, where
    the config names none or to serve less than the config's. `layout` is "fused" or "concat"
    (default: fused where the family allows it).
    """
    src, out = Path(src), Path(out)
    gguf_path = find_gguf(src) if src.exists() else None
    if gguf_path is None:
        return _export(src, out, None, dtype, quantize, eval_text, progress, last_logits_only, max_context,
                       block_size, accuracy_level, layout, dequantize)  # fmt: skip
    source = inspect_gguf(gguf_path, set(FAMILIES))
    if dtype != "float32" and not dequantize:
        raise ExportError(f"dtype={dtype!r} applies to dequantized GGUF weights only; add --dequantize")
    log = _Progress(progress)
    kinds = ", ".join(f"{count} {kind}" for kind, count in sorted(source.tensor_types.items()))
    log.info(f"GGUF {gguf_path.name}: {source.architecture}, tensors {kinds}")
    with tempfile.TemporaryDirectory(prefix=".gguf-", dir=out.parent if out.parent.exists() else None) as unpacked:
        with log.step("loading the GGUF with transformers (dequantized weights, tokenizer, chat template)"):
            to_transformers_folder(source, Path(unpacked))
        return _export(Path(unpacked), out, source, dtype, quantize, eval_text, progress, last_logits_only,
                       max_context, block_size, accuracy_level, layout, dequantize)  # fmt: skip


def _export(
    src: Path,
    out: Path,
    gguf_source: GGUFSource | None,
    dtype: str,
    quantize: str | None,
    eval_text: str | None,
    progress: bool,
    last_logits_only: bool,
    max_context: int,
    block_size: int,
    accuracy_level: int | None,
    layout: str | None,
    dequantize: bool,
) -> Path:
    if dtype not in DTYPES:
        raise ExportError(f"dtype must be one of {sorted(DTYPES)}, got {dtype!r}")
    if quantize not in QUANTIZE:
        raise ExportError(f"quantize must be one of {QUANTIZE}, got {quantize!r}")
    if quantize and dtype != "float32":
        raise ExportError(f"quantize={quantize!r} quantizes the float32 export; use dtype='float32'")
    if block_size < 16 or block_size & (block_size - 1):
        raise ExportError(f"block_size must be a power of two >= 16, got {block_size}")
    if accuracy_level not in (None, 0, 1, 2, 3, 4):
        raise ExportError(f"accuracy_level must be 0 to 4, got {accuracy_level}")
    if layout not in (None, *LAYOUTS):
        raise ExportError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    family = check_source(src)
    if layout == "fused" and not family.fused:
        raise ExportError(
            f"{family.name} cannot use the fused layout: its ALiBi attention bias has no GroupQueryAttention "
            "input; use the concat layout"
        )
    layout = layout or ("fused" if family.fused else "concat")
    shared = layout == "fused"
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ExportError(f"output folder {out} already exists and is not empty")
    log = _Progress(progress)

    with log.step(f"loading {family.name} model from {src}"):
        try:
            config = AutoConfig.from_pretrained(src)
            model = AutoModelForCausalLM.from_pretrained(src, dtype=DTYPES[dtype], attn_implementation="eager")
        except Exception as exc:  # safetensors, torch and transformers each raise their own kinds
            raise ExportError(f"could not load a transformers causal LM from {src}: {exc}") from exc
    model.eval()
    if family.refuse is not None and (reason := family.refuse(config)):
        raise ExportError(f"{src}: {reason}")
    context, context_source = served_context(family, config, max_context)
    kv = kv_shape(model)
    log.info(f"context length {context} ({context_source})")
    eval_ids = eval_token_ids(src, eval_text, context) if eval_text is not None else None

    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        with log.step(f"tracing to ONNX (opset {OPSET}, {kv.num_layers} layers, {dtype}, {layout} layout)"):
            with static_rope(model):  # the frequencies the trace keeps
                rotary = kernel_rotary(model, kv.head_dim, context) if shared else None
            external, fusions = trace_graph(
                model, family, kv.num_layers, last_logits_only, staging, shared, rotary, EXTERNAL_DATA_THRESHOLD
            )
        metadata = {
            "format": METADATA_FORMAT,
            "family": family.name,
            # positions: the last one unless the step names others (logits_positions); all: every position.
            "logits": "positions" if last_logits_only else "all",
            "logits_dtype": "float32",
            "kv_dtype": dtype,
            "weights_dtype": dtype,
            "layout": layout,
            "kv_storage": "shared" if shared else "concat",
            # kernel: GroupQueryAttention rotates queries and keys from cos/sin tables; traced: transformers' code.
            "rotary": "kernel" if rotary is not None else "traced",
            "position_ids": family.position_ids or shared,
            # merged_matmuls: q/k/v and gate/up projections as one MatMul each; skip_norms: residual Adds
            # fused into RMSNorms (muestra.lm.export.fuse).
            "fusions": fusions,
            "num_layers": kv.num_layers,
            "num_kv_heads": kv.num_kv_heads,
            "head_dim": kv.head_dim,
            "context_length": context,
            "context_length_source": context_source,
            "external_data": external,
            "exporter": {"torch": torch.__version__, "transformers": transformers.__version__, "opset": OPSET},
        }
        with log.step("validating with onnxruntime against PyTorch"):
            metadata["validation"] = _validate(model, staging / "model.onnx", config.vocab_size, dtype, shared)
        log.info(f"max |logits(onnxruntime) - logits(torch)| = {metadata['validation']['max_abs_diff']}")

        if gguf_source is not None:
            metadata["gguf"] = gguf_metadata(gguf_source)
            if not dequantize:
                with log.step("carrying the GGUF's own Q4_0/Q4_1/Q8_0 blocks into the graph"):
                    level = 0 if accuracy_level is None else accuracy_level
                    kept = _keep_gguf_weights(staging, gguf_source, level, config.vocab_size)
                metadata["gguf"]["accuracy_level"] = level
                metadata["gguf"]["kept"] = kept
                metadata["weights_dtype"] = "+".join(sorted({key.split("/")[1] for key in kept})) or dtype
                metadata["external_data"] = (staging / "model.onnx.data").exists()
                log.info(f"kept as stored: {kept or 'nothing'}")
                if kept:
                    metadata["validation_gguf"] = {
                        "max_abs_diff": checks.max_abs_diff_against_torch(
                            model, checks.ort_session(staging / "model.onnx"), config.vocab_size, shared=shared
                        ),
                        "reference": "transformers float32 (the file's weights, dequantized)",
                    }
                    if any(key.startswith("rescored/") for key in kept):
                        metadata["validation_gguf"]["rescored_top_logits"] = RESCORE_TOP
        if quantize:
            level = NBITS_ACCURACY_LEVEL if accuracy_level is None else accuracy_level
            nbits = {"block_size": block_size, "accuracy_level": level}
            metadata.update(_quantize(staging, model, config.vocab_size, eval_ids, log, quantize, nbits, shared))
        elif eval_ids is not None:
            with log.step(f"perplexity on {len(eval_ids)} tokens"):
                ppl = checks.perplexity(checks.ort_session(staging / "model.onnx"), eval_ids)
            metadata["perplexity"] = {"tokens": len(eval_ids), dtype: ppl}
            log.info(f"perplexity = {ppl:.4f}")

        copy_side_files(src, staging, config)
        (staging / METADATA_FILE).write_text(json.dumps(metadata, indent=2) + "\n")
        if out.exists():
            out.rmdir()
        staging.rename(out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    log.info(f"wrote {out}")
    return out


def _keep_gguf_weights(staging: Path, source: GGUFSource, accuracy_level: int, vocab_size: int) -> dict[str, int]:
    path = staging / "model.onnx"
    graph = onnx.load(str(path))
    kept = keep_file_quantization(graph, source.path, accuracy_level, vocab_size)
    if kept:
        (staging / "model.onnx.data").unlink(missing_ok=True)
        external = graph.ByteSize() > EXTERNAL_DATA_THRESHOLD
        onnx.save_model(graph, str(path), save_as_external_data=external, all_tensors_to_one_file=True,
                        location="model.onnx.data")  # fmt: skip
    return kept


def _validate(model, onnx_path: Path, vocab_size: int, dtype: str, shared: bool) -> dict:
    try:
        session = checks.ort_session(onnx_path)
        diff = checks.max_abs_diff_against_torch(model, session, vocab_size, shared=shared)
    except Exception as exc:  # onnxruntime's CPU provider lacks some float16 kernels
        if dtype == "float32":
            raise
        return {"max_abs_diff": None, "skipped": f"onnxruntime could not run the {dtype} graph here: {exc}"}
    if dtype == "float32" and not diff <= FLOAT32_TOLERANCE:
        raise ExportError(f"exported graph disagrees with PyTorch: max abs logit diff {diff} > {FLOAT32_TOLERANCE}")
    return {"max_abs_diff": diff, "reference": f"transformers {dtype}", "providers": session.get_providers()}


def _quantize(
    staging: Path,
    model,
    vocab_size: int,
    eval_ids: list[int] | None,
    log: _Progress,
    kind: str,
    nbits: dict,
    shared: bool,
) -> dict:
    fp32_path, quant_path = staging / "model.onnx", staging / f"model.{kind}.onnx"
    fields: dict = {"weights_dtype": "int8" if kind == "int8-dynamic" else kind}
    if eval_ids is not None:
        with log.step(f"float32 perplexity on {len(eval_ids)} tokens"):
            before = checks.perplexity(checks.ort_session(fp32_path), eval_ids, "float32 perplexity")
    if kind == "int8-dynamic":
        with log.step("quantizing weights to int8 (onnxruntime quantize_dynamic)"):
            external = quantize_int8_dynamic(fp32_path, quant_path, EXTERNAL_DATA_THRESHOLD)
        fields["quantization"] = {"method": "quantize_dynamic", "bits": 8, "batch_invariant": False}
    else:
        how = f"block {nbits['block_size']}, accuracy level {nbits['accuracy_level']}"
        with log.step(f"quantizing weights to {kind} (onnxruntime MatMulNBits, {how})"):
            external = quantize_nbits(fp32_path, quant_path, EXTERNAL_DATA_THRESHOLD, bits=NBITS[kind], **nbits)
        fields["quantization"] = {"method": "MatMulNBits", "bits": NBITS[kind], "symmetric": True, **nbits}
    for path in (fp32_path, staging / "model.onnx.data"):
        path.unlink(missing_ok=True)
    quant_path.rename(fp32_path)
    if external:
        (staging / f"model.{kind}.onnx.data").rename(staging / "model.onnx.data")
        _relocate_external_data(fp32_path, "model.onnx.data")
    fields["external_data"] = external
    fields[f"validation_{kind}"] = {
        "max_abs_diff": checks.max_abs_diff_against_torch(
            model, checks.ort_session(fp32_path), vocab_size, shared=shared
        )
    }
    if eval_ids is not None:
        with log.step(f"{kind} perplexity on {len(eval_ids)} tokens"):
            after = checks.perplexity(checks.ort_session(fp32_path), eval_ids, f"{kind} perplexity")
        fields["perplexity"] = {"tokens": len(eval_ids), "float32": before, kind: after}
        log.info(f"perplexity float32 = {before:.4f}, {kind} = {after:.4f} ({(after / before - 1) * 100:+.2f}%)")
    return fields


def _relocate_external_data(model_path: Path, location: str) -> None:
    graph = onnx.load(str(model_path), load_external_data=False)
    # Constant nodes too: the quantizer moves large ones (the rotary tables) to external data as well.
    constants = [a.t for node in graph.graph.node for a in node.attribute if a.HasField("t")]
    for tensor in [*graph.graph.initializer, *constants]:
        for entry in tensor.external_data:
            if entry.key == "location":
                entry.value = location
    onnx.save_model(graph, str(model_path))


class _Progress:
    """One stderr line when a long step starts and one when it ends."""

    def __init__(self, enabled: bool):
        self.enabled = enabled

    def info(self, message: str) -> None:
        if self.enabled:
            print(f"[export-lm] {message}", file=sys.stderr, flush=True)

    @contextmanager
    def step(self, message: str):
        self.info(f"{message} ...")
        started = time.monotonic()
        yield
        self.info(f"{message}: done in {time.monotonic() - started:.1f} s")

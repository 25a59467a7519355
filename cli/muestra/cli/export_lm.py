"""`muestra export-lm SRC OUT`: a local transformers causal LM → the ONNX folder the lm service serves."""

from __future__ import annotations

import sys
from pathlib import Path


def add_parser(sub) -> None:
    parser = sub.add_parser("export-lm", help="export a local transformers causal LM to ONNX (needs torch)")
    parser.add_argument("src", help="transformers model folder (config.json, weights, tokenizer)")
    parser.add_argument("out", help="new folder for model.onnx and the configs")
    parser.add_argument("--dtype", choices=["float32", "float16"], default="float32")
    parser.add_argument(
        "--quantize",
        choices=["int8", "int4"],
        default=None,
        help="quantize the float32 export's weights: int8 (dynamic), int4 (MatMulNBits, block-wise)",
    )
    parser.add_argument("--block-size", type=int, default=32, help="int4: weights per quantization block")
    parser.add_argument(
        "--accuracy-level", type=int, default=4, help="int4: MatMulNBits compute (4: int8 activations, 0: float)"
    )
    parser.add_argument("--eval-text", default=None, help="text file: report perplexity (and its change with int8)")
    parser.add_argument("--all-logits", action="store_true", help="emit logits for every position, not just the last")
    parser.add_argument(
        "--context-length",
        type=int,
        default=0,
        metavar="N",
        help="the context length the lm serves (default: the model's, from its config)",
    )
    parser.add_argument("--quiet", action="store_true")
    parser.set_defaults(run=run)


def run(args) -> int:
    try:
        from muestra.lm.export import ExportError, export_lm
    except ImportError as exc:
        print(f"muestra export-lm needs the exporter: pip install 'muestra-lm[export]' ({exc})", file=sys.stderr)
        return 2
    eval_text = Path(args.eval_text).read_text() if args.eval_text else None
    try:
        out = export_lm(
            Path(args.src),
            Path(args.out),
            dtype=args.dtype,
            quantize=args.quantize,
            eval_text=eval_text,
            progress=not args.quiet,
            last_logits_only=not args.all_logits,
            max_context=args.context_length,
            block_size=args.block_size,
            accuracy_level=args.accuracy_level,
        )
    except ExportError as exc:
        print(f"muestra export-lm: {exc}", file=sys.stderr)
        return 2
    print(out)
    return 0

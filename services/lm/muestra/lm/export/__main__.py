"""python -m muestra.lm.export SRC OUT [--dtype float16] [--quantize KIND] [--dequantize] [--layout concat] [...]

`muestra export-lm` hands its arguments to `main` here: the options are declared once.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from muestra.lm.export.exporter import DTYPES, LAYOUTS, ExportError, export_lm


def main(argv: list[str] | None = None, prog: str = "python -m muestra.lm.export") -> int:
    parser = argparse.ArgumentParser(
        prog=prog,
        description="Export a local transformers causal-LM folder, or a GGUF file, to muestra's ONNX layout "
        "(model.onnx + KV cache, tokenizer, chat template, generation config). Exit 1 on a source or option "
        "that cannot be exported, with one line saying why.",
    )
    parser.add_argument(
        "src",
        type=Path,
        help="a transformers model folder (config.json, weights, tokenizer), a GGUF file, or a folder holding one",
    )
    parser.add_argument("out", type=Path, help="the output folder; must not exist or be empty")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="float32", help="weights and KV-cache dtype")
    parser.add_argument(
        "--quantize",
        choices=["int8", "int4", "int8-dynamic"],
        default=None,
        help="quantize the float32 export's weights: int8, int4 (MatMulNBits, block-wise, row by row); "
        "int8-dynamic (onnxruntime's quantize_dynamic: faster for many rows, but one scale over the whole batch's "
        "activations makes a row's logits depend on the rows beside it)",
    )
    parser.add_argument(
        "--dequantize",
        action="store_true",
        help="GGUF: export the file's weights dequantized, at --dtype/--quantize, instead of keeping its "
        "Q4_0/Q4_1/Q8_0 blocks as they are",
    )
    parser.add_argument("--block-size", type=int, default=32, help="int8/int4: weights per quantization block")
    parser.add_argument(
        "--accuracy-level",
        type=int,
        default=None,
        help="MatMulNBits compute: 4, int8 activations (the default for --quantize); 0, float (the default "
        "for a GGUF's kept weights: the same greedy tokens as transformers on the file's weights; 4 is faster)",
    )
    parser.add_argument(
        "--layout",
        choices=LAYOUTS,
        default=None,
        help="fused: GroupQueryAttention over one KV buffer per layer, written in place (the default, "
        "except BLOOM); concat: the graph concatenates past and new KV every step (optimum's layout)",
    )
    parser.add_argument("--eval-text", type=Path, metavar="FILE", help="report perplexity on this UTF-8 text")
    parser.add_argument(
        "--all-logits",
        action="store_true",
        help="emit logits for every position ([batch, seq, vocab]) instead of only the last ([batch, 1, vocab])",
    )
    parser.add_argument(
        "--context-length",
        type=int,
        default=0,
        metavar="N",
        help="the context length the lm serves (default: the model's, from its config)",
    )
    parser.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    args = parser.parse_args(argv)
    try:
        eval_text = args.eval_text.read_text(encoding="utf-8") if args.eval_text else None
        out = export_lm(
            args.src,
            args.out,
            dtype=args.dtype,
            quantize=args.quantize,
            eval_text=eval_text,
            progress=not args.quiet,
            last_logits_only=not args.all_logits,
            max_context=args.context_length,
            block_size=args.block_size,
            accuracy_level=args.accuracy_level,
            layout=args.layout,
            dequantize=args.dequantize,
        )
    except (ExportError, OSError) as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 1
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())

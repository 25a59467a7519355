"""`muestra export-lm SRC OUT`: a local transformers causal LM → the ONNX folder the lm service serves.

The exporter (muestra-lm's `export` extra: torch, transformers) declares and parses the options;
this subcommand only hands them over, so `muestra export-lm --help` is the exporter's own help.
"""

from __future__ import annotations

import argparse
import sys


def add_parser(sub) -> None:
    parser = sub.add_parser(
        "export-lm",
        help="export a local transformers causal LM to ONNX (needs torch)",
        add_help=False,
        prefix_chars="\0",
    )
    parser.add_argument("arguments", nargs=argparse.REMAINDER)
    parser.set_defaults(run=run)


def run(args) -> int:
    try:
        from muestra.lm.export.__main__ import main
    except ImportError as exc:
        print(f"muestra export-lm needs the exporter: pip install 'muestra-lm[export]' ({exc})", file=sys.stderr)
        return 2
    return main(args.arguments, prog="muestra export-lm")

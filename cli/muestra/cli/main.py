"""The `muestra` command: one subcommand per module in this package."""

from __future__ import annotations

import argparse
import sys

from muestra.cli import export_lm, generate, image, plugins, tokenize, up

# Each module adds its subparser and sets `run`.
COMMANDS = [up, generate, image, tokenize, plugins, export_lm]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="muestra", description="muestra: self-hostable text and image generation")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module in COMMANDS:
        module.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.run(args) or 0)


if __name__ == "__main__":
    sys.exit(main())

"""The `muestra` command: one subcommand per module in this package.

Exit codes: 0 success; 1 a failed request or a user error (one line on standard error); 2 bad
arguments (argparse); 130 interrupted (Ctrl-C); 141 standard output closed early (`| head`).
"""

from __future__ import annotations

import os
import sys

from muestra.cli import chat, export_lm, generate, image, models, plugins, tokenize, up
from muestra.cli.arguments import OneLineParser
from muestra.cli.errors import CliError

# Each module adds its subparser and sets `run`.
COMMANDS = [up, generate, chat, image, tokenize, models, plugins, export_lm]


def build_parser() -> OneLineParser:
    parser = OneLineParser(prog="muestra", description="muestra: self-hostable text and image generation")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module in COMMANDS:
        module.add_parser(sub)
    return parser


def _quiet_stdout() -> None:
    """Point stdout at /dev/null so that the interpreter's last flush does not fail on the closed pipe."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass


def main(argv: list[str] | None = None) -> int:
    from muestra.client import AuthenticationError, MuestraError, UnavailableError

    args = build_parser().parse_args(argv)
    name = f"muestra {args.command}"
    try:
        return int(args.run(args) or 0)
    except CliError as exc:
        print(f"{name}: {exc}", file=sys.stderr)
        return exc.exit_code
    except UnavailableError as exc:
        where = getattr(args, "gateway", None)
        hint = f" (is a gateway serving on {where}? `muestra up` starts one)" if where else ""
        print(f"{name}: {exc}{hint}", file=sys.stderr)
        return 1
    except AuthenticationError as exc:
        print(f"{name}: {exc} (give the gateway's API key with --api-key or MUESTRA_API_KEY)", file=sys.stderr)
        return 1
    except MuestraError as exc:
        print(f"{name}: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"\n{name}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        _quiet_stdout()
        return 141


if __name__ == "__main__":
    sys.exit(main())

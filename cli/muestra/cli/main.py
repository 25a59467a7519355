"""The `muestra` command: one subcommand per module in this package. Its exit codes are EXIT_CODES."""

from __future__ import annotations

import argparse
import os
import sys

from muestra.cli import chat, export_lm, generate, image, models, plugins, tokenize, up
from muestra.cli.arguments import OneLineParser
from muestra.cli.errors import CliError

EXIT_CODES = """exit codes (every failure is one line on standard error):
  0    success
  1    the work failed: the gateway is unreachable or refused the request (its message names the
       field and its limit), a service failed, a model could not be exported, or the result could
       not be written; `muestra up`: a port is taken or a service did not start
  2    the command line is wrong, and nothing was sent or started: an unknown flag, a value out of
       its range, or a file or folder it names that cannot be used (an input missing, unreadable or
       of the wrong kind; an output folder missing or not writable; a model folder `up` cannot serve)
  130  interrupted (Ctrl-C)
  141  standard output closed early (`| head`)"""

# Each module adds its subparser and sets `run`.
COMMANDS = [up, generate, chat, image, tokenize, models, plugins, export_lm]


def build_parser() -> OneLineParser:
    parser = OneLineParser(
        prog="muestra",
        description="muestra: self-hostable text and image generation",
        epilog=EXIT_CODES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module in COMMANDS:
        module.add_parser(sub)
    return parser


def parse_args(parser: OneLineParser, argv: list[str] | None) -> argparse.Namespace:
    """parse_args, but an unknown flag is its subcommand's usage error (`see muestra generate --help`)."""
    args, unknown = parser.parse_known_args(argv)
    if unknown:
        sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        sub.choices[args.command].error(f"unrecognized arguments: {' '.join(unknown)}")
    return args


def _quiet_stdout() -> None:
    """Point stdout at /dev/null so that the interpreter's last flush does not fail on the closed pipe."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass


def main(argv: list[str] | None = None) -> int:
    from muestra.client import AuthenticationError, MuestraError, UnavailableError

    args = parse_args(build_parser(), argv)
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

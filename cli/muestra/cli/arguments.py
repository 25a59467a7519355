"""Argument types that check ranges, and a parser whose errors are one line (exit 2).

Every numeric flag of the CLI uses `Ranged` (tests/cli/test_flag_ranges.py walks the parsers and
refuses a bare `int` or `float`), so that a value out of range is a usage error, not a traceback
from the protobuf field it would have been copied into.
"""

from __future__ import annotations

import argparse
import math
import sys

UINT32_MAX = 2**32 - 1
UINT64_MAX = 2**64 - 1
PORT_MAX = 65535


class OneLineParser(argparse.ArgumentParser):
    """argparse's errors on one line (its usage block goes to --help): `muestra generate: argument ...`."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: {message} (see {self.prog} --help)\n")


class Ranged:
    """An argparse type: an int or float within [low, high]; `low_open` excludes low itself.

    `low`, `high` and `low_open` stay readable, so the tests make out-of-range values from them.
    """

    def __init__(self, kind: type, low: float | None, high: float | None, *, low_open: bool = False) -> None:
        self.kind, self.low, self.high, self.low_open = kind, low, high, low_open
        self.__name__ = kind.__name__  # argparse names the type in "invalid int value: ..."

    def describe(self) -> str:
        what = "an integer" if self.kind is int else "a number"
        low, high = (f"{v:g}" if isinstance(v, float) else str(v) for v in (self.low, self.high))
        if self.low is not None and self.high is not None:
            return f"{what} in ({low}, {high}]" if self.low_open else f"{what} from {low} to {high}"
        if self.low is not None:
            return f"{what} {'above' if self.low_open else 'of at least'} {low}"
        return f"{what} of at most {high}"

    def __call__(self, text: str):
        try:
            value = self.kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {self.describe()}") from None
        if self.kind is float and not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"{text} is not {self.describe()}")
        too_low = self.low is not None and (value <= self.low if self.low_open else value < self.low)
        too_high = self.high is not None and value > self.high
        if too_low or too_high:
            raise argparse.ArgumentTypeError(f"{text} is out of range: give {self.describe()}")
        return value


def integer(low: int | None = 0, high: int | None = UINT32_MAX) -> Ranged:
    return Ranged(int, low, high)


def number(low: float | None = 0.0, high: float | None = None, *, low_open: bool = False) -> Ranged:
    return Ranged(float, low, high, low_open=low_open)


SEED = integer(0, UINT64_MAX)


def check_address(flag: str, address: str) -> str:
    """HOST:PORT with a port from 1 to 65535 (gRPC would wrap 99999 to another port); ValueError says why."""
    host, sep, port = address.rpartition(":")
    if not sep or not host:
        raise ValueError(f"{flag}: {address!r} is not HOST:PORT")
    if not port.isdigit() or not 1 <= int(port) <= PORT_MAX:
        raise ValueError(f"{flag}: the port in {address!r} must be from 1 to {PORT_MAX}")
    return address


def address_type(flag: str):
    """An argparse type for a HOST:PORT flag."""

    def parse(text: str) -> str:
        try:
            return check_address(flag, text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc).removeprefix(f"{flag}: ")) from None

    parse.__name__ = "address"
    return parse


def stderr_is_terminal() -> bool:
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):
        return False

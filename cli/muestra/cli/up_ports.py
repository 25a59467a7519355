"""The ports `muestra up` would bind, checked free before anything starts: a taken one is one line that names the
flag that moves it and a value whose ports are free now.
"""

from __future__ import annotations

import argparse
import errno
import socket

from muestra.cli.arguments import PORT_MAX
from muestra.cli.endpoints import HTTP_PORT_OFFSET
from muestra.cli.errors import CliError
from muestra.cli.up_plan import Child, free_port, http_port, plan


def bind_error(host: str, port: int) -> OSError | None:
    """Why host:port cannot be bound now, or None (SO_REUSEADDR: a recent connection's TIME_WAIT is no owner)."""
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            return exc
    return None


def moving_flag(args, what: str) -> str:
    """The flag that moves the port used for `what` (a Child.ports value)."""
    if what == "gateway HTTP API" and args.http_port is not None:
        return "--http-port"
    if what.endswith(" metrics") and args.metrics_base_port is not None:
        return "--metrics-base-port"
    return "--base-port"


def _free_base_port(args, env: dict) -> int | None:
    """A --base-port, near the one given, whose every port that moves with it is free now."""
    for step in (*range(100, 5001, 100), *range(-100, -5001, -100)):
        candidate = args.base_port + step
        if not 1024 <= candidate <= PORT_MAX - HTTP_PORT_OFFSET:
            continue
        try:
            children, _ = plan(argparse.Namespace(**{**vars(args), "base_port": candidate}), env)
        except CliError:  # its ports would collide with those --http-port or --metrics-base-port give
            continue
        ports = [n for c in children for n, what in c.ports.items() if moving_flag(args, what) == "--base-port"]
        if all(bind_error(args.host, n) is None for n in ports):
            return candidate
    return None


def _free_metrics_base_port(host: str) -> int | None:
    """A --metrics-base-port whose four ports are free now."""
    for _ in range(20):
        first = free_port(host)
        if first + 3 <= PORT_MAX and all(bind_error(host, n) is None for n in range(first, first + 4)):
            return first
    return None


def _instead(args, env: dict, flag: str) -> str:
    """The flag to rerun with so that the port `flag` placed is free: a value checked free now."""
    if flag == "--http-port":
        return f"rerun with --http-port {free_port(args.host)} (free now; -1: no HTTP API)"
    if flag == "--metrics-base-port":
        first = _free_metrics_base_port(args.host)
        if first is None:
            return "rerun with --metrics-base-port -1 (no metrics)"
        return f"rerun with --metrics-base-port {first} (its ports are free now; -1: no metrics)"
    base = _free_base_port(args, env)
    if base is None:
        return "rerun with --base-port 0 (free ports)"
    http = f", the HTTP API on {http_port(base)}" if args.http_port is None else ""
    return f"rerun with --base-port {base} (every port it moves is free now{http}; 0: free ports)"


def check_ports_free(args, children: list[Child], env: dict) -> None:
    """CliError for the first port the stack would bind that cannot be, with flags that would work instead."""
    for child in children:
        for port, what in child.ports.items():
            exc = bind_error(args.host, port)
            if exc is None:
                continue
            where = f"port {port} ({what}) on {args.host}"
            if exc.errno == errno.EADDRNOTAVAIL:
                raise CliError(f"{where} cannot be bound ({exc.strerror}): is --host {args.host} this machine's?")
            why = (
                "is taken; stop what holds it, or"
                if exc.errno == errno.EADDRINUSE
                else f"cannot be bound ({exc.strerror}):"
            )
            raise CliError(f"{where} {why} {_instead(args, env, moving_flag(args, what))}")

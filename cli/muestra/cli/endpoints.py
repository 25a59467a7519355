"""Where the CLI finds the services: a flag, else MUESTRA_<SERVICE>_ADDR, else the stack `muestra up` started.

`muestra up` writes the addresses it serves on to a state file per stack (see muestra.cli.stacks); the
newest running one is the default. Without one, the ports `muestra up` uses by default.
"""

from __future__ import annotations

import os

from muestra.cli.arguments import check_address
from muestra.cli.errors import CliError
from muestra.cli.stacks import running_stack

__all__ = ["api_key", "default_address", "gateway_address", "running_stack"]

# Offsets from the base port (`muestra up --base-port`); only the gateway is meant to be public.
SERVICE_PORT_OFFSETS = {"gateway": 0, "tokenizer": 1, "lm": 2, "diffusion": 3}
# Each service's Prometheus /metrics port is the base port + this + its offset (unless configured).
METRICS_PORT_OFFSET = 10
# The gateway's OpenAI-compatible HTTP API: this port at the default base port, else the base port + the offset.
HTTP_PORT = 8000
HTTP_PORT_OFFSET = 20
DEFAULT_BASE_PORT = 50051


def default_address(service: str) -> str:
    """MUESTRA_<SERVICE>_ADDR, else the running `muestra up`'s address, else `muestra up`'s default port."""
    env = os.environ.get(f"MUESTRA_{service.upper()}_ADDR")
    if env:
        return env
    stack = running_stack()
    if stack and service in stack.get("services", {}):
        return stack["services"][service]
    return f"127.0.0.1:{DEFAULT_BASE_PORT + SERVICE_PORT_OFFSETS[service]}"


def gateway_address(flag: str | None) -> str:
    """--gateway, else the default; CliError (exit 2) for a HOST:PORT whose port is out of range."""
    if flag:
        where = "--gateway"
    elif os.environ.get("MUESTRA_GATEWAY_ADDR"):
        where = "MUESTRA_GATEWAY_ADDR"
    else:
        return default_address("gateway")
    try:
        return check_address(where, flag or os.environ["MUESTRA_GATEWAY_ADDR"])
    except ValueError as exc:
        raise CliError(str(exc), 2) from None


def api_key(flag: str | None) -> str | None:
    """--api-key, else MUESTRA_API_KEY."""
    return flag or os.environ.get("MUESTRA_API_KEY") or None

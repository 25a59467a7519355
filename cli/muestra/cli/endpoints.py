"""Where the CLI finds the services: the ports `muestra up` uses by default, overridable by env."""

from __future__ import annotations

import os

# Offsets from the base port (`muestra up --base-port`); only the gateway is meant to be public.
SERVICE_PORT_OFFSETS = {"gateway": 0, "tokenizer": 1, "lm": 2, "diffusion": 3}
# The gateway's OpenAI-compatible HTTP API.
HTTP_PORT = 8000
DEFAULT_BASE_PORT = 50051


def default_address(service: str) -> str:
    """MUESTRA_<SERVICE>_ADDR, else the loopback port `muestra up` gives that service by default."""
    env = os.environ.get(f"MUESTRA_{service.upper()}_ADDR")
    if env:
        return env
    return f"127.0.0.1:{DEFAULT_BASE_PORT + SERVICE_PORT_OFFSETS[service]}"

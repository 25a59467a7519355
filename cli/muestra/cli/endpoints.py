"""Where the CLI finds the services: a flag, else MUESTRA_<SERVICE>_ADDR, else the stack `muestra up` started.

`muestra up` writes the addresses it serves on to a small state file (MUESTRA_STATE_FILE, default
$XDG_STATE_HOME/muestra/up.json) and removes it on stop; a file whose `muestra up` is gone is ignored.
Without one, the ports `muestra up` uses by default.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

# Offsets from the base port (`muestra up --base-port`); only the gateway is meant to be public.
SERVICE_PORT_OFFSETS = {"gateway": 0, "tokenizer": 1, "lm": 2, "diffusion": 3}
# Each service's Prometheus /metrics port is the base port + this + its offset (unless configured).
METRICS_PORT_OFFSET = 10
# The gateway's OpenAI-compatible HTTP API.
HTTP_PORT = 8000
DEFAULT_BASE_PORT = 50051


def state_file() -> Path:
    if os.environ.get("MUESTRA_STATE_FILE"):
        return Path(os.environ["MUESTRA_STATE_FILE"])
    base = os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state"
    return Path(base) / "muestra" / "up.json"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def running_stack() -> dict | None:
    """What the running `muestra up` wrote ({"pid", "services": {name: address}, "http", ...}), or None."""
    try:
        state = json.loads(state_file().read_text())
        pid = int(state["pid"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return state if _alive(pid) else None


def write_stack(state: dict) -> Path:
    path = state_file()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + f".{os.getpid()}")
    tmp.write_text(json.dumps(state, indent=2) + "\n")
    tmp.replace(path)
    return path


def remove_stack(pid: int) -> None:
    """Remove the state file if it is this process's (another `muestra up` may have written it since)."""
    try:
        if json.loads(state_file().read_text()).get("pid") == pid:
            state_file().unlink()
    except (OSError, ValueError, AttributeError):
        pass


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
    return flag or default_address("gateway")


def api_key(flag: str | None) -> str | None:
    """--api-key, else MUESTRA_API_KEY."""
    return flag or os.environ.get("MUESTRA_API_KEY") or None

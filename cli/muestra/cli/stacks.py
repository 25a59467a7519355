"""The running `muestra up` stacks: one small state file each, keyed by the stack's base port.

Each `muestra up` writes `<state dir>/<base port>.json` once its services are healthy and removes it
on stop; a file whose `muestra up` is gone is ignored (and removed by the next `muestra up`). The
state dir is MUESTRA_STATE_DIR, else $XDG_STATE_HOME/muestra/stacks (~/.local/state/muestra/stacks).
The other commands use the most recently started stack unless --gateway or MUESTRA_GATEWAY_ADDR
says otherwise; `muestra up --list` shows them all.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path


def state_dir() -> Path:
    if os.environ.get("MUESTRA_STATE_DIR"):
        return Path(os.environ["MUESTRA_STATE_DIR"])
    if os.environ.get("MUESTRA_STATE_FILE"):  # the single file of older versions: its folder holds them now
        return Path(os.environ["MUESTRA_STATE_FILE"]).parent
    base = os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state"
    return Path(base) / "muestra" / "stacks"


def state_file(base_port: int) -> Path:
    return state_dir() / f"{base_port}.json"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _read(path: Path) -> dict | None:
    try:
        state = json.loads(path.read_text())
        int(state["pid"]), int(state["base_port"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return state


def running_stacks() -> list[dict]:
    """What each running `muestra up` wrote ({"pid", "base_port", "started", "services", ...}), newest first."""
    try:
        paths = list(state_dir().glob("*.json"))
    except OSError:
        return []
    states = [state for state in map(_read, paths) if state is not None and _alive(int(state["pid"]))]
    return sorted(states, key=lambda state: state.get("started", 0), reverse=True)


def running_stack() -> dict | None:
    """The most recently started running stack, or None."""
    stacks = running_stacks()
    return stacks[0] if stacks else None


def write_stack(state: dict) -> Path:
    """Write this stack's file (and remove those whose `muestra up` is gone)."""
    folder = state_dir()
    folder.mkdir(parents=True, exist_ok=True)
    for old in folder.glob("*.json"):
        previous = _read(old)
        if previous is not None and not _alive(int(previous["pid"])):
            old.unlink(missing_ok=True)
    state = {**state, "started": time.time()}
    path = state_file(int(state["base_port"]))
    tmp = path.with_name(path.name + f".{os.getpid()}")
    tmp.write_text(json.dumps(state, indent=2) + "\n")
    tmp.replace(path)
    return path


def remove_stack(path: Path, pid: int) -> None:
    """Remove the state file if it is this process's (another `muestra up` may have written it since)."""
    state = _read(path)
    if state is not None and state["pid"] == pid:
        path.unlink(missing_ok=True)


def describe(stacks: list[dict]) -> list[str]:
    """One line per stack for `muestra up --list`, the default one marked."""
    if not stacks:
        return [f"no `muestra up` is running (state files in {state_dir()})"]
    lines = []
    for number, state in enumerate(stacks):
        started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(state.get("started", 0)))
        services = ", ".join(f"{name} {address}" for name, address in state.get("services", {}).items())
        http = f"; OpenAI API {state['http']}" if state.get("http") else ""
        mark = " (the default)" if number == 0 else ""
        lines.append(
            f"base port {state['base_port']}{mark}: pid {state['pid']}, started {started}; {services}{http}; "
            f"logs in {state.get('log_dir', '?')}"
        )
    return lines

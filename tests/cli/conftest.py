"""Helpers for the CLI tests: run `muestra` as a real process, and what a clean failure looks like."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

MUESTRA = [sys.executable, "-m", "muestra.cli"]
# The text model `muestra up` gets in the tests (--text-model): the default one is built, never needed here.
TEXT_FIXTURE = Path(__file__).resolve().parents[2] / "models" / "tiny-text-fixture"


@pytest.fixture(autouse=True)
def no_running_stack(tmp_path, monkeypatch):
    """Each test's commands see their own state files, not those of a `muestra up` the developer runs."""
    monkeypatch.setenv("MUESTRA_STATE_DIR", str(tmp_path / "muestra-stacks"))
    for name in ("MUESTRA_GATEWAY_ADDR", "MUESTRA_API_KEY", "MUESTRA_TOKENIZER_ADDR", "MUESTRA_STATE_FILE"):
        monkeypatch.delenv(name, raising=False)


def muestra(*args: str, timeout: float = 120, env: dict | None = None, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*MUESTRA, *args], capture_output=True, text=True, timeout=timeout, env={**os.environ, **(env or {})}, **kwargs
    )


def assert_fails_in_one_line(result, exit_code: int = 1) -> str:
    """The command failed with `exit_code` and said why on one line of stderr, with no traceback; that line."""
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert "Traceback" not in result.stderr, result.stderr
    assert result.returncode == exit_code, (result.returncode, result.stderr)
    assert len(lines) == 1, result.stderr
    return lines[0]

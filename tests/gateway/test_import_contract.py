"""The gateway's import graph keeps its shape: the contracts in the repository's pyproject.toml ([tool.importlinter]:
the API side over the engine, each side in layers), checked by import-linter on the installed package."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_gateways_imports_keep_their_layers():
    lint_imports = shutil.which("lint-imports", path=str(Path(sys.executable).parent)) or "lint-imports"
    result = subprocess.run([lint_imports], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert "0 broken" in result.stdout or " broken" not in result.stdout.split("Contracts:")[-1]
    assert result.stdout.count("KEPT") >= 3

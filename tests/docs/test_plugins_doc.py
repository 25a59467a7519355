"""docs/plugins.md's pyproject snippet is the example plugin's own, which CI builds and installs."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib", reason="tomllib is in the standard library from Python 3.11")

ROOT = Path(__file__).resolve().parents[2]


def test_the_pyproject_snippet_holds_what_the_example_plugin_builds_with():
    doc = (ROOT / "docs" / "plugins.md").read_text()
    snippet = tomllib.loads(re.search(r"```toml\n(.*?)```", doc, re.S).group(1))
    real = tomllib.loads((ROOT / "plugins" / "mirostat" / "pyproject.toml").read_text())
    assert snippet["build-system"] == real["build-system"]
    for key in ("name", "version", "requires-python", "dependencies", "entry-points"):
        assert snippet["project"][key] == real["project"][key], key
    # what a build backend refuses without (the old snippet had no version)
    assert {"name", "version"} <= snippet["project"].keys()

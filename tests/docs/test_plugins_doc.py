"""docs/plugins.md cannot drift: its snippets are the example plugin's own code, and its commands run."""

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


def python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", (ROOT / "docs" / "plugins.md").read_text(), re.S)


def test_every_python_block_parses_and_imports_only_what_muestra_plugin_exports():
    import ast

    import muestra.plugin

    blocks = python_blocks()
    assert len(blocks) >= 3
    for block in blocks:
        tree = ast.parse(block)  # excerpts elide bodies with `...`, which is still Python
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module == "muestra.plugin":
                missing = [a.name for a in node.names if not hasattr(muestra.plugin, a.name)]
                assert not missing, f"docs/plugins.md imports {missing} that muestra.plugin does not export"


def test_the_hook_example_is_the_example_plugins_sampler():
    """The guide's MirostatV2 (its body elided) declares what the shipped one declares, and registers it."""
    import muestra_mirostat

    block = next(b for b in python_blocks() if "class MirostatV2" in b)
    namespace: dict = {}
    exec(compile(block, "docs/plugins.md", "exec"), namespace)
    doc, real = namespace["MirostatV2"], muestra_mirostat.MirostatV2
    assert (doc.name, doc.description) == (real.name, real.description)
    assert doc.parameters.keys() == real.parameters.keys()
    for key, param in doc.parameters.items():
        assert (param.default, param.help, param.schema) == (
            real.parameters[key].default,
            real.parameters[key].help,
            real.parameters[key].schema,
        )
    registered = []
    namespace["register_samplers"](register=registered.append)
    assert [type(s).__name__ for s in registered] == ["MirostatV2"]


def test_the_testing_example_names_tests_the_example_plugin_has():
    import ast

    block = next(b for b in python_blocks() if "check_sampler" in b)
    shown = {n.name for n in ast.walk(ast.parse(block)) if isinstance(n, ast.FunctionDef)}
    real_tree = ast.parse((ROOT / "plugins" / "mirostat" / "tests" / "test_mirostat.py").read_text())
    real = {n.name for n in ast.walk(real_tree) if isinstance(n, ast.FunctionDef)}
    assert shown and shown <= real, shown - real


def test_the_example_plugin_loads_without_error_and_registers_what_the_doc_shows():
    """The guide's plugin is installed, loads and registers its one sampler: not skipped as a failure."""
    from muestra.gateway.engine.sampling import SamplerRegistry

    plugins = {plugin.name: plugin for plugin in SamplerRegistry.load(env={}).plugins()}
    assert "mirostat" in plugins, "the example plugin is not installed (pip install -e plugins/mirostat)"
    mirostat = plugins["mirostat"]
    assert not mirostat.errors, f"the example plugin failed: {mirostat.errors}"
    assert not mirostat.disabled and mirostat.distribution == "muestra-mirostat"
    block = next(b for b in python_blocks() if "class MirostatV2" in b)
    assert mirostat.samplers == (re.search(r'name = "(\w+)"', block).group(1),)


def test_the_listing_command_runs_and_lists_the_example_plugin():
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-m", "muestra.gateway.engine.sampling"], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    # The plugin's row names the sampler it registered, not "(disabled)".
    assert re.search(r"^mirostat +muestra-mirostat +\S+ +mirostat$", done.stdout, re.M), done.stdout
    disabled = subprocess.run(
        [sys.executable, "-m", "muestra.gateway.engine.sampling"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**__import__("os").environ, "MUESTRA_DISABLE_PLUGINS": "mirostat,typical_p"},
    )
    assert disabled.returncode == 0 and "disabled" in disabled.stdout, disabled.stdout

"""docs/structured.md cannot drift: its plugin is the example plugin's code, and its examples run."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import jsonschema

ROOT = Path(__file__).resolve().parents[2]
DOC = (ROOT / "docs" / "structured.md").read_text()


def blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", DOC, re.S)


def test_the_plugin_is_the_choice_plugins_own_code():
    plugin = next(block for block in blocks("python") if "class Choice" in block)
    source = (ROOT / "plugins" / "choice" / "muestra_choice" / "__init__.py").read_text()
    body = source.split("from __future__ import annotations\n\n", 1)[1]
    assert plugin == body


def test_the_listed_kinds_are_the_registered_ones():
    from muestra.gateway.engine.constraints.registry import ConstraintRegistry

    listed = re.findall(r"^\| `(\w+)` \|", DOC.split("## The kinds", 1)[1].split("##", 1)[0], re.M)
    assert sorted(listed) == ConstraintRegistry.load(env={}).names()


def test_the_client_example_runs(text_fixture_stack):
    example = next(block for block in blocks("python") if "muestra.client" in block)
    code = example.replace("127.0.0.1:50051", text_fixture_stack.address)
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    text = result.stdout.rsplit(" ", 2)[0]
    jsonschema.validate(json.loads(text), {"type": "object", "required": ["name", "age"]})


def test_the_command_line_examples_run(text_fixture_stack, tmp_path):
    script = blocks("sh")[0].replace(".venv/bin/muestra", f"{shlex.quote(sys.executable)} -m muestra.cli")
    env = {"MUESTRA_GATEWAY_ADDR": text_fixture_stack.address, "PATH": "/usr/bin:/bin"}
    result = subprocess.run(
        ["bash", "-e", "-c", script], capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env
    )
    assert result.returncode == 0, result.stderr
    person, phone, total, answer = result.stdout.splitlines()
    assert set(json.loads(person)) >= {"name", "age"}
    assert re.fullmatch(r"[0-9]{3}-[0-9]{3}-[0-9]{3}", phone)
    assert re.fullmatch(r"[1-9][0-9]{0,2}( \+ [1-9][0-9]{0,2})*", total)
    assert answer in ("sí", "no")

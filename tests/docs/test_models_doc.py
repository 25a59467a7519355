"""docs/models.md cannot drift: its commands parse with the CLI as written, its families are the exporter's."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

from muestra.cli.main import build_parser
from muestra.lm.export.families import FAMILIES

DOC = Path(__file__).resolve().parents[2] / "docs" / "models.md"


def shell_commands() -> list[list[str]]:
    commands = []
    for block in re.findall(r"```sh\n(.*?)```", DOC.read_text(), re.S):
        for line in block.splitlines():
            if line.startswith(".venv/bin/muestra "):
                commands.append(shlex.split(line)[1:])
    return commands


def test_every_muestra_command_in_the_guide_parses_as_written():
    commands = shell_commands()
    assert {c[0] for c in commands} >= {"export-lm", "up", "generate", "chat", "image", "models"}
    parser = build_parser()
    for argv in commands:
        parser.parse_args(argv)  # an unknown flag or a missing argument exits (fails the test)


def test_the_guide_lists_exactly_the_families_the_exporter_takes():
    line = re.search(r"\*\*Families the exporter takes\*\*.*?:(.*?)\. Another family", DOC.read_text(), re.S).group(1)
    assert set(re.findall(r"`(\w+)`", line)) == set(FAMILIES)


def test_the_readme_links_the_guide():
    readme = (DOC.parents[1] / "README.md").read_text()
    assert "docs/models.md" in readme.split("## Layout")[0]  # the first screen

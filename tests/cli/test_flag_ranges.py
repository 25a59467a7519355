"""Every numeric flag of every subcommand refuses a value out of its range: exit 2, one line naming the flag.

The cases are generated from the argparse parsers themselves, so a flag added later is walked too.
"""

from __future__ import annotations

import argparse

import pytest

from muestra.cli.arguments import Ranged
from muestra.cli.main import build_parser
from tests.cli.conftest import assert_fails_in_one_line, muestra


def subcommands() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    actions = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(actions[0].choices)


def out_of_range(kind: Ranged) -> list[str]:
    """Values just outside the range (and, for a float, ones that are no number at all)."""
    step = 1 if kind.kind is int else 0.5
    values = []
    if kind.low is not None:
        values.append(kind.low if kind.low_open else kind.low - step)
    if kind.high is not None:
        values.append(kind.high + step)
    if kind.kind is float:
        values += ["nan", "inf"]
    return [str(value) for value in values] + ["ten"]


def positionals(parser: argparse.ArgumentParser) -> list[str]:
    """A value for each required positional, so that only the flag under test is wrong."""
    return ["x" for a in parser._actions if not a.option_strings and a.nargs is None]


def numeric_flags() -> list[tuple[str, str, Ranged]]:
    return [
        (name, action.option_strings[-1], action.type)
        for name, parser in subcommands().items()
        for action in parser._actions
        if isinstance(action.type, Ranged)
    ]


CASES = [(name, flag, value) for name, flag, kind in numeric_flags() for value in out_of_range(kind)]


def test_every_numeric_flag_has_a_checked_range():
    bare = [
        f"muestra {name} {action.option_strings[-1]}"
        for name, parser in subcommands().items()
        for action in parser._actions
        if action.type in (int, float)
    ]
    assert bare == [], "use muestra.cli.arguments.integer/number so that the range is checked"
    walked = {(name, flag) for name, flag, _ in numeric_flags()}
    assert {("generate", "--max-tokens"), ("chat", "--seed"), ("image", "--steps"), ("up", "--base-port")} <= walked


@pytest.mark.parametrize(("command", "flag", "value"), CASES)
def test_an_out_of_range_value_is_a_usage_error_naming_the_flag(command, flag, value, capsys):
    parser = subcommands()[command]
    with pytest.raises(SystemExit) as exit_info:
        build_parser().parse_args([command, *positionals(parser), flag, value])
    assert exit_info.value.code == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(lines) == 1, lines
    assert f"argument {flag}" in lines[0] or f"/{flag}" in lines[0], lines[0]
    assert "Traceback" not in lines[0]


@pytest.mark.parametrize("command", sorted({name for name, _, _ in numeric_flags()}))
def test_the_muestra_command_itself_says_so_in_one_line(command):
    flag, kind = next((f, k) for name, f, k in numeric_flags() if name == command)
    value = out_of_range(kind)[0]
    result = muestra(command, *positionals(subcommands()[command]), flag, value, timeout=60)
    line = assert_fails_in_one_line(result, exit_code=2)
    assert flag in line and kind.describe() in line


@pytest.mark.parametrize("command", ["generate", "chat", "image", "tokenize", "models", "plugins"])
def test_a_gateway_port_out_of_range_is_refused_not_wrapped(command, tmp_path):
    args = [command, *positionals(subcommands()[command]), "--gateway", "127.0.0.1:99999"]
    line = assert_fails_in_one_line(muestra(*args, timeout=60, cwd=tmp_path), exit_code=2)
    assert "--gateway" in line and "from 1 to 65535" in line and "99999" in line


def test_a_gateway_port_out_of_range_in_the_environment_is_refused():
    result = muestra("models", env={"MUESTRA_GATEWAY_ADDR": "127.0.0.1:70000"}, timeout=60)
    line = assert_fails_in_one_line(result, exit_code=2)
    assert "MUESTRA_GATEWAY_ADDR" in line and "from 1 to 65535" in line

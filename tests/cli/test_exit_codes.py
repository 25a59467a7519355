"""One exit code per kind of failure, as `muestra --help` lists them; a usage error names its subcommand."""

from __future__ import annotations

import pytest

from tests.cli.conftest import assert_fails_in_one_line, muestra

# Unreachable: a command that asked the gateway first would fail with UNAVAILABLE and exit 1.
NOWHERE = ["--gateway", "127.0.0.1:9"]


@pytest.mark.parametrize("command", [["generate", "El cielo"], ["image", "un siete"], ["up"]])
def test_an_unknown_flag_is_a_usage_error_of_its_subcommand(command):
    line = assert_fails_in_one_line(muestra(*command, "--bogus", timeout=60), exit_code=2)
    assert line.startswith(f"muestra {command[0]}: unrecognized arguments: --bogus"), line
    assert line.endswith(f"(see muestra {command[0]} --help)"), line


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["image", "un siete", "-o", "no-such-folder/out.png", *NOWHERE], "the folder no-such-folder does not exist"),
        (["image", "un siete", "-o", "out.png", "--init-image", "missing.png", *NOWHERE], "No such file"),
        (["generate", "El cielo", "--json-schema", "missing.json", *NOWHERE], "cannot read missing.json"),
        (["up", "--only", "tokenizer", "--text-model", "no-such-model", "--base-port", "0"], "no such folder"),
    ],
)
def test_a_path_on_the_command_line_that_cannot_be_used_exits_2_before_anything_is_sent(args, says, tmp_path):
    line = assert_fails_in_one_line(muestra(*args, timeout=60, cwd=tmp_path), exit_code=2)
    assert says in line, line


def test_a_failed_request_exits_1():
    line = assert_fails_in_one_line(muestra("generate", "El cielo", *NOWHERE, timeout=60), exit_code=1)
    assert "UNAVAILABLE" in line


def test_the_help_lists_the_exit_codes():
    shown = muestra("--help", timeout=60).stdout
    assert "exit codes" in shown
    for code in ("0", "1", "2", "130", "141"):
        assert f"\n  {code} " in shown, shown

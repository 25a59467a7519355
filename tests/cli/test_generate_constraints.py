"""`muestra generate --json-schema FILE / --regex / --grammar FILE / --constraint`: constrained text."""

from __future__ import annotations

import json
import re

import jsonschema

from tests.cli.conftest import assert_fails_in_one_line, muestra
from tests.constraints.schemas import ARITHMETIC, SCHEMAS

HOT = ["--temperature", "1.5", "--seed", "5"]


def run(stack, *args: str):
    return muestra("generate", "Data:", "--max-tokens", "200", "--gateway", stack.gateway.address, *args)


def text_of(result) -> str:
    assert result.returncode == 0, result.stderr
    return result.stdout[:-1]


def test_json_schema_file(text_stack, tmp_path):
    stack = text_stack("llama")
    schema = SCHEMAS[3]
    (tmp_path / "schema.json").write_text(json.dumps(schema))
    value = json.loads(text_of(run(stack, "--json-schema", str(tmp_path / "schema.json"), *HOT)))
    jsonschema.Draft202012Validator(schema, format_checker=jsonschema.FormatChecker()).validate(value)


def test_regex_grammar_file_and_a_plugin_kind(text_stack, tmp_path):
    stack = text_stack("llama")
    assert re.fullmatch(r"[a-z]{2,6}-[0-9]{2}", text_of(run(stack, "--regex", r"[a-z]{2,6}-[0-9]{2}", *HOT)))
    (tmp_path / "arith.lark").write_text(ARITHMETIC)
    expression = text_of(run(stack, "--grammar", str(tmp_path / "arith.lark"), *HOT))
    assert re.fullmatch(r"[0-9()+\-*/]+", expression)
    compile(expression, "<generated>", "eval")
    choice = text_of(run(stack, "--constraint", "choice", 'choices=["sí", "no"]', *HOT))
    assert choice in ("sí", "no")


def test_constraint_errors_are_one_line(text_stack, tmp_path):
    stack = text_stack("llama")
    line = assert_fails_in_one_line(run(stack, "--json-schema", str(tmp_path / "missing.json")), exit_code=2)
    assert line.startswith("muestra generate: --json-schema: cannot read")
    line = assert_fails_in_one_line(run(stack, "--regex", "(("))
    assert "INVALID_ARGUMENT: constraint.params.pattern: the regex does not compile" in line
    both = run(stack, "--regex", "a", "--json-schema", "x.json")
    assert both.returncode == 2 and "not allowed with argument --regex" in both.stderr

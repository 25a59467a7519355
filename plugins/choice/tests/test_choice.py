"""The choice constraint on its own: parameters and the grammar it compiles to (no gateway needed)."""

import json

import pytest
from muestra_choice import Choice

from muestra.plugin import SamplerParamError


def test_each_choice_is_one_quoted_alternative():
    grammar = Choice().grammar(Choice().validate({"choices": ["sí", 'say "hi"', "a\\b\nc", "sí"]}))
    assert grammar.kind == "lark"
    assert grammar.source == "start: " + " | ".join(json.dumps(c) for c in ["sí", 'say "hi"', "a\\b\nc"])


@pytest.mark.parametrize(
    ("params", "field", "message"),
    [
        ({}, "choices", "is required"),
        ({"choices": []}, "choices", "must hold 1 to 1024 strings, got 0"),
        ({"choices": ["a", 3]}, "choices", "must be a list of strings"),
        ({"choices": "a"}, "choices", "must be a list of strings"),
        ({"choices": ["a"], "other": 1}, "other", "unknown parameter"),
    ],
)
def test_bad_params_name_the_field(params, field, message):
    with pytest.raises(SamplerParamError) as info:
        Choice().validate(params)
    assert info.value.field == field and message in info.value.message


def test_an_empty_choice_is_refused():
    with pytest.raises(ValueError, match="a choice is empty"):
        Choice().grammar({"choices": ["yes", ""]})

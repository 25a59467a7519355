"""Constraint kinds are plugins: listed with their schemas, a third-party kind works end to end, and a
disabled one is gone."""

from __future__ import annotations

import json

import jsonschema
import pytest

from muestra.client import Client, InvalidArgumentError
from muestra.v1 import gateway_pb2

CHOICES = ["positivo", "negativo", "neutral", 'un "quizá"']
HOT = [{"name": "temperature", "params": {"temperature": 1.5}}]


def test_every_kind_is_listed_with_a_valid_parameter_schema(text_stack):
    stack = text_stack("llama")
    kinds = {c.name: c for c in stack.stub.ListConstraints(gateway_pb2.ListConstraintsRequest()).constraints}
    assert set(kinds) == {"json_object", "json_schema", "regex", "grammar", "choice"}
    for info in kinds.values():
        jsonschema.Draft202012Validator.check_schema(json.loads(info.parameter_schema))
        assert info.description and info.plugin and info.distribution
    assert (kinds["choice"].plugin, kinds["choice"].distribution) == ("choice", "muestra-choice")
    assert json.loads(kinds["regex"].parameter_schema)["required"] == ["pattern"]
    plugins = {p.name: p for p in stack.stub.ListPlugins(gateway_pb2.ListPluginsRequest()).plugins}
    assert list(plugins["choice"].constraints) == ["choice"] and not plugins["choice"].disabled
    assert list(plugins["json_schema"].constraints) == ["json_schema"]


def test_the_choice_plugin_is_found_by_its_entry_point_and_used_end_to_end(text_stack):
    stack = text_stack("llama")
    constraint = {"name": "choice", "params": {"choices": CHOICES}}
    with Client(stack.gateway.address, timeout=60) as client:
        sampled = client.generate("Sentiment:", max_tokens=16, n=6, seed=4, samplers=HOT, constraint=constraint).wait()
        greedy = client.generate("Sentiment:", max_tokens=16, samplers=[{"name": "greedy"}], constraint=constraint)
        greedy = greedy.wait()
    for index in range(6):
        assert sampled.texts[index] in CHOICES and sampled.completions[index].finish_reason == "stop"
    assert greedy.texts[0] in CHOICES and greedy.completions[0].stop_reason == "constraint"


def test_a_disabled_constraint_plugin_is_absent(text_stack):
    stack = text_stack("llama", env={"MUESTRA_DISABLE_PLUGINS": "choice"})
    kinds = [c.name for c in stack.stub.ListConstraints(gateway_pb2.ListConstraintsRequest()).constraints]
    assert "choice" not in kinds and "json_schema" in kinds
    plugins = {p.name: p for p in stack.stub.ListPlugins(gateway_pb2.ListPluginsRequest()).plugins}
    assert plugins["choice"].disabled and not plugins["choice"].constraints
    with Client(stack.gateway.address, timeout=60) as client, pytest.raises(InvalidArgumentError) as info:
        client.generate("x", max_tokens=4, constraint={"name": "choice", "params": {"choices": ["a"]}}).wait()
    assert "constraint.name: unknown constraint kind 'choice'" in str(info.value)

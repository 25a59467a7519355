"""Sampler plugins: discovery through entry points, disabling, broken plugins, schemas, docs."""

from __future__ import annotations

import importlib.metadata
import json
import sys
import types
from pathlib import Path

import jsonschema
import numpy as np
import pluggy
import pytest

from muestra.gateway.engine.sampling import ModelInfo, SamplerRegistry, new_rows, sample_next_tokens, validate_chain
from muestra.plugin import REQUIRED, Int, LogitsProcessor, TokenSelector, hookimpl, hookspecs
from muestra.plugin.builtins import BUILTIN_SAMPLER_MODULES
from muestra.runtime.errors import InvalidArgument

DOCS = Path(__file__).resolve().parents[2] / "docs" / "plugins.md"
MODEL = ModelInfo(vocab_size=64, eos_token_ids=(2,))


def test_example_plugin_is_discovered_through_its_entry_point(sampler_registry):
    entry_points = {ep.name: ep for ep in importlib.metadata.entry_points(group="muestra")}
    assert entry_points["mirostat"].value == "muestra_mirostat"
    entry = next(e for e in sampler_registry.list() if e.name == "mirostat")
    assert (entry.plugin, entry.distribution) == ("mirostat", "muestra-mirostat")
    assert entry.version == importlib.metadata.version("muestra-mirostat")
    assert entry.kind == "selector"
    plugin = next(p for p in sampler_registry.plugins() if p.name == "mirostat")
    assert plugin.samplers == ("mirostat",) and not plugin.disabled


def test_builtins_are_plugins_of_the_plugin_api_distribution(sampler_registry):
    builtins = [e for e in sampler_registry.list() if e.plugin in BUILTIN_SAMPLER_MODULES]
    assert sorted(e.name for e in builtins) == sorted(BUILTIN_SAMPLER_MODULES)
    for entry in builtins:
        assert entry.plugin == entry.name
        assert (entry.distribution, entry.version) == ("muestra-plugin", importlib.metadata.version("muestra-plugin"))


def test_disabled_plugins_are_listed_but_register_nothing(monkeypatch):
    monkeypatch.setenv("MUESTRA_DISABLE_PLUGINS", "mirostat, typical_p")
    registry = SamplerRegistry.load()
    assert "mirostat" not in registry and "typical_p" not in registry and "top_p" in registry
    disabled = {p.name: p for p in registry.plugins() if p.disabled}
    assert set(disabled) == {"mirostat", "typical_p"}
    assert disabled["mirostat"].distribution == "muestra-mirostat" and disabled["mirostat"].samplers == ()
    with pytest.raises(InvalidArgument, match=r"samplers\[0\]\.name: unknown sampler 'mirostat'"):
        validate_chain(registry, [{"name": "mirostat"}], MODEL)


def test_mirostat_runs_in_a_chain_with_state_per_row(sampler_registry):
    chain = validate_chain(
        sampler_registry,
        [{"name": "temperature", "params": {"temperature": 0.9}}, {"name": "mirostat", "params": {"tau": 3.0}}],
        MODEL,
    )
    logits = np.random.default_rng(0).normal(size=(3, 64)).astype(np.float32) * 3

    def run():
        rows = new_rows(chain, [1, 2], seed=11, n=3)
        for _ in range(30):
            sample_next_tokens(rows, logits)
        return [row.context.output_ids.tolist() for row in rows], [row.context.state["mirostat"]["mu"] for row in rows]

    outputs, mus = run()
    assert run() == (outputs, mus)
    assert len(set(mus)) == 3  # each completion steers its own mu


class _Double(LogitsProcessor):
    name = "double"
    description = "Doubles the scores."
    parameters = {"times": Int(2, "Multiplier.", ge=1, le=8)}

    def process(self, logits, params, rows):
        return logits * 2


class _Impostor(TokenSelector):
    name = "top_k"  # already taken by the built-in
    description = "Not the real top_k."


def _fake_plugin(monkeypatch, module_name: str, register_samplers) -> str:
    module = types.ModuleType(module_name)
    module.register_samplers = hookimpl(register_samplers)
    monkeypatch.setitem(sys.modules, module_name, module)
    return module_name


def test_a_broken_plugin_is_skipped_whole_and_the_rest_load(monkeypatch):
    def raises_after_one(register):
        register(_Double())
        raise RuntimeError("broken plugin")

    def registers_a_class(register):
        register(_Double)

    def registers_a_duplicate(register):
        register(_Impostor())

    modules = dict(BUILTIN_SAMPLER_MODULES)
    modules["raiser"] = _fake_plugin(monkeypatch, "fake_raiser", raises_after_one)
    modules["classy"] = _fake_plugin(monkeypatch, "fake_classy", registers_a_class)
    modules["impostor"] = _fake_plugin(monkeypatch, "fake_impostor", registers_a_duplicate)
    registry = SamplerRegistry.load(env={}, builtin_modules=modules)
    assert "double" not in registry  # registered before the plugin failed: withdrawn
    plugins = {p.name: p for p in registry.plugins()}
    assert plugins["raiser"].disabled and plugins["classy"].disabled
    assert next(e for e in registry.list() if e.name == "top_k").plugin == "top_k"  # the first one wins
    assert plugins["impostor"].samplers == ()
    assert "mirostat" in registry and "greedy" in registry


def test_the_hot_path_never_calls_pluggy(sampler_registry, monkeypatch):
    original = pluggy.HookCaller.__call__

    def guarded(self, *args, **kwargs):
        if self.name in ("register_samplers", "register_schedulers"):
            raise AssertionError(f"pm.hook.{self.name} called after start-up")
        return original(self, *args, **kwargs)  # pytest's own hooks

    monkeypatch.setattr(pluggy.HookCaller, "__call__", guarded)
    specs = [{"name": n} for n in ("repetition_penalty", "top_k", "top_p", "min_p", "mirostat")]
    rows = new_rows(validate_chain(sampler_registry, specs, MODEL), [1, 2, 3], seed=0, n=2, logprobs=True)
    result = sample_next_tokens(rows, np.zeros((2, 64), dtype=np.float32))
    assert result.errors == [None, None]


def test_every_parameter_schema_is_valid_json_schema_that_accepts_the_defaults(sampler_registry):
    for entry in sampler_registry.list():
        info = entry.to_proto()
        schema = json.loads(info.parameter_schema)
        assert schema == entry.sampler.parameter_schema
        jsonschema.Draft202012Validator.check_schema(schema)
        defaults = {k: p.default for k, p in entry.sampler.parameters.items() if p.default is not REQUIRED}
        if len(defaults) == len(entry.sampler.parameters):
            jsonschema.validate(defaults, schema)
        else:  # a required parameter: the schema and validate() both reject its absence
            with pytest.raises(jsonschema.ValidationError):
                jsonschema.validate(defaults, schema)
        assert info.description and info.plugin and info.argmax_invariant == entry.sampler.argmax_invariant
    top_p = json.loads(next(e for e in sampler_registry.list() if e.name == "top_p").to_proto().parameter_schema)
    assert top_p["properties"]["top_p"] == {
        "type": "number",
        "exclusiveMinimum": 0.0,
        "maximum": 1.0,
        "default": 1.0,
        "description": "Probability mass to keep.",
    }


def test_every_hook_and_builtin_sampler_is_documented():
    text = DOCS.read_text()
    hooks = [name for name in dir(hookspecs) if name.startswith("register_")]
    assert hooks == ["register_constraints", "register_proposers", "register_samplers", "register_schedulers"]
    for name in [*hooks, *BUILTIN_SAMPLER_MODULES, "MUESTRA_DISABLE_PLUGINS", "muestra plugins"]:
        assert f"`{name}" in text, f"{name} is not documented in docs/plugins.md"

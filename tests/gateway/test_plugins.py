"""Plugins: discovery through entry points (once per process), disabling, broken plugins, schemas, docs; every
hook fills one registry; the proposer interface's start-up and admission hooks."""

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

from muestra.gateway.engine.constraints.registry import ConstraintRegistry
from muestra.gateway.engine.proposers.registry import ProposerRegistry
from muestra.gateway.engine.requests import Step
from muestra.gateway.engine.sampling import ModelInfo, SamplerRegistry, new_rows, sample_next_tokens, validate_chain
from muestra.plugin import (
    MAX_DRAFT_TOKENS,
    REQUIRED,
    DraftProposer,
    Int,
    LogitsProcessor,
    SamplerParamError,
    String,
    TokenSelector,
    hookimpl,
    hookspecs,
)
from muestra.plugin.builtins import BUILTIN_SAMPLER_MODULES
from muestra.plugin.manager import entry_points, forget_entry_points
from muestra.runtime.errors import InvalidArgument

DOCS = Path(__file__).resolve().parents[2] / "docs" / "plugins.md"
MODEL = ModelInfo(vocab_size=64, eos_token_ids=(2,))
# Every hook muestra.plugin.hookspecs declares, read from pluggy's own markers: a new hook is in it.
HOOKS = sorted(n for n in dir(hookspecs) if pluggy.PluginManager("muestra").parse_hookspec_opts(hookspecs, n))


def registries() -> list[type]:
    """Every kind's registry class: the gateway's three, and the diffusion service's when it is installed."""
    kinds = [SamplerRegistry, ConstraintRegistry, ProposerRegistry]
    try:
        from muestra.diffusion.registry import SchedulerRegistry
    except ImportError:
        return kinds
    return [*kinds, SchedulerRegistry]


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
    assert "register_proposers" in HOOKS
    for name in [*HOOKS, *BUILTIN_SAMPLER_MODULES, "MUESTRA_DISABLE_PLUGINS", "muestra plugins"]:
        assert f"`{name}" in text, f"{name} is not documented in docs/plugins.md"


def test_every_hook_fills_one_registry_and_its_built_ins_register_through_it():
    kinds = registries()
    if len(kinds) < len(HOOKS):
        pytest.skip("muestra-diffusion is not installed: no registry of schedulers here")
    assert sorted(kind.hook for kind in kinds) == HOOKS
    for kind in kinds:
        registry = kind.load(env={})
        built_in = [entry.name for entry in registry.entries() if entry.plugin in kind.builtins]
        assert built_in, f"no built-in registers through {kind.hook}"
        assert all(kind.hook in r.registered for r in registry.records() if r.name in kind.builtins)


@pytest.fixture
def counted_entry_points(monkeypatch):
    """How often entry points are searched for, and each one imported, from a fresh start of the cache."""
    calls = {"searches": 0, "imports": []}
    search, load = importlib.metadata.entry_points, importlib.metadata.EntryPoint.load

    def counted_search(**kwargs):
        calls["searches"] += 1
        return search(**kwargs)

    def counted_load(entry_point):
        calls["imports"].append(entry_point.name)
        return load(entry_point)

    monkeypatch.setattr(importlib.metadata, "entry_points", counted_search)
    monkeypatch.setattr(importlib.metadata.EntryPoint, "load", counted_load)
    forget_entry_points()
    yield calls
    forget_entry_points()


def test_a_process_searches_and_imports_the_entry_points_once_for_every_registry(counted_entry_points):
    from muestra.cli.plugins import _local

    for kind in registries():  # what the gateway and the diffusion service load at start-up
        kind.load()
    listed = _local()  # and `muestra plugins --local`, in the same process
    assert "mirostat" in {row["name"] for row in listed}
    installed = [entry_point.name for entry_point in entry_points()]
    assert counted_entry_points == {"searches": 1, "imports": installed}


class _Drafts(DraftProposer):
    """A proposer that drafts with another served model, as draft_model does, through muestra.plugin alone."""

    name = "other_model"
    description = "Drafts with another served model."
    parameters = {"model": String(REQUIRED, "The drafting model."), "max_draft_tokens": MAX_DRAFT_TOKENS}

    def attach(self, models, lm_timeout_s):
        self.models, self.lm_timeout_s = models, lm_timeout_s

    def check_target(self, params, model):
        if params["model"] not in self.models.text or params["model"] == model.name:
            raise SamplerParamError(self.name, "model", f"{params['model']!r} cannot draft for {model.name!r}")

    def propose(self, rows):
        return [[] for _ in rows]


def test_a_proposer_learns_the_served_models_at_start_up_and_refuses_a_target_it_cannot_draft_for():
    plugin = types.SimpleNamespace(register_proposers=hookimpl(lambda register: register(_Drafts())))
    proposers = ProposerRegistry.load(env={}, builtin_modules={"other_model": plugin})
    models = types.SimpleNamespace(text={"small": types.SimpleNamespace(name="small")})
    proposers.attach(models, 30.0)
    proposer = proposers.lookup("other_model").proposer
    assert (proposer.models, proposer.lm_timeout_s) == (models, 30.0)
    speculation = proposers.choose(Step("other_model", {"model": "small"}))
    proposers.check_target(speculation, types.SimpleNamespace(name="large"))
    with pytest.raises(InvalidArgument) as refused:
        proposers.check_target(speculation, types.SimpleNamespace(name="small"))
    assert str(refused.value) == "speculation.params.model: 'small' cannot draft for 'small'"


def test_a_proposer_that_declares_no_start_up_or_admission_hook_accepts_every_model():
    proposers = ProposerRegistry.load(env={})
    proposers.attach(types.SimpleNamespace(text={}), 30.0)
    speculation = proposers.choose(Step("ngram"))
    assert type(speculation.proposer).check_target is DraftProposer.check_target  # the default
    proposers.check_target(speculation, types.SimpleNamespace(name="any"))

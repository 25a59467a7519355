"""The plugin registry in muestra.plugin.manager: attribution, the one failure rule, and listing."""

from __future__ import annotations

import importlib.metadata
import inspect
import logging
import sys
import types

import pluggy
import pytest

from muestra.plugin import ENTRY_POINT_GROUP, hookimpl, hookspecs
from muestra.plugin.manager import (
    DISABLE_ENV,
    Plugins,
    Registration,
    disabled_names,
    entry_points,
    forget_entry_points,
)

# Every hook muestra.plugin.hookspecs declares, read from pluggy's own markers: a new hook is in it.
HOOKS = sorted(n for n in dir(hookspecs) if pluggy.PluginManager("muestra").parse_hookspec_opts(hookspecs, n))


def accept(name, value="value", aliases=()) -> Registration:
    """A register(name, value, aliases=()) callback's check: names are non-empty strings."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"name must be a non-empty string, got {name!r}")
    return Registration(name, value, tuple(aliases))


class Schedulers:
    """A plugin object whose register_schedulers hook runs `body(register)`."""

    def __init__(self, body) -> None:
        self.body = body

    @hookimpl
    def register_schedulers(self, register):
        self.body(register)


def load(env=None, **bodies) -> Plugins:
    return Plugins.load({name: Schedulers(body) for name, body in bodies.items()}, env={} if env is None else env)


def test_a_hook_that_registers_two_things_then_raises_registers_nothing():
    def raises_after_two(register):
        register("a")
        register("b")
        raise RuntimeError("broken plugin")

    plugins = load(broken=raises_after_two, fine=lambda register: register("c"))
    registered = plugins.call_register_hook("register_schedulers", "scheduler", accept)
    assert [(e.name, e.plugin) for e in registered] == [("c", "fine")]
    broken = next(r for r in plugins.records() if r.name == "broken")
    assert broken.failed and broken.registered == {}
    assert broken.errors == {"register_schedulers": "RuntimeError: broken plugin"}


def test_an_invalid_registration_withdraws_the_whole_hook_call_even_if_the_plugin_catches_the_error():
    def registers_one_bad(register):
        register("a")
        try:
            register("")
        except TypeError:
            pass
        register("b")

    plugins = load(sloppy=registers_one_bad)
    assert plugins.call_register_hook("register_schedulers", "scheduler", accept) == []
    record = next(r for r in plugins.records() if r.name == "sloppy")
    assert record.errors["register_schedulers"] == (
        "InvalidRegistration: plugin 'sloppy' registered an invalid scheduler: name must be a non-empty string, got ''"
    )


def test_the_first_plugin_to_claim_a_name_or_alias_wins_and_the_later_one_is_logged_not_failed(caplog):
    plugins = load(
        first=lambda register: register("euler", 1, aliases=("Euler",)),
        second=lambda register: (register("EULER", 2), register("heun", 3)),
    )
    with caplog.at_level(logging.WARNING, logger="muestra.plugins"):
        registered = plugins.call_register_hook("register_schedulers", "scheduler", accept, key=str.lower)
    assert [(e.name, e.value, e.plugin) for e in registered] == [("euler", 1, "first"), ("heun", 3, "second")]
    assert "plugin second: scheduler 'EULER' not registered: 'EULER' is taken by 'euler' from plugin first" in (
        caplog.text
    )
    second = next(r for r in plugins.records() if r.name == "second")
    assert second.registered == {"register_schedulers": ["heun"]} and not second.failed


def test_each_registration_is_attributed_to_its_plugin_and_distribution():
    plugins = load(ours=lambda register: register("mine"))
    [entry] = plugins.call_register_hook("register_schedulers", "scheduler", accept)
    # The plugin object's module is this test's (tests.plugin.*), which no distribution ships.
    assert (entry.plugin, entry.distribution, entry.version) == ("ours", "", "")
    mirostat = next(r for r in Plugins.load({}, env={}).records() if r.name == "mirostat")
    assert (mirostat.distribution, mirostat.version) == (
        "muestra-mirostat",
        importlib.metadata.version("muestra-mirostat"),
    )


def test_a_built_in_module_path_is_attributed_to_the_distribution_that_ships_it():
    plugins = Plugins.load({"regex": "muestra.plugin.hookspecs"}, env={})
    record = next(r for r in plugins.records() if r.name == "regex")
    assert (record.distribution, record.version) == (
        "muestra-plugin",
        importlib.metadata.version("muestra-plugin"),
    )


def test_disabled_plugins_are_listed_and_register_nothing():
    plugins = load(env={"MUESTRA_DISABLE_PLUGINS": "off, mirostat"}, on=lambda r: r("a"), off=lambda r: r("b"))
    registered = plugins.call_register_hook("register_schedulers", "scheduler", accept)
    assert [e.name for e in registered] == ["a"]
    listed = {r.name: r for r in plugins.records()}
    assert listed["off"].disabled and listed["mirostat"].disabled and not listed["on"].disabled
    assert listed["off"].registered == {} and listed["on"].registered == {"register_schedulers": ["a"]}
    assert disabled_names({"MUESTRA_DISABLE_PLUGINS": " a,b  c "}) == {"a", "b", "c"}


def test_a_plugin_that_fails_in_one_hook_keeps_what_it_registered_through_another(monkeypatch):
    module = types.ModuleType("fake_two_hooks")

    def register_samplers(register):
        register("kept")

    def register_schedulers(register):
        raise RuntimeError("no schedulers today")

    module.register_samplers = hookimpl(register_samplers)
    module.register_schedulers = hookimpl(register_schedulers)
    monkeypatch.setitem(sys.modules, "fake_two_hooks", module)
    plugins = Plugins.load({"two": "fake_two_hooks"}, env={})
    assert [e.name for e in plugins.call_register_hook("register_samplers", "sampler", accept)] == ["kept"]
    assert plugins.call_register_hook("register_schedulers", "scheduler", accept) == []
    record = next(r for r in plugins.records() if r.name == "two")
    assert record.registered == {"register_samplers": ["kept"]}
    assert record.errors == {"register_schedulers": "RuntimeError: no schedulers today"}


def every_hook_plugin() -> types.ModuleType:
    """A plugin module that implements every hook: register(f"from {hook}")."""
    module = types.ModuleType("fake_every_hook")
    for hook in HOOKS:

        def implementation(register, hook=hook):
            register(f"from {hook}")

        setattr(module, hook, hookimpl(implementation))
    return module


def test_every_function_of_the_hookspecs_module_is_a_hook():
    functions = [name for name, value in vars(hookspecs).items() if inspect.isfunction(value)]
    assert "register_proposers" in HOOKS and sorted(functions) == HOOKS


@pytest.mark.parametrize("hook", HOOKS)
def test_every_hook_is_called_through_the_same_rule(hook):
    plugins = Plugins.load({"every": every_hook_plugin()}, env={})
    registered = plugins.call_register_hook(hook, hook, accept)
    assert [(e.name, e.plugin) for e in registered if e.plugin == "every"] == [(f"from {hook}", "every")]
    assert all(e.plugin for e in registered)
    assert next(r for r in plugins.records() if r.name == "every").registered == {hook: [f"from {hook}"]}


@pytest.fixture
def entry_point_calls(monkeypatch):
    """Counts the searches for entry points and the imports of each, from a fresh start of the cache."""
    calls = {"found": 0, "imported": []}
    find, load = importlib.metadata.entry_points, importlib.metadata.EntryPoint.load

    def counted_find(**kwargs):
        calls["found"] += 1
        return find(**kwargs)

    def counted_load(entry_point):
        calls["imported"].append(entry_point.name)
        return load(entry_point)

    monkeypatch.setattr(importlib.metadata, "entry_points", counted_find)
    monkeypatch.setattr(importlib.metadata.EntryPoint, "load", counted_load)
    forget_entry_points()
    yield calls
    forget_entry_points()


def test_entry_points_are_found_and_imported_once_however_often_plugins_load(entry_point_calls):
    for hook in HOOKS:
        Plugins.load({}, env={}).call_register_hook(hook, hook, accept)
    installed = [entry_point.name for entry_point in entry_points()]
    assert "mirostat" in installed
    assert entry_point_calls == {"found": 1, "imported": installed}


def test_a_disabled_entry_point_is_not_even_imported(entry_point_calls):
    record = next(r for r in Plugins.load({}, env={DISABLE_ENV: "mirostat"}).records() if r.name == "mirostat")
    assert record.disabled and "mirostat" not in entry_point_calls["imported"]
    Plugins.load({}, env={})  # enabled again: imported now, once
    assert entry_point_calls["imported"].count("mirostat") == 1


def test_an_entry_point_that_fails_to_import_fails_once_and_every_load_lists_its_error(monkeypatch, caplog):
    broken = importlib.metadata.EntryPoint("broken", "muestra_no_such_module", ENTRY_POINT_GROUP)
    monkeypatch.setattr(importlib.metadata, "entry_points", lambda **kwargs: [broken])
    forget_entry_points()
    try:
        with caplog.at_level(logging.ERROR, logger="muestra.plugins"):
            records = [next(r for r in Plugins.load({}, env={}).records() if r.name == "broken") for _ in range(3)]
    finally:
        forget_entry_points()
    assert caplog.text.count("plugin broken (muestra_no_such_module) failed to load") == 1
    for record in records:
        assert record.failed and record.errors == {
            "load": "ModuleNotFoundError: No module named 'muestra_no_such_module'"
        }

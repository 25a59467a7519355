"""The plugin registry: built-ins first, then entry points, minus those disabled by name; what each registered.

    plugins = Plugins.load({"greedy": "muestra.plugin.builtins.greedy"})
    samplers = plugins.call_register_hook("register_samplers", "sampler", accept_sampler)
    plugins.records()  # every plugin found: origin, disabled, failures, names it registered per hook

One failure rule for every hook: a plugin whose hook raises, or that registers something invalid,
registers nothing from that hook call and is listed with its error. A name already registered by an
earlier plugin is not a failure: the first registration wins and the later one is logged and skipped.

The entry points are found, and each one imported, once per process: a gateway loads its samplers,
constraints and proposers from one import of each plugin. `forget_entry_points()` finds them again.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import importlib.metadata
import logging
import os
import types
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import pluggy

from muestra.plugin import ENTRY_POINT_GROUP, hookimpl, hookspecs

log = logging.getLogger("muestra.plugins")
DISABLE_ENV = "MUESTRA_DISABLE_PLUGINS"


@dataclasses.dataclass
class PluginRecord:
    """One plugin found at start-up: where it came from and what became of it."""

    name: str
    distribution: str
    version: str
    disabled: bool = False
    # Why it registers nothing from a hook: "load" or a hook name -> "ErrorType: message".
    errors: dict[str, str] = dataclasses.field(default_factory=dict)
    # Hook name -> the names it registered through that hook, in order.
    registered: dict[str, list[str]] = dataclasses.field(default_factory=dict)

    @property
    def failed(self) -> bool:
        return bool(self.errors)


class Registration(NamedTuple):
    """One accepted register(...) call: the name it claims, the registered value, and any aliases."""

    name: str
    value: Any
    aliases: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class Registered:
    """A registered value and the plugin, distribution and version it came from.

    Each kind's registry subclasses it to name the value (RegisteredSampler.sampler, SchedulerEntry.factory).
    """

    name: str
    value: Any
    aliases: tuple[str, ...] = ()
    plugin: str = ""
    distribution: str = ""
    version: str = ""


class InvalidRegistration(TypeError):
    """A plugin called register(...) with something that cannot be registered."""


class BuiltinPlugin:
    """A built-in plugin object: registers the samplers and constraints it is given through the matching hooks.

    `module` is where it is built; its record names that module's distribution, as a module plugin's would.
    """

    def __init__(self, module: str, *, samplers: tuple = (), constraints: tuple = (), proposers: tuple = ()) -> None:
        self.module = module
        self.samplers = samplers
        self.constraints = constraints
        self.proposers = proposers

    @hookimpl
    def register_samplers(self, register):
        for sampler in self.samplers:
            register(sampler)

    @hookimpl
    def register_constraints(self, register):
        for constraint in self.constraints:
            register(constraint)

    @hookimpl
    def register_proposers(self, register):
        for proposer in self.proposers:
            register(proposer)


def disabled_names(env: Mapping[str, str] | None = None) -> set[str]:
    """Names listed in MUESTRA_DISABLE_PLUGINS (comma- or space-separated)."""
    raw = (os.environ if env is None else env).get(DISABLE_ENV, "")
    return {name.strip() for name in raw.replace(",", " ").split() if name.strip()}


@functools.cache
def _distribution_of(module_name: str) -> tuple[str, str]:
    """The distribution that ships the module, and its version ("", "" when unknown).

    Editable installs do not list their modules in the distribution's RECORD, so the
    repository's naming convention (muestra.gateway.* -> muestra-gateway) is tried first;
    packages_distributions() reads every installed distribution, so only when that fails.
    """
    parts = module_name.split(".")

    def candidates():
        yield "-".join(parts[:2])
        yield parts[0]
        yield from importlib.metadata.packages_distributions().get(parts[0], [])

    for dist_name in candidates():
        try:
            return dist_name, importlib.metadata.version(dist_name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return "", ""


def _error(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


@functools.cache
def entry_points() -> tuple[importlib.metadata.EntryPoint, ...]:
    """The `muestra` entry points of this environment, found once per process."""
    return tuple(importlib.metadata.entry_points(group=ENTRY_POINT_GROUP))


@functools.cache
def _import(entry_point: importlib.metadata.EntryPoint) -> tuple[Any, str]:
    """(the plugin, "") or (None, the error): an entry point is imported, or fails, once per process."""
    try:
        return entry_point.load(), ""
    except Exception as exc:  # a broken third-party plugin must not take the service down
        log.exception("plugin %s (%s) failed to load; skipped", entry_point.name, entry_point.value)
        return None, _error(exc)


def forget_entry_points() -> None:
    """Find and import the entry points again at the next load (a test that installs or fakes one)."""
    entry_points.cache_clear()
    _import.cache_clear()


class Plugins:
    """The loaded plugins and their records. Hooks are called once, at start-up, never on the hot path."""

    def __init__(self, pm: pluggy.PluginManager, records: list[PluginRecord]) -> None:
        self.pm = pm
        self._records = {record.name: record for record in records}

    @classmethod
    def load(cls, builtins: Mapping[str, Any], env: Mapping[str, str] | None = None) -> Plugins:
        """The built-ins, then every `muestra` entry point, minus those named in MUESTRA_DISABLE_PLUGINS.

        builtins maps plugin name -> a module path, a BuiltinPlugin, or another object with hookimpls.
        """
        disabled = disabled_names(env)
        pm = pluggy.PluginManager(ENTRY_POINT_GROUP)
        pm.add_hookspecs(hookspecs)
        records: list[PluginRecord] = []
        for name, plugin in builtins.items():
            if isinstance(plugin, str):
                plugin = importlib.import_module(plugin)
            if isinstance(plugin, types.ModuleType):
                module_name = plugin.__name__
            else:
                module_name = plugin.module if isinstance(plugin, BuiltinPlugin) else type(plugin).__module__
            records.append(PluginRecord(name, *_distribution_of(module_name), disabled=name in disabled))
            if name not in disabled:
                pm.register(plugin, name=name)
        for entry_point in entry_points():
            dist = entry_point.dist.name if entry_point.dist else ""
            version = entry_point.dist.version if entry_point.dist else ""
            record = PluginRecord(entry_point.name, dist, version, disabled=entry_point.name in disabled)
            if any(r.name == record.name for r in records):
                continue  # a built-in of the same name, or the same entry point seen twice
            records.append(record)
            if record.disabled:
                continue  # not imported at all: disabling is how to get past a plugin that breaks on import
            plugin, error = _import(entry_point)
            if error:
                record.errors["load"] = error
            else:
                pm.register(plugin, name=entry_point.name)
        for record in records:
            if record.disabled:
                log.info("plugin %s disabled by %s", record.name, DISABLE_ENV)
        return cls(pm, records)

    def records(self) -> list[PluginRecord]:
        """Every plugin found, disabled and failed ones included, in load order."""
        return list(self._records.values())

    def call_register_hook(
        self,
        hook: str,
        what: str,
        accept: Callable[..., Registration],
        key: Callable[[str], str] = str,
        entry_type: type[Registered] = Registered,
    ) -> list[Registered]:
        """Call every plugin's `hook` with its own `register` callback; what they registered, first name wins.

        accept(*args, **kwargs) turns one register(...) call into a Registration, raising TypeError or
        ValueError for an invalid one. key(name) is how names compare (e.g. ignoring case). Each accepted
        registration becomes an `entry_type`.
        """
        taken: dict[str, Registered] = {}
        accepted: list[Registered] = []
        for impl in getattr(self.pm.hook, hook).get_hookimpls():
            record = self._records[impl.plugin_name]
            pending = self._call(impl, hook, what, accept, record, entry_type)
            for entry in pending:
                clash = next((n for n in (entry.name, *entry.aliases) if key(n) in taken), None)
                if clash is not None:
                    owner = taken[key(clash)]
                    log.warning(
                        "plugin %s: %s %r not registered: %r is taken by %r from plugin %s",
                        record.name, what, entry.name, clash, owner.name, owner.plugin,
                    )  # fmt: skip
                    continue
                for name in (entry.name, *entry.aliases):
                    taken[key(name)] = entry
                accepted.append(entry)
                record.registered.setdefault(hook, []).append(entry.name)
        return accepted

    def _call(self, impl, hook: str, what: str, accept, record: PluginRecord, entry_type) -> list[Registered]:
        """One plugin's registrations from one hook call: all of them, or none if it failed."""
        pending: list[Registered] = []
        invalid: list[InvalidRegistration] = []

        def register(*args, **kwargs) -> None:
            try:
                name, value, aliases = accept(*args, **kwargs)
            except (TypeError, ValueError) as exc:
                invalid.append(InvalidRegistration(f"plugin {record.name!r} registered an invalid {what}: {exc}"))
                raise invalid[-1] from None
            pending.append(entry_type(name, value, tuple(aliases), record.name, record.distribution, record.version))

        try:
            impl.function(**{arg: register for arg in impl.argnames})
            if invalid:  # the plugin caught the error itself: still a failure
                raise invalid[0]
        except Exception as exc:  # a broken plugin must not take the service down
            log.exception("plugin %s failed in %s; it registers nothing from it", record.name, hook)
            record.errors[hook] = _error(exc)
            return []
        return pending

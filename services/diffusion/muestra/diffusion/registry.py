"""The scheduler registry: names and aliases to scheduler factories, filled by plugins at start-up."""

from __future__ import annotations

import dataclasses
import functools
import importlib.metadata
import logging
from collections.abc import Callable, Mapping
from typing import Any

from muestra.plugin.manager import load_plugins
from muestra.runtime.errors import InvalidArgument

log = logging.getLogger("muestra.diffusion.schedulers")

BUILTIN_PLUGINS = {"diffusion-schedulers": "muestra.diffusion.schedulers"}
DISTRIBUTION = "muestra-diffusion"

# A scheduler class (built with `cls.from_config(base_config)`) or a callable `(base_config) -> scheduler`.
SchedulerFactory = Callable[[Mapping[str, Any]], Any]


@dataclasses.dataclass(frozen=True)
class SchedulerEntry:
    name: str
    aliases: tuple[str, ...]
    factory: SchedulerFactory
    plugin: str = ""
    distribution: str = ""
    version: str = ""

    def build(self, base_config: Mapping[str, Any], options: Mapping[str, Any] | None = None) -> Any:
        """A fresh scheduler from the pipeline's own scheduler config, with `options` overriding its config."""
        if isinstance(self.factory, type):
            scheduler = self.factory.from_config(base_config)
        else:
            scheduler = self.factory(base_config)
        if options:
            scheduler = type(scheduler).from_config({**scheduler.config, **options})
        return scheduler


def _key(name: str) -> str:
    return name.strip().lower()


class SchedulerRegistry:
    """Registered schedulers; lookups by name or alias ignore case. The first registration of a name wins."""

    def __init__(self) -> None:
        self._entries: dict[str, SchedulerEntry] = {}
        self._by_key: dict[str, SchedulerEntry] = {}

    def register(
        self,
        name: str,
        factory: SchedulerFactory,
        aliases: tuple[str, ...] | list[str] = (),
        *,
        plugin: str = "",
        distribution: str = "",
        version: str = "",
    ) -> None:
        if not isinstance(name, str) or not name.strip():
            raise ValueError(f"scheduler name must be a non-empty string, got {name!r}")
        if not (isinstance(factory, type) and hasattr(factory, "from_config")) and not callable(factory):
            raise TypeError(f"scheduler {name!r}: factory must be a scheduler class or a callable, got {factory!r}")
        entry = SchedulerEntry(name, tuple(aliases), factory, plugin, distribution, version)
        taken = [n for n in (name, *aliases) if _key(n) in self._by_key]
        if taken:
            owner = self._by_key[_key(taken[0])]
            log.warning(
                "plugin %s: scheduler %r not registered: %r is taken by %r from plugin %s",
                plugin, name, taken[0], owner.name, owner.plugin,
            )  # fmt: skip
            return
        self._entries[name] = entry
        for n in (name, *aliases):
            self._by_key[_key(n)] = entry

    def get(self, name: str) -> SchedulerEntry | None:
        return self._by_key.get(_key(name))

    def resolve(self, name: str, field: str = "sampler") -> SchedulerEntry:
        """The entry for `name`, or InvalidArgument listing the known names."""
        entry = self.get(name)
        if entry is None:
            raise InvalidArgument(field, f"unknown sampler {name!r}; known: {', '.join(self.names())}")
        return entry

    def model_default(self, scheduler: Any) -> SchedulerEntry:
        """An entry that rebuilds the pipeline's own scheduler, named as registered when its class is."""
        registered = self.get(type(scheduler).__name__)
        return SchedulerEntry(registered.name if registered else type(scheduler).__name__, (), type(scheduler))

    def names(self) -> list[str]:
        return list(self._entries)

    def entries(self) -> list[SchedulerEntry]:
        return list(self._entries.values())

    def remove(self, name: str) -> None:
        entry = self._entries.pop(name)
        for n in (entry.name, *entry.aliases):
            self._by_key.pop(_key(n), None)

    def keep_buildable(self, base_config: Mapping[str, Any]) -> None:
        """Drop (and log) every scheduler that cannot be built from the loaded pipeline's scheduler config."""
        for entry in self.entries():
            try:
                entry.build(base_config).set_timesteps(4)
            except Exception:  # a broken plugin must not take the service down
                log.exception("scheduler %r (plugin %s) unbuildable here; dropped", entry.name, entry.plugin)
                self.remove(entry.name)


def _call_hookimpl(impl, register: Callable[..., None]) -> None:
    kwargs = {"register": register}
    impl.function(*(kwargs[arg] for arg in impl.argnames))


def _origin(plugin: str, record) -> tuple[str, str]:
    """The distribution and version a plugin came from; built-ins are ours even in an editable install."""
    if record is not None and record.distribution:
        return record.distribution, record.version
    if plugin in BUILTIN_PLUGINS:
        try:
            return DISTRIBUTION, importlib.metadata.version(DISTRIBUTION)
        except importlib.metadata.PackageNotFoundError:
            return DISTRIBUTION, ""
    return "", ""


def load_scheduler_registry(env: dict | None = None) -> SchedulerRegistry:
    """Built-in and entry-point plugins' `register_schedulers` hooks, each registration tagged with its plugin."""
    pm, records = load_plugins(BUILTIN_PLUGINS, env)
    by_plugin = {record.name: record for record in records}
    registry = SchedulerRegistry()
    # Call each plugin's hook on its own, in registration order (built-ins first), to know who registered what.
    for impl in pm.hook.register_schedulers.get_hookimpls():
        distribution, version = _origin(impl.plugin_name, by_plugin.get(impl.plugin_name))
        register = functools.partial(
            registry.register, plugin=impl.plugin_name, distribution=distribution, version=version
        )
        try:
            _call_hookimpl(impl, register)
        except Exception:  # a broken plugin must not take the service down
            log.exception("plugin %s failed in register_schedulers; rest skipped", impl.plugin_name)
    return registry

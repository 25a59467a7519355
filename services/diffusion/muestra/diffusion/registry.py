"""The scheduler registry: names and aliases to scheduler factories, filled by plugins at start-up."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

from muestra.plugin.manager import Registered, Registration
from muestra.plugin.registry import Registry
from muestra.runtime.errors import InvalidArgument

log = logging.getLogger("muestra.diffusion.schedulers")

BUILTIN_PLUGINS = {"diffusion-schedulers": "muestra.diffusion.schedulers"}

# A scheduler class (built with `cls.from_config(base_config)`) or a callable `(base_config) -> scheduler`.
SchedulerFactory = Callable[[Mapping[str, Any]], Any]


class SchedulerEntry(Registered):
    """A scheduler factory, its aliases and where it came from."""

    @property
    def factory(self) -> SchedulerFactory:
        return self.value

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


def _accept(name: str, factory: SchedulerFactory, aliases: tuple[str, ...] | list[str] = ()) -> Registration:
    """register(name, factory, aliases=()) as the register_schedulers hook calls it, checked."""
    if not isinstance(name, str) or not name.strip():
        raise ValueError(f"scheduler name must be a non-empty string, got {name!r}")
    if not (isinstance(factory, type) and hasattr(factory, "from_config")) and not callable(factory):
        raise TypeError(f"scheduler {name!r}: factory must be a scheduler class or a callable, got {factory!r}")
    return Registration(name, factory, tuple(aliases))


class SchedulerRegistry(Registry[SchedulerEntry]):
    """Registered schedulers; lookups by name or alias ignore case."""

    hook, what, entry_type = "register_schedulers", "scheduler", SchedulerEntry
    builtins = BUILTIN_PLUGINS
    accept = staticmethod(_accept)
    key = staticmethod(_key)

    def get(self, name: str) -> SchedulerEntry | None:
        return self.find(name)

    def resolve(self, name: str, field: str = "sampler") -> SchedulerEntry:
        """The entry for `name`, or InvalidArgument listing the known names."""
        entry = self.find(name)
        if entry is None:
            raise InvalidArgument(field, f"unknown sampler {name!r}; known: {', '.join(self.names())}")
        return entry

    def model_default(self, scheduler: Any) -> SchedulerEntry:
        """An entry that rebuilds the pipeline's own scheduler, named as registered when its class is."""
        registered = self.find(type(scheduler).__name__)
        return SchedulerEntry(registered.name if registered else type(scheduler).__name__, type(scheduler))

    def names(self) -> list[str]:
        """In registration order, the built-ins' first, as ListSchedulers lists them."""
        return [entry.name for entry in self.entries()]

    def keep_buildable(self, base_config: Mapping[str, Any]) -> None:
        """Drop (and log) every scheduler that cannot be built from the loaded pipeline's scheduler config."""
        for entry in self.entries():
            try:
                entry.build(base_config).set_timesteps(4)
            except Exception:  # a broken plugin must not take the service down
                log.exception("scheduler %r (plugin %s) unbuildable here; dropped", entry.name, entry.plugin)
                self.remove(entry.name)


def load_scheduler_registry(env: Mapping[str, str] | None = None) -> SchedulerRegistry:
    """Built-in and entry-point plugins' `register_schedulers` hooks; the first plugin to claim a name wins."""
    return SchedulerRegistry.load(env)

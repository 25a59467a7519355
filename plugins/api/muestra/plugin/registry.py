"""Registry: what one register hook registered, by name. Each kind (samplers, constraint kinds, proposers,
diffusion schedulers) is a subclass that names its hook, its entry type and how one register(...) call is
checked; loading, lookups and listings are this one class's.

    class ConstraintRegistry(Registry[RegisteredConstraint]):
        hook, what, entry_type = "register_constraints", "constraint", RegisteredConstraint
        builtins = BUILTIN_CONSTRAINT_MODULES
        check = staticmethod(check_constraint)

    registry = ConstraintRegistry.load()  # at start-up; the hot path only reads it
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar, Generic, TypeVar

from muestra.plugin.manager import PluginRecord, Plugins, Registered, Registration

E = TypeVar("E", bound=Registered)
R = TypeVar("R", bound="Registry")


class Registry(Generic[E]):
    """Entries of one kind by name (and alias), built from the plugins once."""

    hook: ClassVar[str]  # the hookspec whose implementations fill it, e.g. "register_samplers"
    what: ClassVar[str]  # what one entry is called in errors and logs, e.g. "sampler"
    entry_type: ClassVar[type[Registered]]  # the Registered subclass that names the value
    builtins: ClassVar[Mapping[str, Any]] = {}  # plugin name -> built-in plugin, loaded before the entry points
    check: ClassVar[Callable[[Any], None]]  # register(value)'s check: TypeError or ValueError (a staticmethod)
    key: ClassVar[Callable[[str], str]] = str  # how names compare (a staticmethod; the schedulers ignore case)

    def __init__(self, entries: Sequence[E], records: Sequence[PluginRecord] = ()) -> None:
        self._entries = {entry.name: entry for entry in entries}
        self._by_key = {self.key(name): entry for entry in entries for name in (entry.name, *entry.aliases)}
        self._records = list(records)

    @classmethod
    def accept(cls, value: Any) -> Registration:
        """One register(value) call, checked: the value registers under its own `name`. A kind whose register
        takes more (the schedulers' register(name, factory, aliases=())) overrides this."""
        cls.check(value)
        return Registration(value.name, value)

    @classmethod
    def load(cls: type[R], env: Mapping[str, str] | None = None, builtin_modules: Mapping[str, Any] | None = None) -> R:
        """Built-ins, then every `muestra` entry point, minus those named in MUESTRA_DISABLE_PLUGINS."""
        plugins = Plugins.load(cls.builtins if builtin_modules is None else builtin_modules, env)
        registered = plugins.call_register_hook(cls.hook, cls.what, cls.accept, cls.key, cls.entry_type)
        return cls(registered, plugins.records())

    def __contains__(self, name: str) -> bool:
        return self.key(name) in self._by_key

    def find(self, name: str) -> E | None:
        """The entry registered under `name` or one of its aliases, or None."""
        return self._by_key.get(self.key(name))

    def lookup(self, name: str) -> E:
        """The entry registered under `name`; KeyError naming the registered ones otherwise."""
        entry = self.find(name)
        if entry is None:
            raise KeyError(f"unknown {self.what} {name!r}; registered: {', '.join(self.names())}")
        return entry

    def names(self) -> list[str]:
        return sorted(self._entries)

    def list(self) -> list[E]:
        """Every entry with its plugin, distribution and version, by name."""
        return [self._entries[name] for name in sorted(self._entries)]

    def entries(self) -> list[E]:
        """Every entry in registration order: the built-ins' first."""
        return list(self._entries.values())

    def by_plugin(self) -> dict[str, list[E]]:
        """Plugin name -> what it registered, by name."""
        plugins: dict[str, list[E]] = {}
        for entry in self.list():
            plugins.setdefault(entry.plugin, []).append(entry)
        return plugins

    def records(self) -> list[PluginRecord]:
        """Every plugin found, disabled and failed ones included, in load order."""
        return list(self._records)

    @property
    def errors(self) -> dict[str, dict[str, str]]:
        """Plugin -> {"load" or hook name: error}, for the plugins that failed."""
        return {record.name: record.errors for record in self._records if record.failed}

    def remove(self, name: str) -> None:
        """Forget the entry registered under `name`, and its aliases."""
        entry = self._entries.pop(name)
        for alias in (entry.name, *entry.aliases):
            self._by_key.pop(self.key(alias), None)

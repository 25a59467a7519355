"""Loading plugins: built-ins first, then entry points, minus those disabled by name."""

from __future__ import annotations

import dataclasses
import importlib
import importlib.metadata
import logging
import os
from types import ModuleType

import pluggy

from muestra.plugin import hookspecs

log = logging.getLogger("muestra.plugins")
DISABLE_ENV = "MUESTRA_DISABLE_PLUGINS"


@dataclasses.dataclass
class PluginRecord:
    name: str
    distribution: str
    version: str
    disabled: bool = False


def disabled_names(env: dict | None = None) -> set[str]:
    """Names listed in MUESTRA_DISABLE_PLUGINS (comma- or space-separated)."""
    raw = (os.environ if env is None else env).get(DISABLE_ENV, "")
    return {name.strip() for name in raw.replace(",", " ").split() if name.strip()}


def _distribution_of(module: ModuleType) -> tuple[str, str]:
    """The distribution that ships `module`, and its version ("", "" when unknown).

    Editable installs do not list their modules in the distribution's RECORD, so the
    repository's naming convention (muestra.gateway.* -> muestra-gateway) is tried first.
    """
    parts = module.__name__.split(".")
    candidates = ["-".join(parts[:2]), parts[0]]
    candidates += importlib.metadata.packages_distributions().get(parts[0], [])
    for dist_name in candidates:
        try:
            return dist_name, importlib.metadata.version(dist_name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return "", ""


def call_register_hook(pm: pluggy.PluginManager, hook_name: str, make_register) -> list[str]:
    """Call each plugin's implementation of a register-style hook with its own callback.

    make_register(plugin_name) returns the `register` callable for that plugin, so every
    registration is attributed to the plugin that made it. A plugin whose hook raises is
    logged and skipped; the names of those plugins are returned.
    """
    failed = []
    for impl in getattr(pm.hook, hook_name).get_hookimpls():
        try:
            impl.function(**{name: make_register(impl.plugin_name) for name in impl.argnames})
        except Exception:  # a broken third-party plugin must not take the service down
            log.exception("plugin %s failed in %s; skipped", impl.plugin_name, hook_name)
            failed.append(impl.plugin_name)
    return failed


def load_plugins(
    builtin_modules: dict[str, str], env: dict | None = None
) -> tuple[pluggy.PluginManager, list[PluginRecord]]:
    """A plugin manager holding the built-in modules and every `muestra` entry point not disabled.

    builtin_modules maps plugin name -> module path, e.g. {"greedy": "muestra.gateway.samplers.greedy"}.
    """
    disabled = disabled_names(env)
    pm = pluggy.PluginManager("muestra")
    pm.add_hookspecs(hookspecs)
    records: list[PluginRecord] = []
    for name, module_path in builtin_modules.items():
        module = importlib.import_module(module_path)
        dist, version = _distribution_of(module)
        records.append(PluginRecord(name, dist, version, disabled=name in disabled))
        if name not in disabled:
            pm.register(module, name=name)
    for entry_point in importlib.metadata.entry_points(group="muestra"):
        dist = entry_point.dist.name if entry_point.dist else ""
        version = entry_point.dist.version if entry_point.dist else ""
        record = PluginRecord(entry_point.name, dist, version, disabled=entry_point.name in disabled)
        records.append(record)
        if record.disabled or pm.has_plugin(entry_point.name):
            continue
        try:
            pm.register(entry_point.load(), name=entry_point.name)
        except Exception:  # a broken third-party plugin must not take the service down
            log.exception("plugin %s from %s failed to load; skipped", entry_point.name, dist)
            record.disabled = True
    for record in records:
        if record.disabled and record.name in disabled:
            log.info("plugin %s disabled by %s", record.name, DISABLE_ENV)
    return pm, records

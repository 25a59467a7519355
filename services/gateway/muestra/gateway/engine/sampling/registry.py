"""SamplerRegistry: every sampler that the built-in and installed plugins registered at start-up."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from typing import Any

from muestra.plugin import Sampler, kind_of
from muestra.plugin.builtins import BUILTIN_SAMPLER_MODULES, load_samplers
from muestra.v1 import gateway_pb2


@dataclasses.dataclass(frozen=True)
class RegisteredSampler:
    """A sampler and where it came from."""

    sampler: Sampler
    plugin: str
    distribution: str
    version: str

    @property
    def name(self) -> str:
        return self.sampler.name

    @property
    def kind(self) -> str:
        """ "processor", "selector" or "search"."""
        return kind_of(self.sampler)

    def to_proto(self) -> gateway_pb2.SamplerInfo:
        return gateway_pb2.SamplerInfo(
            **info_fields(self, self.sampler), argmax_invariant=self.sampler.argmax_invariant
        )


def info_fields(entry, registered: Sampler | Any) -> dict:
    """The fields SamplerInfo and ConstraintInfo share: what was registered, by which plugin."""
    return {
        "name": registered.name,
        "plugin": entry.plugin,
        "distribution": entry.distribution,
        "version": entry.version,
        "description": registered.description,
        "parameter_schema": json.dumps(registered.parameter_schema, sort_keys=True),
    }


@dataclasses.dataclass(frozen=True)
class PluginSummary:
    """A plugin as ListPlugins and `muestra plugins` show it."""

    name: str
    distribution: str
    version: str
    disabled: bool  # by MUESTRA_DISABLE_PLUGINS, or failed to load or to register
    samplers: tuple[str, ...]
    errors: Mapping[str, str] = dataclasses.field(default_factory=dict)  # "load" or hook name -> error

    def to_proto(self) -> gateway_pb2.PluginInfo:
        return gateway_pb2.PluginInfo(
            name=self.name,
            distribution=self.distribution,
            version=self.version,
            disabled=self.disabled,
            samplers=list(self.samplers),
        )


class SamplerRegistry:
    """Samplers by name. Built from the plugins once; the hot path only reads it."""

    def __init__(self, samplers: list[RegisteredSampler], plugins: list[PluginSummary]) -> None:
        self._samplers = {entry.name: entry for entry in samplers}
        self._plugins = plugins

    @classmethod
    def load(
        cls, env: Mapping[str, str] | None = None, builtin_modules: Mapping[str, Any] = BUILTIN_SAMPLER_MODULES
    ) -> SamplerRegistry:
        """Built-ins, then every `muestra` entry point, minus those named in MUESTRA_DISABLE_PLUGINS."""
        plugins, registered = load_samplers(env, builtin_modules)
        samplers = [RegisteredSampler(e.value, e.plugin, e.distribution, e.version) for e in registered]
        summaries = [
            PluginSummary(
                record.name,
                record.distribution,
                record.version,
                record.disabled or record.failed,
                tuple(record.registered.get("register_samplers", ())),
                record.errors,
            )
            for record in plugins.records()
        ]
        return cls(samplers, summaries)

    def __contains__(self, name: str) -> bool:
        return name in self._samplers

    def get(self, name: str) -> Sampler:
        """The sampler registered under `name`; KeyError naming the registered ones otherwise."""
        if name not in self._samplers:
            raise KeyError(f"unknown sampler {name!r}; registered: {', '.join(sorted(self._samplers))}")
        return self._samplers[name].sampler

    def source(self, name: str) -> tuple[str, str, str]:
        """(name, distribution, version) of the sampler registered under `name`: an lm runs it only if it
        registered the same (DescribeModelResponse.samplers)."""
        entry = self._samplers[name]
        return entry.name, entry.distribution, entry.version

    def names(self) -> list[str]:
        return sorted(self._samplers)

    def list(self) -> list[RegisteredSampler]:
        """Every sampler with its plugin, distribution and version, by name."""
        return [self._samplers[name] for name in sorted(self._samplers)]

    def plugins(self) -> list[PluginSummary]:
        """Every plugin found, disabled ones included, with the samplers each registered."""
        return list(self._plugins)

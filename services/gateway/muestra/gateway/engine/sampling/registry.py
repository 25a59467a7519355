"""SamplerRegistry: every sampler that the built-in and installed plugins registered at start-up."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from muestra.gateway.engine.constraints.registry import info_fields
from muestra.plugin import Sampler, check_sampler, kind_of
from muestra.plugin.builtins import BUILTIN_SAMPLER_MODULES
from muestra.plugin.manager import Registered
from muestra.plugin.registry import Registry
from muestra.v1 import gateway_pb2


class RegisteredSampler(Registered):
    """A sampler and where it came from."""

    @property
    def sampler(self) -> Sampler:
        return self.value

    @property
    def kind(self) -> str:
        """ "processor", "selector" or "search"."""
        return kind_of(self.sampler)

    def to_proto(self) -> gateway_pb2.SamplerInfo:
        return gateway_pb2.SamplerInfo(**info_fields(self), argmax_invariant=self.sampler.argmax_invariant)


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


class SamplerRegistry(Registry[RegisteredSampler]):
    """Samplers by name. Built from the plugins once; the hot path only reads it."""

    hook, what, entry_type = "register_samplers", "sampler", RegisteredSampler
    builtins = BUILTIN_SAMPLER_MODULES
    check = staticmethod(check_sampler)

    def get(self, name: str) -> Sampler:
        """The sampler registered under `name`; KeyError naming the registered ones otherwise."""
        return self.lookup(name).sampler

    def source(self, name: str) -> tuple[str, str, str]:
        """(name, distribution, version) of the sampler registered under `name`: an lm runs it only if it
        registered the same (DescribeModelResponse.samplers)."""
        entry = self.lookup(name)
        return entry.name, entry.distribution, entry.version

    def plugins(self) -> list[PluginSummary]:
        """Every plugin found, disabled ones included, with the samplers each registered."""
        return [
            PluginSummary(
                record.name,
                record.distribution,
                record.version,
                record.disabled or record.failed,
                tuple(record.registered.get(self.hook, ())),
                record.errors,
            )
            for record in self.records()
        ]

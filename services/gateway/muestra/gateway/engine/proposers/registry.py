"""ProposerRegistry: the draft proposers that the built-in and installed plugins registered at start-up,
and a request's choice among them."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from google.protobuf import json_format

from muestra.gateway.engine.proposers import BUILTIN_PROPOSER_MODULES
from muestra.plugin import DraftProposer, SamplerParamError, check_proposer
from muestra.plugin.manager import Plugins, Registration
from muestra.runtime.errors import InvalidArgument
from muestra.v1 import gateway_pb2

OFF = "off"


@dataclasses.dataclass(frozen=True)
class RegisteredProposer:
    proposer: DraftProposer
    plugin: str
    distribution: str
    version: str

    @property
    def name(self) -> str:
        return self.proposer.name


@dataclasses.dataclass(frozen=True)
class Speculation:
    """A request's proposer with its checked params."""

    proposer: DraftProposer
    params: dict

    @property
    def max_draft_tokens(self) -> int:
        return self.params["max_draft_tokens"]

    @property
    def adaptive(self) -> bool:
        return self.params.get("adaptive", True)


def _accept(proposer: DraftProposer) -> Registration:
    check_proposer(proposer)
    return Registration(proposer.name, proposer)


class ProposerRegistry:
    """Proposers by name. Built from the plugins once."""

    def __init__(self, proposers: list[RegisteredProposer], default: gateway_pb2.SpeculationSpec | None = None) -> None:
        self._proposers = {entry.name: entry for entry in proposers}
        # What a request without a SpeculationSpec gets (the gateway's --speculation).
        self.default = default if default is not None else gateway_pb2.SpeculationSpec(proposer=OFF)

    @classmethod
    def load(
        cls, env: Mapping[str, str] | None = None, builtin_modules: Mapping[str, Any] = BUILTIN_PROPOSER_MODULES
    ) -> ProposerRegistry:
        plugins = Plugins.load(builtin_modules, env)
        registered = plugins.call_register_hook("register_proposers", "proposer", _accept)
        return cls([RegisteredProposer(e.value, e.plugin, e.distribution, e.version) for e in registered])

    def names(self) -> list[str]:
        return sorted(self._proposers)

    def list(self) -> list[RegisteredProposer]:
        return [self._proposers[name] for name in sorted(self._proposers)]

    def choose(self, spec: gateway_pb2.SpeculationSpec | None, field: str = "speculation") -> Speculation | None:
        """The proposer a request asked for (or the default) with its checked params; None: no speculation."""
        if spec is None:
            spec = self.default
        name = spec.proposer or self.default.proposer
        if name == OFF:
            return None
        if name not in self._proposers:
            known = ", ".join([*self.names(), OFF])
            raise InvalidArgument(f"{field}.proposer", f"unknown proposer {name!r}; registered: {known}")
        proposer = self._proposers[name].proposer
        params = json_format.MessageToDict(spec.params) if spec.HasField("params") else {}
        try:
            return Speculation(proposer, proposer.validate(params))
        except SamplerParamError as exc:
            raise InvalidArgument(f"{field}.params.{exc.field}", exc.message) from exc
        except (TypeError, ValueError) as exc:
            raise InvalidArgument(f"{field}.params", str(exc)) from exc

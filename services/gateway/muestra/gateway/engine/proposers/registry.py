"""ProposerRegistry: the draft proposers that the built-in and installed plugins registered at start-up,
and a request's choice among them."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from muestra.gateway.engine.proposers import BUILTIN_PROPOSER_MODULES
from muestra.gateway.engine.requests import Step
from muestra.plugin import DraftProposer, SamplerParamError, check_proposer
from muestra.plugin.manager import PluginRecord, Registered
from muestra.plugin.registry import Registry
from muestra.runtime.errors import InvalidArgument

OFF = "off"


class RegisteredProposer(Registered):
    """A proposer and where it came from."""

    @property
    def proposer(self) -> DraftProposer:
        return self.value


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


class ProposerRegistry(Registry[RegisteredProposer]):
    """Proposers by name. Built from the plugins once."""

    hook, what, entry_type = "register_proposers", "proposer", RegisteredProposer
    builtins = BUILTIN_PROPOSER_MODULES
    check = staticmethod(check_proposer)

    def __init__(self, proposers: Sequence[RegisteredProposer], records: Sequence[PluginRecord] = ()) -> None:
        super().__init__(proposers, records)
        # What a request without a SpeculationSpec gets (the gateway's --speculation).
        self.default = Step(OFF)

    def choose(self, spec: Step | None, field: str = "speculation") -> Speculation | None:
        """The proposer a request asked for (or the default) with its checked params; None: no speculation."""
        if spec is None:
            spec = self.default
        name = spec.name or self.default.name
        if name == OFF:
            return None
        if name not in self:
            known = ", ".join([*self.names(), OFF])
            raise InvalidArgument(f"{field}.proposer", f"unknown proposer {name!r}; registered: {known}")
        proposer = self.lookup(name).proposer
        params = dict(spec.params)
        try:
            return Speculation(proposer, proposer.validate(params))
        except SamplerParamError as exc:
            raise InvalidArgument(f"{field}.params.{exc.field}", exc.message) from exc
        except (TypeError, ValueError) as exc:
            raise InvalidArgument(f"{field}.params", str(exc)) from exc

    def attach(self, models, lm_timeout_s: float) -> None:
        """Give every proposer the gateway's served models, at start-up (DraftProposer.attach)."""
        for entry in self.entries():
            entry.proposer.attach(models, lm_timeout_s)

    def check_target(self, speculation: Speculation, model, field: str = "speculation") -> None:
        """InvalidArgument naming the param if the request's proposer cannot draft for `model` (a TextModel)."""
        try:
            speculation.proposer.check_target(speculation.params, model)
        except SamplerParamError as exc:
            raise InvalidArgument(f"{field}.params.{exc.field}", exc.message) from exc
        except (TypeError, ValueError) as exc:
            raise InvalidArgument(f"{field}.params", str(exc)) from exc

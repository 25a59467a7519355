"""ConstraintRegistry: every constraint kind that the built-in and installed plugins registered at start-up."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from muestra.gateway.engine.constraints import BUILTIN_CONSTRAINT_MODULES
from muestra.gateway.engine.sampling.registry import info_fields
from muestra.plugin import Constraint, check_constraint
from muestra.plugin.manager import Plugins, Registration
from muestra.v1 import gateway_pb2


@dataclasses.dataclass(frozen=True)
class RegisteredConstraint:
    """A constraint kind and where it came from."""

    constraint: Constraint
    plugin: str
    distribution: str
    version: str

    @property
    def name(self) -> str:
        return self.constraint.name

    def to_proto(self) -> gateway_pb2.ConstraintInfo:
        return gateway_pb2.ConstraintInfo(**info_fields(self, self.constraint))


def _accept(constraint: Constraint) -> Registration:
    check_constraint(constraint)
    return Registration(constraint.name, constraint)


class ConstraintRegistry:
    """Constraint kinds by name. Built from the plugins once."""

    def __init__(self, constraints: list[RegisteredConstraint], errors: Mapping[str, dict] | None = None) -> None:
        self._constraints = {entry.name: entry for entry in constraints}
        self.errors = dict(errors or {})  # plugin -> {"load" or hook name: error}, for the plugins that failed

    @classmethod
    def load(
        cls, env: Mapping[str, str] | None = None, builtin_modules: Mapping[str, Any] = BUILTIN_CONSTRAINT_MODULES
    ) -> ConstraintRegistry:
        """Built-ins, then every `muestra` entry point, minus those named in MUESTRA_DISABLE_PLUGINS."""
        plugins = Plugins.load(builtin_modules, env)
        registered = plugins.call_register_hook("register_constraints", "constraint", _accept)
        return cls(
            [RegisteredConstraint(e.value, e.plugin, e.distribution, e.version) for e in registered],
            {record.name: record.errors for record in plugins.records() if record.failed},
        )

    def __contains__(self, name: str) -> bool:
        return name in self._constraints

    def get(self, name: str) -> Constraint:
        return self._constraints[name].constraint

    def names(self) -> list[str]:
        return sorted(self._constraints)

    def list(self) -> list[RegisteredConstraint]:
        return [self._constraints[name] for name in sorted(self._constraints)]

    def by_plugin(self) -> dict[str, list[RegisteredConstraint]]:
        """Plugin name -> the constraint kinds it registered."""
        plugins: dict[str, list[RegisteredConstraint]] = {}
        for entry in self.list():
            plugins.setdefault(entry.plugin, []).append(entry)
        return plugins

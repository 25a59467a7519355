"""ConstraintRegistry: every constraint kind that the built-in and installed plugins registered at start-up."""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Mapping

from muestra.gateway.constraints import BUILTIN_CONSTRAINT_MODULES
from muestra.plugin import Constraint, check_constraint
from muestra.plugin.manager import call_register_hook, load_plugins
from muestra.v1 import gateway_pb2

log = logging.getLogger("muestra.constraints")


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
        return gateway_pb2.ConstraintInfo(
            name=self.name,
            plugin=self.plugin,
            distribution=self.distribution,
            version=self.version,
            description=self.constraint.description,
            parameter_schema=json.dumps(self.constraint.parameter_schema, sort_keys=True),
        )


class ConstraintRegistry:
    """Constraint kinds by name. Built from the plugins once."""

    def __init__(self, constraints: list[RegisteredConstraint]) -> None:
        self._constraints = {entry.name: entry for entry in constraints}

    @classmethod
    def load(
        cls, env: Mapping[str, str] | None = None, builtin_modules: Mapping[str, str] = BUILTIN_CONSTRAINT_MODULES
    ) -> ConstraintRegistry:
        """Built-ins, then every `muestra` entry point, minus those named in MUESTRA_DISABLE_PLUGINS."""
        pm, records = load_plugins(dict(builtin_modules), None if env is None else dict(env))
        by_plugin = {record.name: record for record in records}
        registered: dict[str, RegisteredConstraint] = {}
        names_by_plugin: dict[str, list[str]] = {}

        def make_register(plugin: str):
            def register(constraint: Constraint) -> None:
                try:
                    check_constraint(constraint)
                except (TypeError, ValueError) as exc:
                    raise TypeError(f"plugin {plugin!r} registered an invalid constraint: {exc}") from None
                if constraint.name in registered:
                    first = registered[constraint.name].plugin
                    log.warning(
                        "constraint %r from plugin %s ignored: %s registered it first", constraint.name, plugin, first
                    )
                    return
                record = by_plugin.get(plugin)
                dist, version = (record.distribution, record.version) if record else ("", "")
                registered[constraint.name] = RegisteredConstraint(constraint, plugin, dist, version)
                names_by_plugin.setdefault(plugin, []).append(constraint.name)

            return register

        failed = set(call_register_hook(pm, "register_constraints", make_register))
        for plugin in failed:  # all or nothing, as for samplers
            for name in names_by_plugin.pop(plugin, []):
                del registered[name]
        return cls(list(registered.values()))

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

"""ConstraintRegistry: every constraint kind that the built-in and installed plugins registered at start-up."""

from __future__ import annotations

import json

from muestra.gateway.engine.constraints import BUILTIN_CONSTRAINT_MODULES
from muestra.plugin import Constraint, check_constraint
from muestra.plugin.manager import Registered
from muestra.plugin.registry import Registry
from muestra.v1 import gateway_pb2


def info_fields(entry: Registered) -> dict:
    """The fields SamplerInfo and ConstraintInfo share: what was registered, by which plugin."""
    return {
        "name": entry.name,
        "plugin": entry.plugin,
        "distribution": entry.distribution,
        "version": entry.version,
        "description": entry.value.description,
        "parameter_schema": json.dumps(entry.value.parameter_schema, sort_keys=True),
    }


class RegisteredConstraint(Registered):
    """A constraint kind and where it came from."""

    @property
    def constraint(self) -> Constraint:
        return self.value

    def to_proto(self) -> gateway_pb2.ConstraintInfo:
        return gateway_pb2.ConstraintInfo(**info_fields(self))


class ConstraintRegistry(Registry[RegisteredConstraint]):
    """Constraint kinds by name. Built from the plugins once."""

    hook, what, entry_type = "register_constraints", "constraint", RegisteredConstraint
    builtins = BUILTIN_CONSTRAINT_MODULES
    check = staticmethod(check_constraint)

    def get(self, name: str) -> Constraint:
        return self.lookup(name).constraint

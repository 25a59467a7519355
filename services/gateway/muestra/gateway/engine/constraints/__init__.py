"""Output constraints: kinds registered by plugins, compiled by the grammar engine, applied per row.

    registry = ConstraintRegistry.load()                         # at start-up: pluggy, entry points
    compiled = await engine.compile(registry, request.constraint) # before admission
    row = RowConstraint(compiled)                                 # one per completion
    fill_masks(rows); row.forced; row.consume(token)             # every decode step

The built-in kinds are ordinary plugins, one per kind, registered through the same
`register_constraints` hook as third-party ones; MUESTRA_DISABLE_PLUGINS names them by kind.
"""

from muestra.gateway.engine.constraints.grammar import LarkGrammar
from muestra.gateway.engine.constraints.json_object import JsonObject
from muestra.gateway.engine.constraints.json_schema import JsonSchema
from muestra.gateway.engine.constraints.regex import Regex
from muestra.plugin.manager import BuiltinPlugin

# Plugin name -> plugin, in registration order (what ConstraintRegistry.load takes as builtin_modules).
BUILTIN_CONSTRAINT_MODULES = {
    constraint.name: BuiltinPlugin(__name__, constraints=(constraint,))
    for constraint in (JsonObject(), JsonSchema(), Regex(), LarkGrammar())
}

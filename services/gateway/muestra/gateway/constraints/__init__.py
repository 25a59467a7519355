"""Output constraints: kinds registered by plugins, compiled by the grammar engine, applied per row.

    registry = ConstraintRegistry.load()                         # at start-up: pluggy, entry points
    compiled = await engine.compile(registry, request.constraint) # before admission
    row = RowConstraint(compiled)                                 # one per completion
    fill_masks(rows); row.forced; row.consume(token)             # every decode step

The built-in kinds are ordinary plugins, registered through the same `register_constraints` hook
as third-party ones; MUESTRA_DISABLE_PLUGINS names them by module name.
"""

BUILTIN_CONSTRAINT_MODULES = {
    name: f"muestra.gateway.constraints.{name}" for name in ("json_object", "json_schema", "regex", "grammar")
}

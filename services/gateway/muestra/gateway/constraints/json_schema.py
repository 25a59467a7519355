"""A JSON value valid against a JSON Schema (OpenAI's response_format json_schema, vLLM's guided_json)."""

from muestra.plugin import REQUIRED, Constraint, Grammar, Object, hookimpl


def _integral(value):
    """The schema with integral floats as ints: a protobuf Struct turns every number into a float."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, dict):
        return {key: _integral(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_integral(item) for item in value]
    return value


class JsonSchema(Constraint):
    name = "json_schema"
    description = "The text is JSON valid against a JSON Schema."
    parameters = {"schema": Object(REQUIRED, "The JSON Schema (draft 2020-12 keywords the engine supports).")}

    def grammar(self, params):
        return Grammar.json_schema(_integral(params["schema"]))


@hookimpl
def register_constraints(register):
    register(JsonSchema())

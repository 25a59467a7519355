"""A JSON value valid against a JSON Schema (OpenAI's response_format json_schema, vLLM's guided_json)."""

import json

from muestra.plugin import REQUIRED, Constraint, Grammar, Param


def _integral(value):
    """The schema with integral floats as ints: a protobuf Struct turns every number into a float."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, dict):
        return {key: _integral(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_integral(item) for item in value]
    return value


def _schema(value) -> dict:
    """The schema as an object. JSON text keeps the order of its properties, which the generated JSON
    follows; a protobuf Struct does not keep key order, so clients send the text."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as exc:
            raise ValueError(f"is not valid JSON: {exc}") from None
    elif isinstance(value, dict):
        value = _integral(value)
    if not isinstance(value, dict):
        raise ValueError(f"must be a JSON Schema object (or its JSON text), got {type(value).__name__}")
    return value


SCHEMA = Param(
    REQUIRED,
    "The JSON Schema, as an object or as JSON text (which keeps the order of its properties).",
    {"type": ["object", "string"]},
    _schema,
)


class JsonSchema(Constraint):
    name = "json_schema"
    description = "The text is JSON valid against a JSON Schema."
    parameters = {"schema": SCHEMA}

    def grammar(self, params):
        return Grammar.json_schema(params["schema"])

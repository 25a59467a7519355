"""A JSON value valid against a JSON Schema (OpenAI's response_format json_schema, vLLM's guided_json).

Before it compiles, the schema gets muestra's defaults (docs/structured.md, "What a schema means here"):
an object schema that lists its properties allows no others unless it says `additionalProperties`,
and an integer without a bound is bounded to int64. With `strict`, a schema that OpenAI's strict mode
would refuse is refused.
"""

import copy
import json

from muestra.plugin import REQUIRED, Bool, Constraint, Grammar, Param, SamplerParamError

INT64_MAX = 2**63 - 1
# -2**63 itself does not compile: llguidance takes bounds through a double and fails on it.
INT64_MIN = -(2**63) + 1024
NUMBER_LIMIT = 10**17  # a number's magnitude, where the schema gives no bound: 17 digits at most

# Keywords whose value is one subschema, a list of them, or a map of names to them.
_ONE = ("additionalProperties", "items", "additionalItems", "contains", "not", "if", "then", "else", "propertyNames")
_LIST = ("anyOf", "oneOf", "prefixItems")
_MAP = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")


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


def _subschemas(schema: dict, path: str):
    """(subschema, its JSON pointer, whether it is a branch of allOf) for each direct subschema."""
    for key in _ONE:
        if isinstance(schema.get(key), dict):
            yield schema[key], f"{path}/{key}", False
    if isinstance(schema.get("items"), list):  # draft 4-7 tuples
        yield from ((item, f"{path}/items/{i}", False) for i, item in enumerate(schema["items"]))
    for key in _LIST:
        if isinstance(schema.get(key), list):
            yield from ((item, f"{path}/{key}/{i}", False) for i, item in enumerate(schema[key]))
    if isinstance(schema.get("allOf"), list):
        yield from ((item, f"{path}/allOf/{i}", True) for i, item in enumerate(schema["allOf"]))
    for key in _MAP:
        if isinstance(schema.get(key), dict):
            yield from ((item, f"{path}/{key}/{name}", False) for name, item in schema[key].items())


def _types(schema: dict) -> set:
    kind = schema.get("type")
    return {kind} if isinstance(kind, str) else set(kind) if isinstance(kind, list) else set()


def _with_defaults(schema, in_all_of: bool = False) -> None:
    """Give every subschema muestra's defaults, in place."""
    if not isinstance(schema, dict):
        return
    lists_keys = "properties" in schema or "patternProperties" in schema
    # A branch of allOf is one part of an intersection: closing it would refuse the other parts' keys.
    if lists_keys and "additionalProperties" not in schema and not in_all_of:
        schema["additionalProperties"] = False
    kinds = _types(schema)
    if "integer" in kinds or "number" in kinds:
        low, high = (INT64_MIN, INT64_MAX) if "number" not in kinds else (-NUMBER_LIMIT, NUMBER_LIMIT)
        if "minimum" not in schema and "exclusiveMinimum" not in schema:
            schema["minimum"] = low
        if "maximum" not in schema and "exclusiveMaximum" not in schema:
            schema["maximum"] = high
    for subschema, _, all_of in _subschemas(schema, ""):
        _with_defaults(subschema, all_of)


def strict_violation(schema: dict, path: str = "#") -> str | None:
    """Why OpenAI's strict mode would refuse the schema (its first reason), or None."""
    if path == "#" and (_types(schema) != {"object"} or "anyOf" in schema):
        return "with strict, the root must be an object schema (type 'object', no anyOf)"
    if "object" in _types(schema) or "properties" in schema:
        if schema.get("additionalProperties") is not False:
            return f"with strict, {path} must set additionalProperties to false"
        required = schema.get("required", [])
        missing = [name for name in schema.get("properties", {}) if name not in required]
        if missing:
            return f"with strict, every property of {path} must be required; not required: {', '.join(missing)}"
    for subschema, where, _ in _subschemas(schema, path):
        if isinstance(subschema, dict):
            found = strict_violation(subschema, where)
            if found:
                return found
    return None


SCHEMA = Param(
    REQUIRED,
    "The JSON Schema, as an object or as JSON text (which keeps the order of its properties).",
    {"type": ["object", "string"]},
    _schema,
)


class JsonSchema(Constraint):
    name = "json_schema"
    description = "The text is JSON valid against a JSON Schema."
    parameters = {
        "schema": SCHEMA,
        "strict": Bool(False, "Refuse a schema that OpenAI's strict mode refuses (every object closed, all required)."),
    }

    def grammar(self, params):
        schema = params["schema"]
        if params["strict"]:
            found = strict_violation(schema)
            if found:
                raise SamplerParamError(self.name, "schema", found)
        schema = copy.deepcopy(schema)
        _with_defaults(schema)
        return Grammar.json_schema(schema)

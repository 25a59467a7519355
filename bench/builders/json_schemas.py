"""Varied JSON Schemas from a seeded generator: nested objects, bounded arrays, enums, ranges, patterns, formats,
anyOf and $ref.

Every string, array and object is bounded (maxLength, maxItems, additionalProperties false), so that a random
model sampling at a high temperature still finishes most documents.
"""

from __future__ import annotations

import random

# Not "date" or "time": RFC 3339 allows what jsonschema's checkers reject (year 0000, some offsets),
# so the engine (which follows RFC 3339) and the checker would disagree on valid text.
FORMATS = ["uuid", "email", "ipv4"]
WORDS = ["alpha", "beta", "gamma", "delta", "rojo", "verde", "azul", "sí", "no", "日本"]


def _leaf(rng: random.Random) -> dict:
    kind = rng.choice(["string", "integer", "number", "boolean", "enum", "const", "pattern", "format", "null"])
    if kind == "string":
        low = rng.randint(0, 3)
        return {"type": "string", "minLength": low, "maxLength": low + rng.randint(0, 10)}
    if kind == "integer":
        low = rng.randint(-1000, 1000)
        return {"type": "integer", "minimum": low, "maximum": low + rng.randint(0, 5000)}
    if kind == "number":
        low = rng.choice([-1.5, 0, 0.25, 10])
        return {"type": "number", "minimum": low, "maximum": low + rng.choice([1, 100, 1e4])}
    if kind == "boolean":
        return {"type": "boolean"}
    if kind == "enum":
        return {"enum": rng.sample(WORDS, rng.randint(1, 4)) + rng.sample([1, 2.5, None, True], rng.randint(0, 2))}
    if kind == "const":
        return {"const": rng.choice(WORDS)}
    if kind == "pattern":
        return {"type": "string", "pattern": rng.choice([r"^[a-z]{2,6}$", r"^\d{3}-\d{4}$", r"^[A-Z][a-z]{0,5}$"])}
    if kind == "format":
        return {"type": "string", "format": rng.choice(FORMATS)}
    return {"type": "null"}


def _value(rng: random.Random, depth: int) -> dict:
    roll = rng.random()
    if depth <= 0 or roll < 0.5:
        return _leaf(rng)
    if roll < 0.7:
        low = rng.randint(0, 2)
        return {"type": "array", "items": _value(rng, depth - 1), "minItems": low, "maxItems": low + rng.randint(0, 3)}
    if roll < 0.85:
        return {"anyOf": [_value(rng, depth - 1) for _ in range(rng.randint(2, 3))]}
    return _object(rng, depth - 1)


def _object(rng: random.Random, depth: int) -> dict:
    names = rng.sample(["id", "name", "age", "tags", "score", "when", "ok", "kind", "items", "meta", "x", "y"], 5)
    properties = {name: _value(rng, depth) for name in names[: rng.randint(1, 5)]}
    required = [name for name in properties if rng.random() < 0.6]
    return {"type": "object", "properties": properties, "required": required, "additionalProperties": False}


def random_schema(seed: int) -> dict:
    """An object schema with nested objects, bounded arrays, enums, ranges, patterns, formats, anyOf and $ref."""
    rng = random.Random(seed)
    schema = _object(rng, depth=rng.randint(1, 3))
    if rng.random() < 0.3:  # a shared definition used through $ref
        schema["$defs"] = {"point": _object(rng, depth=0)}
        schema["properties"]["where"] = {"$ref": "#/$defs/point"}
        if rng.random() < 0.5:
            schema["required"].append("where")
    return schema

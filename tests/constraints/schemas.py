"""Varied JSON Schemas for the structured-generation tests, drawn from a seeded generator.

Every string, array and object is bounded (maxLength, maxItems, additionalProperties false), so
that a random model sampling at a high temperature still finishes most documents.
"""

from __future__ import annotations

import json
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


SCHEMAS = [random_schema(seed) for seed in range(200)]

REGEXES = [
    r"[0-9]{3}-[0-9]{4}",
    r"(yes|no|maybe)",
    r"[a-z]+@[a-z]+\.(com|org)",
    r"[0-9]{4}-[0-9]{2}-[0-9]{2}",  # \d would be any Unicode digit, as in Rust regex
    r"[A-Z][a-z]{1,8}( [A-Z][a-z]{1,8}){0,2}",
    r"(0|[1-9][0-9]{0,5})(\.[0-9]{1,3})?",
    r"#[0-9a-f]{6}",
    r"(ab|cd)+e",
    r"[ -~]{1,12}",
    r"(sí|no), (gracias|por favor)",
]

ARITHMETIC = r"""
start: expr
expr: term (("+" | "-") term)*
term: factor (("*" | "/") factor)*
factor: NUMBER | "(" expr ")" | "-" factor
NUMBER: /0|[1-9][0-9]{0,3}/
"""

SQL = r"""
start: "SELECT " columns " FROM " table where? order? ";"
columns: "*" | column (", " column)*
column: "id" | "name" | "age"
table: "people" | "pets"
where: " WHERE " condition (" AND " condition)*
condition: column " " op " " value
op: "=" | "<" | ">" | "<=" | ">="
value: NUMBER | STRING
order: " ORDER BY " column (" DESC")?
NUMBER: /[0-9]{1,3}/
STRING: /'[a-z]{0,8}'/
"""


# Issue 33's schemas, drawn by hypothesis: strict ones (OpenAI's rules: every object closed, every property
# required, optional values as anyOf null), open ones with and without additionalProperties, integers and
# numbers with no bound or one, and patternProperties with minProperties/maxProperties.
KEYS = ["id", "name", "age", "tags", "score", "ok", "kind", "meta", "x", "y"]


def _string(low: int, more: int) -> dict:
    return {"type": "string", "minLength": low, "maxLength": low + more}


def _hyp_leaf():
    from hypothesis import strategies as st

    return st.one_of(
        st.builds(_string, st.integers(0, 3), st.integers(0, 8)),
        st.just({"type": "integer"}),
        st.just({"type": "number"}),
        st.integers(-1000, 1000).map(lambda low: {"type": "integer", "minimum": low}),
        st.sampled_from([-2.25, 0, 0.5]).map(lambda low: {"type": "number", "minimum": low}),
        st.just({"type": "boolean"}),
        st.just({"type": "null"}),
        st.lists(st.sampled_from(WORDS), min_size=1, max_size=4, unique=True).map(lambda words: {"enum": words}),
    )  # fmt: skip


def _hyp_value(depth: int, strict: bool):
    from hypothesis import strategies as st

    if depth <= 0:
        return _hyp_leaf()
    array = st.builds(
        lambda items, low, more: {"type": "array", "items": items, "minItems": low, "maxItems": low + more},
        _hyp_value(depth - 1, strict), st.integers(0, 1), st.integers(0, 2),
    )  # fmt: skip
    return st.one_of(_hyp_leaf(), array, _hyp_object(depth - 1, strict), _hyp_patterned(strict))


def _hyp_object(depth: int, strict: bool):
    from hypothesis import strategies as st

    @st.composite
    def build(draw):
        names = draw(st.lists(st.sampled_from(KEYS), min_size=1, max_size=4, unique=True))
        properties = {}
        for name in names:
            value = draw(_hyp_value(depth, strict))
            if strict and draw(st.booleans()):
                value = {"anyOf": [value, {"type": "null"}]}  # OpenAI's strict spelling of "optional"
            properties[name] = value
        schema = {"type": "object", "properties": properties}
        schema["required"] = names if strict else [name for name in names if draw(st.booleans())]
        if strict or draw(st.booleans()):
            schema["additionalProperties"] = False
        return schema

    return build()


def _hyp_patterned(strict: bool):
    from hypothesis import strategies as st

    def build(value, low, more):
        schema = {"type": "object", "patternProperties": {"^[a-z]{1,3}$": value}, "minProperties": low}
        schema["maxProperties"] = low + more
        if strict:
            schema["additionalProperties"] = False
        return schema

    return st.builds(build, _hyp_leaf(), st.integers(1, 4), st.integers(0, 2))


def hypothesis_schemas(count: int = 200) -> list[tuple[dict, bool]]:
    """`count` (schema, strict) pairs, the same on every run: hypothesis draws them, derandomized."""
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import strategies as st

    drawn: list[tuple[dict, bool]] = []

    @settings(
        max_examples=count, derandomize=True, database=None, deadline=None,
        phases=[Phase.generate], suppress_health_check=list(HealthCheck),
    )  # fmt: skip
    @given(st.booleans().flatmap(lambda strict: st.tuples(_hyp_object(2, strict), st.just(strict))))
    def collect(pair):
        drawn.append(pair)

    collect()
    return drawn[:count]


def byte_budget(schema: dict) -> int:
    """The most bytes a value valid against one of these schemas takes, as the gateway writes it (no free
    whitespace, ", " and ": " separators, a string character at most a 12-byte escaped surrogate pair)."""
    if "anyOf" in schema:
        return max(byte_budget(option) for option in schema["anyOf"])
    if "enum" in schema:
        return max(len(json.dumps(word)) for word in schema["enum"])
    kind = schema.get("type")
    if kind == "string":
        return 2 + 12 * schema["maxLength"]
    if kind == "integer":
        return 20  # int64, with its sign
    if kind == "number":
        return 37  # sign, 18 digits before the point (1e17), the point and 17 after it
    if kind in ("boolean", "null"):
        return 5
    if kind == "array":
        return 2 + schema["maxItems"] * (byte_budget(schema["items"]) + 2)
    if "patternProperties" in schema:
        (value,) = schema["patternProperties"].values()
        return 2 + schema["maxProperties"] * (2 + 3 + 4 + byte_budget(value))
    return 2 + sum(len(json.dumps(name)) + 4 + byte_budget(value) for name, value in schema["properties"].items())

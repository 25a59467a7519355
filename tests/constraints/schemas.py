"""Varied JSON Schemas for the structured-generation tests, drawn from a seeded generator.

Every string, array and object is bounded (maxLength, maxItems, additionalProperties false), so
that a random model sampling at a high temperature still finishes most documents.
"""

from __future__ import annotations

import json

# The seeded generator is the benches' too (bench/json_finish.py): the same schemas for the same seeds.
from bench.builders.json_schemas import WORDS, random_schema

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

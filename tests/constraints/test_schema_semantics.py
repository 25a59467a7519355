"""What a JSON Schema means here (issue 33): unlisted keys are not generated unless the schema opts in,
`strict` is OpenAI's strict mode, integers fit int64, numbers end, and the keys of one object are unique.
Through the text fixture's real stack, sampled hot."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import jsonschema
import pytest

from muestra.client import Client, InvalidArgumentError
from tests.constraints.schemas import byte_budget, hypothesis_schemas

HOT = [{"name": "temperature", "params": {"temperature": 1.5}}]
WARM = [{"name": "temperature", "params": {"temperature": 1.0}}]
CONTEXT = 500  # the text fixture's context is 512 tokens, with the prompt


@pytest.fixture(scope="module")
def client(text_fixture_stack):
    with Client(text_fixture_stack.address, timeout=300) as c:
        yield c


def sample(client, constraints, max_tokens, samplers=HOT):
    """(text, completion) for each constraint, one sampled completion each, eight requests at a time."""

    def one(item):
        seed, constraint = item
        generation = client.generate(
            "JSON:", max_tokens=max_tokens(constraint) if callable(max_tokens) else max_tokens,
            samplers=samplers, seed=seed, constraint=constraint,
        ).wait()  # fmt: skip
        return generation.texts.get(0, ""), generation.completions[0]

    with ThreadPoolExecutor(8) as pool:
        return list(pool.map(one, enumerate(constraints)))


def unique_keys(pairs):
    keys = [key for key, _ in pairs]
    assert len(keys) == len(set(keys)), f"a key repeats: {keys}"
    return dict(pairs)


def schema_constraint(schema, strict=False):
    return {"name": "json_schema", "params": {"schema": json.dumps(schema), "strict": strict}}


def test_unlisted_keys_are_not_generated_by_default(client):
    schema = {"type": "object", "properties": {"a": {"type": "boolean"}, "b": {"type": "null"}}}
    results = sample(client, [schema_constraint(schema)] * 16, max_tokens=40)
    for text, done in results:
        assert done.finish_reason == "stop", (text, done.finish_reason, done.error)
        assert set(json.loads(text)) <= {"a", "b"}, text


def test_a_strict_schema_that_openai_would_refuse_is_invalid_argument_naming_the_schema(client):
    open_schema = {"type": "object", "properties": {"a": {"type": "boolean"}}, "required": ["a"]}
    with pytest.raises(InvalidArgumentError) as info:
        client.generate("JSON:", max_tokens=8, constraint=schema_constraint(open_schema, strict=True)).wait()
    assert "constraint.params.schema: with strict, # must set additionalProperties to false" in str(info.value)
    optional = {**open_schema, "required": [], "additionalProperties": False}
    with pytest.raises(InvalidArgumentError) as info:
        client.generate("JSON:", max_tokens=8, constraint=schema_constraint(optional, strict=True)).wait()
    assert "every property of # must be required; not required: a" in str(info.value)


def test_integers_fit_int64_and_numbers_end_without_bounds(client):
    schema = {
        "type": "object",
        "properties": {"i": {"type": "integer"}, "j": {"type": "integer", "minimum": 0}, "x": {"type": "number"}},
        "required": ["i", "j", "x"],
        "additionalProperties": False,
    }
    results = sample(client, [schema_constraint(schema)] * 16, max_tokens=byte_budget(schema))
    for text, done in results:
        assert done.finish_reason == "stop", (text, done.finish_reason, done.error)
        value = json.loads(text)
        assert all(-(2**63) <= value[key] < 2**63 for key in ("i", "j")), text
        number = text.rsplit('"x": ', 1)[1].removesuffix("}")  # the number as written
        whole, _, fraction = number.lstrip("-").partition(".")
        assert "e" not in number.lower() and abs(value["x"]) <= 1e17 and len(fraction) <= 17, number
        assert not fraction or len((whole + fraction).lstrip("0")) <= 17, number


def test_pattern_properties_with_min_properties_never_repeat_a_key(client):
    schema = {
        "type": "object",
        "patternProperties": {"^[a-z]{1,2}$": {"type": "integer", "minimum": 0, "maximum": 9}},
        "minProperties": 4,
        "maxProperties": 4,
    }
    results = sample(client, [schema_constraint(schema)] * 16, max_tokens=byte_budget(schema))
    for text, done in results:
        assert done.finish_reason == "stop", (text, done.finish_reason, done.error)
        jsonschema.validate(json.loads(text, object_pairs_hook=unique_keys), schema)


def test_hypothesis_schemas_finish_and_validate(client):
    """Issue 33's 200 drawn schemas at temperature 1.0 with max_tokens their byte budget: every completion
    that stops validates, with unique keys, and at least 95% stop."""
    drawn = hypothesis_schemas(200)
    constraints = [schema_constraint(schema, strict) for schema, strict in drawn]
    budgets = {id(c): min(byte_budget(schema), CONTEXT) for c, (schema, _) in zip(constraints, drawn, strict=True)}
    results = sample(client, constraints, max_tokens=lambda c: budgets[id(c)], samplers=WARM)
    stopped = 0
    for (schema, _), (text, done) in zip(drawn, results, strict=True):
        if done.finish_reason != "stop":
            continue
        stopped += 1
        value = json.loads(text, object_pairs_hook=unique_keys)
        jsonschema.Draft202012Validator(schema).validate(value)
    print(f"{len(drawn)} schemas, {stopped} stopped and validated")
    assert stopped >= 0.95 * len(drawn), [
        (t, d.finish_reason, d.error) for t, d in results if d.finish_reason != "stop"
    ]

"""Structured outputs over the OpenAI HTTP API: response_format (json_object, json_schema) and vLLM's guided_* and
structured_outputs fields, with the official `openai` client against the text fixture's real stack.

Sampled completions are checked one by one: every choice that ends with `stop` is valid (json.loads and
jsonschema, re.fullmatch, one of the choices, the grammar's language); one cut by max_tokens is left alone.
"""

from __future__ import annotations

import json
import re

import jsonschema
import openai
import pydantic
import pytest

MESSAGES = [{"role": "user", "content": "Describe a person as JSON."}]
PROMPT = "A person, as JSON:"
SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "tags": {"type": "array", "items": {"enum": ["red", "green", "blue"]}, "maxItems": 3},
        "pet": {"anyOf": [{"type": "null"}, {"$ref": "#/$defs/pet"}]},
    },
    "required": ["name", "age", "tags", "pet"],
    "additionalProperties": False,
    "$defs": {
        "pet": {
            "type": "object",
            "properties": {"kind": {"enum": ["cat", "dog"]}},
            "required": ["kind"],
            "additionalProperties": False,  # strict (OpenAI's rules) needs every object closed
        }
    },
}
REGEX = r"[0-9]{3}-[a-z]{2,5}( [A-Z])?"
CHOICES = ["sí", "no", 'a "quoted" one', "línea\nnueva"]
ARITHMETIC = r"""
start: expr
expr: term (("+" | "-") term)*
term: factor (("*" | "/") factor)*
factor: NUMBER | "(" expr ")"
NUMBER: /[0-9]{1,3}/
"""
ARITHMETIC_GBNF = r"""
root ::= expr
expr ::= term (("+" | "-") term)*
term ::= factor (("*" | "/") factor)*
factor ::= num | "(" expr ")"
num ::= [0-9] [0-9]? [0-9]?
"""
ARITHMETIC_TEXT = re.compile(r"[0-9()+\-*/]+")
N = 4


class Person(pydantic.BaseModel):
    name: str = pydantic.Field(max_length=12)
    age: int = pydantic.Field(ge=0, le=120)
    colours: list[str] = pydantic.Field(max_length=3)


@pytest.fixture(scope="module")
def stack(text_fixture_tools_stack):
    return text_fixture_tools_stack


@pytest.fixture(scope="module")
def client(stack):
    with stack.client() as c:
        yield c


def texts(client, stack, endpoint: str, stream: bool, **kwargs) -> list[tuple[str, str]]:
    """(text, finish_reason) of each of N sampled choices, from chat or completions, streamed or not."""
    common = {"model": stack.model, "n": N, "seed": 5, "temperature": 1.0, "max_tokens": 120, **kwargs}
    if endpoint == "chat":
        if not stream:
            reply = client.chat.completions.create(messages=MESSAGES, **common)
            return [(c.message.content, c.finish_reason) for c in sorted(reply.choices, key=lambda c: c.index)]
        parts, reasons = [""] * N, [None] * N
        for chunk in client.chat.completions.create(messages=MESSAGES, stream=True, **common):
            for c in chunk.choices:
                parts[c.index] += c.delta.content or ""
                reasons[c.index] = c.finish_reason or reasons[c.index]
        return list(zip(parts, reasons, strict=True))
    if not stream:
        reply = client.completions.create(prompt=PROMPT, **common)
        return [(c.text, c.finish_reason) for c in sorted(reply.choices, key=lambda c: c.index)]
    parts, reasons = [""] * N, [None] * N
    for chunk in client.completions.create(prompt=PROMPT, stream=True, **common):
        for c in chunk.choices:
            parts[c.index] += c.text
            reasons[c.index] = c.finish_reason or reasons[c.index]
    return list(zip(parts, reasons, strict=True))


def finished(results: list[tuple[str, str]]) -> list[str]:
    """The texts that ended with `stop`; at least one must have."""
    assert all(reason in ("stop", "length") for _, reason in results), results
    done = [text for text, reason in results if reason == "stop"]
    assert done, f"no choice finished within max_tokens: {results}"
    return done


ENDPOINTS = [("chat", False), ("chat", True), ("completions", False), ("completions", True)]


@pytest.mark.parametrize(("endpoint", "stream"), ENDPOINTS)
def test_json_object_gives_a_json_object(client, stack, endpoint, stream):
    for text in finished(
        texts(client, stack, endpoint, stream, extra_body={"response_format": {"type": "json_object"}})
    ):
        assert isinstance(json.loads(text), dict), text


@pytest.mark.parametrize(("endpoint", "stream"), ENDPOINTS)
def test_json_schema_gives_valid_json(client, stack, endpoint, stream):
    response_format = {"type": "json_schema", "json_schema": {"name": "person", "schema": SCHEMA, "strict": True}}
    for text in finished(texts(client, stack, endpoint, stream, extra_body={"response_format": response_format})):
        jsonschema.validate(json.loads(text), SCHEMA)


def test_streamed_constrained_text_equals_the_whole(client, stack):
    extra = {"response_format": {"type": "json_schema", "json_schema": {"name": "p", "schema": SCHEMA}}}
    assert texts(client, stack, "chat", True, extra_body=extra) == texts(client, stack, "chat", False, extra_body=extra)


def test_parse_with_a_pydantic_model(client, stack):
    completion = client.chat.completions.parse(
        model=stack.model, messages=MESSAGES, response_format=Person, temperature=0, max_tokens=120
    )
    choice = completion.choices[0]
    assert choice.finish_reason == "stop"
    assert isinstance(choice.message.parsed, Person)
    assert choice.message.parsed == Person.model_validate_json(choice.message.content)


@pytest.mark.parametrize(
    "extra",
    [{"guided_json": SCHEMA}, {"guided_json": json.dumps(SCHEMA)}, {"structured_outputs": {"json": SCHEMA}}],
    ids=["guided_json", "guided_json text", "structured_outputs.json"],
)
def test_vllm_json_fields(client, stack, extra):
    for text in finished(texts(client, stack, "completions", False, extra_body=extra)):
        jsonschema.validate(json.loads(text), SCHEMA)


@pytest.mark.parametrize("field", ["guided_regex", "structured_outputs"])
@pytest.mark.parametrize(("endpoint", "stream"), [("chat", True), ("completions", False)])
def test_vllm_regex(client, stack, field, endpoint, stream):
    extra = {"guided_regex": REGEX} if field == "guided_regex" else {"structured_outputs": {"regex": REGEX}}
    for text in finished(texts(client, stack, endpoint, stream, extra_body=extra)):
        assert re.fullmatch(REGEX, text), text


@pytest.mark.parametrize("field", ["guided_choice", "structured_outputs"])
@pytest.mark.parametrize(("endpoint", "stream"), [("chat", False), ("completions", True)])
def test_vllm_choice(client, stack, field, endpoint, stream):
    extra = {"guided_choice": CHOICES} if field == "guided_choice" else {"structured_outputs": {"choice": CHOICES}}
    results = texts(client, stack, endpoint, stream, extra_body=extra)
    assert all(reason == "stop" for _, reason in results)
    assert all(text in CHOICES for text, _ in results), results


@pytest.mark.parametrize("field", ["guided_grammar", "structured_outputs"])
@pytest.mark.parametrize("grammar", [ARITHMETIC, ARITHMETIC_GBNF], ids=["lark", "gbnf"])
def test_vllm_grammar(client, stack, field, grammar):
    extra = {"guided_grammar": grammar} if field == "guided_grammar" else {"structured_outputs": {"grammar": grammar}}
    for text in finished(texts(client, stack, "chat", False, extra_body=extra, max_tokens=40)):
        assert ARITHMETIC_TEXT.fullmatch(text), text
        assert text.count("(") == text.count(")"), text


BAD = [
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}, "response_format.json_schema.schema"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nope"}}}},
     "response_format.json_schema.schema"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"$ref": "#/missing"}}}},
     "response_format.json_schema.schema"),
    ({"response_format": {"type": "grammar"}}, "response_format.type"),
    ({"guided_json": "{not json"}, "guided_json"),
    ({"guided_regex": "(unclosed"}, "guided_regex"),
    ({"guided_grammar": "start: undefined_rule"}, "guided_grammar"),
    ({"guided_grammar": "root ::= ("}, "guided_grammar"),
    ({"structured_outputs": {"grammar": "neither lark nor gbnf"}}, "structured_outputs.grammar"),
    ({"guided_choice": []}, "guided_choice"),
    ({"guided_choice": ["a", ""]}, "guided_choice[1]"),
    ({"guided_regex": "a", "guided_choice": ["a"]}, "guided_choice"),
    ({"response_format": {"type": "json_object"}, "structured_outputs": {"regex": "a"}}, "structured_outputs.regex"),
    ({"structured_outputs": {"json": SCHEMA, "regex": "a"}}, "structured_outputs.regex"),
    ({"structured_outputs": {"structural_tag": {}}}, "structured_outputs.structural_tag"),
]  # fmt: skip


@pytest.mark.parametrize(("extra", "param"), BAD)
@pytest.mark.parametrize("endpoint", ["chat", "completions"])
def test_bad_constraints_are_400_naming_the_field(client, stack, extra, param, endpoint):
    with pytest.raises(openai.BadRequestError) as error:
        if endpoint == "chat":
            client.chat.completions.create(model=stack.model, messages=MESSAGES, max_tokens=4, extra_body=extra)
        else:
            client.completions.create(model=stack.model, prompt=PROMPT, max_tokens=4, extra_body=extra)
    assert error.value.status_code == 400
    assert error.value.param == param, error.value.message
    assert error.value.body["message"].startswith(param), error.value.message


def test_several_constraints_are_named_together(client, stack):
    with pytest.raises(openai.BadRequestError) as error:
        client.completions.create(
            model=stack.model, prompt=PROMPT, extra_body={"guided_json": SCHEMA, "guided_regex": "a"}
        )
    assert "guided_json" in error.value.message and "guided_regex" in error.value.message


def test_bad_input_leaves_a_running_constrained_stream_untouched(client, stack):
    extra = {"response_format": {"type": "json_schema", "json_schema": {"name": "p", "schema": SCHEMA}}}
    kwargs = {"model": stack.model, "messages": MESSAGES, "seed": 5, "temperature": 1.0, "max_tokens": 120}
    alone = client.chat.completions.create(extra_body=extra, **kwargs).choices[0].message.content
    stream = iter(client.chat.completions.create(stream=True, extra_body=extra, **kwargs))
    text = next(stream).choices[0].delta.content or ""
    for bad, _ in BAD:
        with pytest.raises(openai.BadRequestError):
            client.chat.completions.create(model=stack.model, messages=MESSAGES, max_tokens=4, extra_body=bad)
    text += "".join(chunk.choices[0].delta.content or "" for chunk in stream)
    assert text == alone

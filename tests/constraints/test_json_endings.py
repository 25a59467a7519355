"""A JSON answer about to run out of tokens is steered to end valid (constraints/engine.py, closing_masks): in
process with llguidance and the tiny fixture's tokenizer, and through the real stack, where short json_object
answers at a high temperature now all finish instead of being cut mid-value."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import llguidance
import numpy as np
import pytest

from muestra.client import Client
from muestra.gateway.engine.constraints.engine import CompiledConstraint, fill_masks, grammar_text, token_bytes
from muestra.gateway.engine.constraints.json_text import JsonTokens
from muestra.plugin import Grammar

TOKENIZER = Path(__file__).resolve().parents[2] / "models" / "tiny-text-fixture" / "tokenizer.json"
HOT = [{"name": "temperature", "params": {"temperature": 1.5}}, {"name": "top_p", "params": {"top_p": 1.0}}]


@pytest.fixture(scope="module")
def compiled():
    tokenizer = llguidance.LLTokenizer(TOKENIZER.read_text())
    vocab = tokenizer.vocab_size
    tokens = JsonTokens(token_bytes(tokenizer, vocab))

    def compile(schema: dict) -> tuple[CompiledConstraint, list[bytes]]:
        matcher = llguidance.LLMatcher(tokenizer, grammar_text(Grammar.json_schema(schema)))
        return CompiledConstraint("json_schema", matcher, vocab, tokens), tokens.token_bytes

    return compile, tokenizer


def allowed_after(compiled, schema: dict, text: str, tokens_left: int | None) -> list[bytes]:
    compile, tokenizer = compiled
    constraint, spelled = compile(schema)
    row = constraint.new_row()
    for token in tokenizer.tokenize_str(text):
        fill_masks([row])
        assert row.consume(token), row.error
    fill_masks([row], None if tokens_left is None else [tokens_left], None if tokens_left is None else [200])
    bits = np.unpackbits(row.mask.view(np.uint8), bitorder="little")[: len(spelled)]
    return [spelled[i] for i in np.flatnonzero(bits)]


def test_far_from_the_end_the_mask_is_the_grammars(compiled):
    free = allowed_after(compiled, {"type": "object"}, '{"a": [1, 2', None)
    assert allowed_after(compiled, {"type": "object"}, '{"a": [1, 2', 150) == free
    assert any(data[:1].isdigit() for data in free)


def test_near_the_end_an_array_may_only_close(compiled):
    allowed = allowed_after(compiled, {"type": "object"}, '{"a": [1, 2, 3', 10)
    assert allowed and all(set(data) <= set(b"]}") for data in allowed), allowed


def test_near_the_end_a_string_may_only_close(compiled):
    allowed = allowed_after(compiled, {"type": "object"}, '{"a": "hello wor', 10)
    assert allowed and all(data[:1] == b'"' and set(data[1:]) <= set(b"]}") for data in allowed), allowed


def test_a_required_key_still_comes_before_the_object_closes(compiled):
    schema = {
        "type": "object", "properties": {"a": {"type": "array"}, "b": {"type": "integer"}},
        "required": ["a", "b"], "additionalProperties": False,
    }  # fmt: skip
    allowed = allowed_after(compiled, schema, '{"a": [1]', 10)
    assert allowed and b"}" not in allowed and all(b"}" not in data for data in allowed), allowed


def test_short_json_object_answers_finish_valid_through_the_stack(text_stack):
    """24 tokens at temperature 1.5: the tiny model's objects used to be cut mid-value at max_tokens."""
    with Client(text_stack("llama").gateway.address, timeout=300) as client:

        def one(seed: int):
            generation = client.generate(
                "Answer in JSON:", max_tokens=24, samplers=HOT, seed=seed, constraint={"name": "json_object"}
            ).wait()
            return generation.texts.get(0, ""), generation.completions[0]

        with ThreadPoolExecutor(8) as pool:
            results = list(pool.map(one, range(16)))
    for text, done in results:
        assert done.finish_reason == "stop", (done.finish_reason, text)
        assert isinstance(json.loads(text), dict)
        assert done.completion_tokens <= 24

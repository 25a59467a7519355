"""Constrained generation through the real stack: every finished text belongs to its language."""

from __future__ import annotations

import ast
import json
import re
import sqlite3
from concurrent.futures import ThreadPoolExecutor

import jsonschema
import pytest

from muestra.client import Client
from tests.constraints.schemas import ARITHMETIC, REGEXES, SCHEMAS, SQL

HOT = [{"name": "temperature", "params": {"temperature": 1.5}}, {"name": "top_p", "params": {"top_p": 1.0}}]
PROMPT = "Answer in JSON:"


@pytest.fixture(scope="module", params=["tiny-llama", "default-model"])
def client(request, text_stack):
    address = (
        text_stack("llama").gateway.address
        if request.param == "tiny-llama"
        else request.getfixturevalue("text_fixture_stack").address
    )
    with Client(address, timeout=300) as c:
        yield c


def generate_all(client, constraints, max_tokens=256, samplers=HOT, prompt=PROMPT):
    """One sampled completion per constraint, eight requests at a time (they share the lm's batch)."""

    def one(item):
        seed, constraint = item
        generation = client.generate(prompt, max_tokens=max_tokens, samplers=samplers, seed=seed, constraint=constraint)
        generation = generation.wait()
        return generation.texts.get(0, ""), generation.completions[0]

    with ThreadPoolExecutor(8) as pool:
        return list(pool.map(one, enumerate(constraints)))


def finished(results):
    return [(text, done) for text, done in results if done.finish_reason == "stop"]


def test_every_finished_completion_validates_against_its_json_schema(client):
    constraints = [{"name": "json_schema", "params": {"schema": schema}} for schema in SCHEMAS]
    results = generate_all(client, constraints)
    assert all(done.error == "" for _, done in results), [done.error for _, done in results if done.error]
    done_ones = 0
    for schema, (text, done) in zip(SCHEMAS, results, strict=True):
        if done.finish_reason != "stop":
            assert done.finish_reason == "length"
            continue
        done_ones += 1
        value = json.loads(text)
        jsonschema.Draft202012Validator(schema, format_checker=jsonschema.FormatChecker()).validate(value)
    assert done_ones >= 0.6 * len(SCHEMAS), f"only {done_ones} of {len(SCHEMAS)} finished"


def test_any_json_object(client):
    results = generate_all(client, [{"name": "json_object"}] * 8, max_tokens=400)
    texts = [text for text, _ in finished(results)]
    assert texts, "no completion finished"
    assert all(isinstance(json.loads(text), dict) for text in texts)


def test_every_finished_completion_matches_its_regex(client):
    constraints = [{"name": "regex", "params": {"pattern": pattern}} for pattern in REGEXES for _ in range(3)]
    results = generate_all(client, constraints, max_tokens=64)
    patterns = [pattern for pattern in REGEXES for _ in range(3)]
    matched = 0
    for pattern, (text, done) in zip(patterns, results, strict=True):
        if done.finish_reason == "stop":
            assert re.fullmatch(pattern, text), (pattern, text)
            matched += 1
    assert matched >= len(results) // 2


def _arithmetic_only(tree: ast.AST) -> bool:
    allowed = (ast.Expression, ast.BinOp, ast.UnaryOp, ast.Constant, ast.Add, ast.Sub, ast.Mult, ast.Div, ast.USub)
    return all(isinstance(node, allowed) for node in ast.walk(tree))


def test_grammar_completions_parse_with_independent_parsers(client):
    results = generate_all(client, [{"name": "grammar", "params": {"lark": ARITHMETIC}}] * 12, max_tokens=64)
    expressions = [text for text, _ in finished(results)]
    assert expressions
    for text in expressions:
        assert _arithmetic_only(ast.parse(text, mode="eval")), text

    results = generate_all(client, [{"name": "grammar", "params": {"lark": SQL}}] * 12, max_tokens=96)
    queries = [text for text, _ in finished(results)]
    assert queries
    db = sqlite3.connect(":memory:")
    db.execute("CREATE TABLE people (id INTEGER, name TEXT, age INTEGER)")
    db.execute("CREATE TABLE pets (id INTEGER, name TEXT, age INTEGER)")
    for query in queries:
        db.execute("EXPLAIN " + query)  # sqlite parses and plans it, or raises

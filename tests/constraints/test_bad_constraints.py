"""A bad constraint is INVALID_ARGUMENT naming the field and the limit before anything reaches the lm; a
grammar that reaches a dead end ends its own row; the streams of other requests go on unchanged."""

from __future__ import annotations

import json
import shutil
import threading

import pytest
from tokenizers import Tokenizer, decoders, models

from muestra.client import Client, InvalidArgumentError
from tests.fixtures.text_stack import start_gateway
from tests.harness import ServiceProcess

SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}}
BAD = [
    ({"name": "nope"}, "constraint.name", "unknown constraint kind 'nope'; registered: "),
    ({"name": "json_schema"}, "constraint.params.schema", "is required"),
    ({"name": "json_schema", "params": {"schema": "{not json"}}, "constraint.params.schema", "is not valid JSON"),
    (
        {"name": "json_schema", "params": {"schema": {"type": "nonsense"}}},
        "constraint.params.schema",
        "does not compile",
    ),
    ({"name": "json_schema", "params": {"schema": SCHEMA, "extra": 1}}, "constraint.params.extra", "unknown parameter"),
    ({"name": "regex", "params": {"pattern": "(("}}, "constraint.params.pattern", "the regex does not compile"),
    ({"name": "regex", "params": {"pattern": 7}}, "constraint.params.pattern", "must be a string"),
    ({"name": "grammar", "params": {"lark": "start: ( oops"}}, "constraint.params.lark", "does not compile"),
    ({"name": "regex", "params": {"pattern": "a" * 300_000}}, "constraint.params.pattern", "the limit is 262144"),
]


@pytest.fixture(scope="module")
def stack(text_stack):
    return text_stack("llama")


def long_stream(client, results: list) -> threading.Thread:
    def run():
        results.append(
            client.generate("Once upon a time", max_tokens=200, ignore_eos=True, samplers=[{"name": "greedy"}]).wait()
        )

    thread = threading.Thread(target=run)
    thread.start()
    return thread


@pytest.mark.parametrize(("constraint", "field", "message"), BAD, ids=[f"{b[1]}:{b[2][:20]}" for b in BAD])
def test_a_bad_constraint_names_the_field_while_another_stream_goes_on(stack, constraint, field, message):
    with Client(stack.gateway.address, timeout=120) as client:
        alone = client.generate(
            "Once upon a time", max_tokens=200, ignore_eos=True, samplers=[{"name": "greedy"}]
        ).wait()
        rows_before = stack.lm_rows()
        results: list = []
        thread = long_stream(client, results)
        with pytest.raises(InvalidArgumentError) as info:
            client.generate("x", max_tokens=8, constraint=constraint).wait()
        assert str(info.value).startswith(f"INVALID_ARGUMENT: {field}: ") and message in str(info.value)
        thread.join()
        assert results[0].token_ids == alone.token_ids and results[0].completions[0].finish_reason == "length"
        assert stack.lm_rows() == rows_before == 0


@pytest.mark.parametrize(
    ("request_args", "message"),
    [
        ({"samplers": [{"name": "beam_search", "params": {"num_beams": 2}}]}, "cannot be combined with beam_search"),
        ({"ignore_eos": True}, "cannot be combined with ignore_eos"),
    ],
)
def test_constraints_refuse_what_they_cannot_combine_with(stack, request_args, message):
    with Client(stack.gateway.address, timeout=60) as client, pytest.raises(InvalidArgumentError) as info:
        client.generate("x", max_tokens=8, constraint={"name": "json_object"}, **request_args).wait()
    assert "constraint: " in str(info.value) and message in str(info.value)


def test_a_constraint_slower_to_compile_than_the_limit_is_refused(text_stack):
    stack = text_stack("llama", "--constraint-compile-timeout-s", "0.000001")
    # About 25 ms to compile here: far past the limit, however late the gateway's loop looks at the clock.
    properties = {f"field_{i}": {"type": "string", "pattern": f"^[a-z]{{1,{i % 7 + 9}}}-{i}$"} for i in range(400)}
    schema = {"type": "object", "properties": properties}
    with Client(stack.gateway.address, timeout=60) as client, pytest.raises(InvalidArgumentError) as info:
        client.generate("x", max_tokens=8, constraint={"name": "json_schema", "params": {"schema": schema}}).wait()
    assert "constraint.params.schema: did not compile within 1e-06 s" in str(info.value)


@pytest.fixture(scope="module")
def letters_stack(tiny_lm, tmp_path_factory):
    """The tiny Llama behind a tokenizer of single letters and digits, with no byte fallback: text it has no
    token for cannot be written, which is how a grammar reaches a dead end."""
    folder = tmp_path_factory.mktemp("letters") / "model"
    shutil.copytree(tiny_lm("llama").onnx_dir, folder)
    vocab = {"<eos>": 0, "<unk>": 1, **{c: i + 2 for i, c in enumerate("abcdefghijklmnopqrstuvwxyz0123456789 .,")}}
    vocab.update({f"<x{i}>": i for i in range(len(vocab), 1024)})
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    tokenizer.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()])
    tokenizer.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<eos>", "unk_token": "<unk>"}))
    log_dir = tmp_path_factory.mktemp("letters-logs")
    tokenizer_service = ServiceProcess("tokenizer", ["--models", str(folder)], log_dir)
    lm = ServiceProcess("lm", ["--model", str(folder), "--providers", "cpu"], log_dir)
    gateway = start_gateway(log_dir, tokenizer_service.address, lm.address)
    yield gateway
    for process in (gateway, lm, tokenizer_service):
        process.stop()


def test_a_dead_end_ends_its_row_with_an_error_and_no_other(letters_stack):
    with Client(letters_stack.address, timeout=60) as client:
        alone = client.generate("abc", max_tokens=40, samplers=[{"name": "greedy"}]).wait()
        dead = client.generate("abc", max_tokens=20, n=2, samplers=[{"name": "greedy"}],
                               constraint={"name": "regex", "params": {"pattern": "ab€"}})  # fmt: skip
        neighbour = client.generate("abc", max_tokens=40, samplers=[{"name": "greedy"}])
        dead, neighbour = dead.wait(), neighbour.wait()
    for index in (0, 1):
        done = dead.completions[index]
        assert done.finish_reason == "error" and done.error.startswith("the constraint"), done
        assert dead.texts[index] == "ab"
    assert neighbour.token_ids == alone.token_ids and neighbour.completions[0].error == ""

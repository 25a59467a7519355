"""Greedy decoding under a constraint equals transformers' generate with the same engine's mask, and
constrained rows leave their unconstrained neighbours' tokens unchanged."""

from __future__ import annotations

import json
import threading

import llguidance
import numpy as np
import pytest
import torch
from transformers import LogitsProcessor, LogitsProcessorList

from muestra.client import Client
from tests.constraints.schemas import SCHEMAS
from tests.fixtures.prefix_cache import start_cache_stack

PROMPTS = ["The quick brown fox", "Once upon a time", "def add(a, b):"]
SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 8},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "maxItems": 3},
    },
    "required": ["name", "age"],
    "additionalProperties": False,
}
CONSTRAINTS = [
    {"name": "json_schema", "params": {"schema": SCHEMA}},
    {"name": "regex", "params": {"pattern": r"[a-z]{2,5}( [a-z]{2,5}){1,3}\."}},
    {"name": "grammar", "params": {"lark": 'start: "(" NUM (" + " NUM)* ")"\nNUM: /[1-9][0-9]{0,2}/'}},
]


class GuidanceMask(LogitsProcessor):
    """The allowed tokens from llguidance itself (not the gateway's code), applied as transformers does."""

    def __init__(self, tokenizer: llguidance.LLTokenizer, grammar: str, prompt_length: int) -> None:
        self.matcher = llguidance.LLMatcher(tokenizer, grammar, log_level=0)
        self.prompt_length = prompt_length
        self.vocab = tokenizer.vocab_size

    def __call__(self, input_ids, scores):
        generated = input_ids[0, self.prompt_length :].tolist()
        if generated:
            assert self.matcher.consume_token(generated[-1]), self.matcher.get_error()
        bits = np.unpackbits(np.frombuffer(self.matcher.compute_bitmask(), dtype=np.uint8), bitorder="little")
        allowed = torch.from_numpy(bits[: self.vocab].astype(bool))
        return scores.masked_fill(~allowed, -torch.inf)


def grammar_of(constraint) -> str:
    params = constraint["params"]
    if constraint["name"] == "json_schema":
        # The gateway's JSON options (no free whitespace), stated here independently.
        options = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
        return llguidance.LLMatcher.grammar_from_json_schema(params["schema"], defaults=options)
    if constraint["name"] == "regex":
        return llguidance.LLMatcher.grammar_from_regex(params["pattern"])
    return llguidance.LLMatcher.grammar_from_lark(params["lark"])


@pytest.fixture(scope="module")
def reference(tiny_lm):
    lm = tiny_lm("llama")
    model, hf_tokenizer = lm.torch_model(), lm.tokenizer()
    vocab = model.config.vocab_size
    tokenizer = llguidance.LLTokenizer(
        (lm.onnx_dir / "tokenizer.json").read_text(), n_vocab=vocab, eos_token=[model.generation_config.eos_token_id]
    )
    return model, hf_tokenizer, tokenizer


def hf_constrained_greedy(reference, prompt: str, constraint, max_new_tokens: int) -> list[int]:
    model, hf_tokenizer, tokenizer = reference
    ids = hf_tokenizer(prompt, return_tensors="pt").input_ids
    mask = GuidanceMask(tokenizer, grammar_of(constraint), ids.shape[1])
    with torch.no_grad():
        out = model.generate(
            ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=max_new_tokens,
            logits_processor=LogitsProcessorList([mask]), pad_token_id=1,
        )  # fmt: skip
    return out[0, ids.shape[1] :].tolist()


@pytest.mark.parametrize("mask_at", ["lm", "gateway"])
@pytest.mark.parametrize("constraint", CONSTRAINTS, ids=[c["name"] for c in CONSTRAINTS])
def test_constrained_greedy_equals_transformers_with_the_engines_mask(text_stack, reference, constraint, mask_at):
    # Without the JSON endings, which steer the last tokens before max_tokens (test_json_endings.py checks them).
    stack = text_stack("llama", "--constraint-mask", mask_at, "--json-endings", "false")
    eos = reference[0].generation_config.eos_token_id
    with Client(stack.gateway.address, timeout=120) as client:
        for prompt in PROMPTS:
            generation = client.generate(
                prompt, max_tokens=48, samplers=[{"name": "greedy"}], constraint=constraint
            ).wait()
            ours, done = generation.token_ids[0], generation.completions[0]
            expected = hf_constrained_greedy(reference, prompt, constraint, 48)
            if done.finish_reason == "stop" and done.stop_reason == "constraint":
                # The gateway ends the row when the grammar is complete; generate() needs one more step, for EOS.
                assert expected[: len(ours) + 1] == [*ours, eos]
            else:
                assert ours == expected[: len(ours)] and len(ours) == 48, done
            if constraint["name"] == "json_schema" and done.finish_reason == "stop":
                json.loads(generation.texts[0])


def test_unconstrained_rows_are_unchanged_by_constrained_neighbours(text_stack):
    stack = text_stack("llama")
    with Client(stack.gateway.address, timeout=120) as client:
        alone = [client.generate(p, max_tokens=32, samplers=[{"name": "greedy"}]).wait().token_ids[0] for p in PROMPTS]
        stop = threading.Event()

        def constrained_traffic():
            seed = 0
            while not stop.is_set():
                seed += 1
                schema = SCHEMAS[seed % len(SCHEMAS)]
                client.generate(
                    "JSON:", max_tokens=64, seed=seed, n=2,
                    samplers=[{"name": "temperature", "params": {"temperature": 1.5}}],
                    constraint={"name": "json_schema", "params": {"schema": schema}},
                ).wait()  # fmt: skip

        workers = [threading.Thread(target=constrained_traffic) for _ in range(3)]
        for worker in workers:
            worker.start()
        try:
            for _ in range(3):
                together = [
                    client.generate(p, max_tokens=32, samplers=[{"name": "greedy"}]).wait().token_ids[0]
                    for p in PROMPTS
                ]
                assert together == alone
        finally:
            stop.set()
            for worker in workers:
                worker.join()


@pytest.fixture(scope="module")
def cache_stack(tiny_lm, redis_server, prefix_log_dir, prefix_tokenizer):
    stack = start_cache_stack(
        tiny_lm("llama").onnx_dir, "llama", prefix_log_dir, prefix_tokenizer.address, redis_server.url
    )
    yield stack
    stack.stop()


def test_constraints_work_with_the_prefix_cache_stop_strings_and_logprobs(cache_stack):
    constraint = CONSTRAINTS[0]
    prompt = "A long preamble that fills more than one block of the prefix cache, " * 3 + "then JSON:"
    with Client(cache_stack.gateway.address, timeout=120) as client:
        first = client.generate(prompt, max_tokens=48, samplers=[{"name": "greedy"}], constraint=constraint).wait()
        again = client.generate(prompt, max_tokens=48, samplers=[{"name": "greedy"}], constraint=constraint).wait()
        assert again.completions[0].cached_tokens > 0 and again.token_ids == first.token_ids
        json.loads(again.texts[0])

        # A stop string cuts the constrained text where it matches.
        cut = client.generate(
            prompt, max_tokens=48, samplers=[{"name": "greedy"}], constraint=constraint, stop=['"age"']
        ).wait()
        assert cut.completions[0].stop_reason == '"age"' and first.texts[0].startswith(cut.texts[0])
        assert '"age"' in first.texts[0] and len(cut.texts[0]) < len(first.texts[0])

        # Logprobs come from the masked distribution: where the grammar allows one token, it is the only
        # alternative listed and its logprob is 0; a disallowed token is never listed.
        generation = client.generate(
            prompt, max_tokens=48, samplers=[{"name": "greedy"}], constraint=constraint, logprobs=True, top_logprobs=5
        )
        entries = [entry for delta in generation for entry in delta.logprobs]
        assert generation.token_ids == first.token_ids and len(entries) == len(first.token_ids[0])
        alone = [entry for entry in entries if len(entry["top"]) == 1]
        assert len(alone) >= first.completions[0].forced_tokens > 0
        assert all(entry["logprob"] == 0.0 and entry["top"][0]["logprob"] == 0.0 for entry in alone)

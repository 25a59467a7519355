"""Chains: validation, selection, seeded reproducibility, logprobs, argmax-invariance, default chains."""

from __future__ import annotations

import math

import grpc
import numpy as np
import pytest
import torch
from transformers import GenerationConfig
from transformers.generation import logits_process as hf

from muestra.gateway.engine.sampling import (
    ModelInfo,
    default_chain,
    default_specs,
    new_rows,
    sample_next_tokens,
    validate_chain,
)
from muestra.plugin import LogitsProcessor, RowContext, TokenSelector, softmax
from muestra.runtime.errors import FailedPrecondition, InvalidArgument
from muestra.v1 import gateway_pb2, lm_pb2

VOCAB = 200
MODEL = ModelInfo(vocab_size=VOCAB, eos_token_ids=(2,), context_length=512)


def step_logits(step: int, rows: int = 1) -> np.ndarray:
    """The same logits for every row at a given step, so rows differ only by their chains and seeds."""
    row = np.random.default_rng(1000 + step).normal(size=VOCAB).astype(np.float32) * 2
    return np.repeat(row[None, :], rows, axis=0)


def chain_of(registry, *specs):
    return validate_chain(registry, [{"name": n, "params": p} for n, p in specs], MODEL)


# -- validation -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "specs, field, words",
    [
        ([("top_p", {"top_p": 1.5})], "samplers[0].params.top_p", ["(0, 1]", "1.5", "'top_p'"]),
        ([("temperature", {"temperature": -1})], "samplers[0].params.temperature", ["-1", "'temperature'"]),
        ([("top_k", {}), ("min_p", {"min_p": math.nan})], "samplers[1].params.min_p", ["finite", "nan", "'min_p'"]),
        ([("top_k", {"top_k": 2.5})], "samplers[0].params.top_k", ["integer"]),
        ([("top_k", {"k": 5})], "samplers[0].params.k", ["unknown parameter", "top_k"]),
        ([("temperature", {"temperature": "hot"})], "samplers[0].params.temperature", ["number", "'hot'"]),
        ([("no_such_sampler", {})], "samplers[0].name", ["unknown sampler", "no_such_sampler", "greedy"]),
        ([("greedy", {}), ("top_k", {})], "samplers[1]", ["'greedy'", "last"]),
        ([("logit_bias", {"logit_bias": {"200": 1.0}})], "samplers[0].params.logit_bias", ["vocabulary size 200"]),
        ([("logit_bias", {"logit_bias": {"x": 1.0}})], "samplers[0].params.logit_bias", ["token ids"]),
        ([("logit_bias", {})], "samplers[0].params.logit_bias", ["required"]),
        ([("beam_search", {"early_stopping": "sometimes"})], "samplers[0].params.early_stopping", ["never"]),
        ([("beam_search", {"num_beams": 0})], "samplers[0].params.num_beams", ["[2, 32]"]),
    ],
)
def test_bad_sampler_params_are_invalid_argument_naming_sampler_and_field(sampler_registry, specs, field, words):
    with pytest.raises(InvalidArgument) as caught:
        chain_of(sampler_registry, *specs)
    assert caught.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert caught.value.field == field
    message = str(caught.value)
    assert message.startswith(field + ": ")
    for word in words:
        assert word in message


def test_top_p_error_reads_as_documented(sampler_registry):
    with pytest.raises(InvalidArgument) as caught:
        chain_of(sampler_registry, ("temperature", {}), ("top_p", {"top_p": 1.5}))
    assert str(caught.value) == "samplers[1].params.top_p: must be in (0, 1], got 1.5 (sampler 'top_p')"


def test_chain_from_protobuf_struct_params(sampler_registry):
    spec = gateway_pb2.SamplerSpec(name="top_k")
    spec.params.update({"top_k": 40})  # Struct numbers are doubles: 40.0 is accepted as an integer
    chain = validate_chain(sampler_registry, [spec, gateway_pb2.SamplerSpec(name="greedy")], MODEL)
    assert chain.describe() == [{"name": "top_k", "params": {"top_k": 40}}, {"name": "greedy", "params": {}}]
    assert isinstance(chain.processors[0].params["top_k"], int)


def test_chain_without_selector_ends_with_multinomial_sampling(sampler_registry):
    chain = chain_of(sampler_registry, ("temperature", {"temperature": 0.5}))
    assert [step["name"] for step in chain.describe()] == ["temperature", "sample"]
    assert chain_of(sampler_registry).describe() == [{"name": "sample", "params": {}}]


def test_too_long_chain_is_rejected(sampler_registry):
    with pytest.raises(InvalidArgument, match=r"samplers: at most 32"):
        chain_of(sampler_registry, *[("temperature", {})] * 33)


# -- selection and reproducibility ----------------------------------------------------------------------


def test_greedy_picks_the_argmax_of_the_processed_scores(sampler_registry):
    chain = chain_of(sampler_registry, ("logit_bias", {"logit_bias": {"7": 100}}), ("greedy", {}))
    rows = new_rows(chain, [1, 2, 3], seed=0)
    logits = step_logits(0)
    assert sample_next_tokens(rows, logits).token_ids.tolist() == [7]
    plain = new_rows(chain_of(sampler_registry, ("greedy", {})), [1], seed=0)
    assert sample_next_tokens(plain, logits).token_ids.tolist() == [int(np.argmax(logits[0]))]


def test_multinomial_sampling_follows_the_processed_distribution(sampler_registry):
    """Empirical frequencies over 20k draws match softmax(top_k(logits / t)); removed tokens never appear."""
    chain = chain_of(sampler_registry, ("temperature", {"temperature": 0.8}), ("top_k", {"top_k": 8}))
    rows = new_rows(chain, [1], seed=123, n=50)
    logits = step_logits(3, rows=50)
    counts = np.zeros(VOCAB)
    for _ in range(400):
        for token in sample_next_tokens(rows, logits).token_ids:
            counts[token] += 1
    reference = hf.TopKLogitsWarper(8)(None, hf.TemperatureLogitsWarper(0.8)(None, torch.from_numpy(logits[:1])))
    expected = torch.softmax(reference, dim=-1)[0].numpy()
    assert counts[expected == 0].sum() == 0
    np.testing.assert_allclose(counts / counts.sum(), expected, atol=0.012)


def generate(registry, specs, seed: int, steps: int = 12, others: list | None = None, position: int = 0):
    """Tokens of one request sampled for `steps` steps, optionally batched among other rows."""
    rows = new_rows(chain_of(registry, *specs), [5, 6, 7], seed=seed)
    batch = list(others or [])
    batch.insert(position, rows[0])
    for step in range(steps):
        sample_next_tokens(batch, step_logits(step, rows=len(batch)))
    return rows[0].context.output_ids.tolist()


def test_seeded_sampling_is_reproducible_and_independent_of_the_rest_of_the_batch(sampler_registry):
    specs = [("temperature", {"temperature": 1.3}), ("top_p", {"top_p": 0.95})]
    alone = generate(sampler_registry, specs, seed=42)
    assert generate(sampler_registry, specs, seed=42) == alone
    assert generate(sampler_registry, specs, seed=43) != alone
    # The same request batched with other requests: same chain with other seeds, other chains, greedy rows.
    others = new_rows(chain_of(sampler_registry, *specs), [1], seed=7, n=3)
    others += new_rows(chain_of(sampler_registry, ("top_k", {"top_k": 3})), [9, 9], seed=42)
    others += new_rows(chain_of(sampler_registry, ("greedy", {})), [4], seed=0)
    others += new_rows(chain_of(sampler_registry, ("temperature", {"temperature": 0.2})), [3], seed=42, logprobs=True)
    assert generate(sampler_registry, specs, seed=42, others=others, position=3) == alone


def test_n_completions_draw_independent_streams(sampler_registry):
    rows = new_rows(chain_of(sampler_registry, ("temperature", {"temperature": 2.0})), [1], seed=5, n=4)
    for step in range(10):
        sample_next_tokens(rows, step_logits(step, rows=4))
    outputs = [tuple(row.context.output_ids) for row in rows]
    assert len(set(outputs)) == 4
    again = new_rows(chain_of(sampler_registry, ("temperature", {"temperature": 2.0})), [1], seed=5, n=4)
    for step in range(10):
        sample_next_tokens(again[::-1], step_logits(step, rows=4))  # another order in the batch
    assert [tuple(row.context.output_ids) for row in again] == outputs


# -- logprobs and output kinds -------------------------------------------------------------------------------


def test_logprobs_come_from_the_final_processed_distribution(sampler_registry):
    chain = chain_of(sampler_registry, ("temperature", {"temperature": 0.5}), ("top_k", {"top_k": 3}))
    rows = new_rows(chain, [1], seed=9, n=2, logprobs=True, top_logprobs=5)
    logits = step_logits(1, rows=2)
    result = sample_next_tokens(rows, logits)
    processed = hf.TopKLogitsWarper(3)(None, hf.TemperatureLogitsWarper(0.5)(None, torch.from_numpy(logits)))
    expected = torch.log_softmax(processed, dim=-1).numpy()
    for i in range(2):
        token = result.token_ids[i]
        assert result.logprobs[i] == pytest.approx(expected[i, token], abs=1e-5)
        # Only the three tokens top_k kept have a finite logprob: five were asked for, three come back.
        assert result.top_ids[i].tolist() == np.argsort(-expected[i])[:3].tolist()
        np.testing.assert_allclose(result.top_logprobs[i], np.sort(expected[i])[::-1][:3], atol=1e-5)
    assert math.isnan(sample_next_tokens(new_rows(chain, [1], seed=1), logits[:1]).logprobs[0])


def test_greedy_rows_without_logprobs_need_only_the_argmax(sampler_registry):
    def kind(*specs, logprobs=False):
        return new_rows(chain_of(sampler_registry, *specs), [1], 0, logprobs=logprobs)[0].output_kind

    assert kind(("greedy", {})) == lm_pb2.ARGMAX
    assert kind(("temperature", {"temperature": 0.3}), ("top_k", {}), ("top_p", {"top_p": 0.5}), ("greedy", {})) == (
        lm_pb2.ARGMAX
    )
    assert kind(("greedy", {}), logprobs=True) == lm_pb2.LOGITS
    assert kind(("repetition_penalty", {"repetition_penalty": 1.2}), ("greedy", {})) == lm_pb2.LOGITS
    assert kind(("top_k", {})) == lm_pb2.LOGITS  # then multinomial sampling


def test_argmax_rows_and_logits_rows_share_a_step(sampler_registry):
    """Shaped like the lm service's BatchOutput: logits only for the LOGITS rows, argmax for all."""
    greedy = new_rows(chain_of(sampler_registry, ("greedy", {})), [1], 0)[0]
    sampled = new_rows(chain_of(sampler_registry, ("top_k", {"top_k": 1})), [1], 0)[0]
    logits = step_logits(2, rows=1)
    result = sample_next_tokens([greedy, sampled], logits, logits_row=[-1, 0], argmax=[17, 99])
    assert result.token_ids.tolist() == [17, int(np.argmax(logits[0]))]
    assert greedy.context.output_ids.tolist() == [17]


def test_a_failing_plugin_fails_only_its_own_rows(sampler_registry):
    class Broken(LogitsProcessor):
        name = "broken"
        description = "Raises."

        def process(self, logits, params, rows):
            raise ZeroDivisionError("boom")

    good = new_rows(chain_of(sampler_registry, ("greedy", {})), [1], 0)[0]
    chain = chain_of(sampler_registry, ("greedy", {}))
    bad_chain = type(chain)((type(chain.last)(Broken(), {}),), chain.last)
    bad = new_rows(bad_chain, [1], 0)[0]
    result = sample_next_tokens([bad, good], step_logits(0, rows=2))
    assert result.errors[0] and "boom" in result.errors[0]
    assert result.errors[1] is None and result.token_ids[1] == int(np.argmax(step_logits(0)[0]))


# -- argmax invariance -----------------------------------------------------------------------------


def random_params(name: str, rng: np.random.Generator, vocab: int) -> dict:
    """Random valid parameters for the built-ins; defaults for samplers from other plugins."""
    uniform = {
        "temperature": (0.01, 5.0),
        "min_p": (0.0, 1.0),
        "top_p": (0.01, 1.0),
        "typical_p": (0.01, 0.99),
        "repetition_penalty": (0.2, 5.0),
        "presence_penalty": (-2.0, 2.0),
        "frequency_penalty": (-2.0, 2.0),
    }
    if name in uniform:
        return {name: float(rng.uniform(*uniform[name]))}
    if name == "top_k":
        return {"top_k": int(rng.integers(1, vocab))}
    if name == "logit_bias":
        tokens = rng.choice(vocab, size=5, replace=False)
        return {"logit_bias": {str(t): float(rng.uniform(-100, 100)) for t in tokens}}
    return {}


def test_argmax_invariance_flags_hold_empirically(sampler_registry):
    """Flagged samplers never move the argmax over 300 random cases; for every other one a case exists."""
    vocab = 50
    rng = np.random.default_rng(0)
    for entry in sampler_registry.list():
        sampler = entry.sampler
        if not isinstance(sampler, LogitsProcessor | TokenSelector):
            continue  # a search strategy picks rows, not one token per row
        changed = False
        for trial in range(300):
            logits = (rng.normal(size=(1, vocab)) * rng.choice([0.1, 1.0, 4.0, 20.0])).astype(np.float32)
            logits[0, rng.integers(vocab)] += rng.choice([0.0, 5.0])
            top = int(np.argmax(logits))
            context = RowContext(rng.integers(0, vocab, size=4), np.random.default_rng(trial))
            for token in [top, *rng.integers(0, vocab, size=3)] if trial % 2 else rng.integers(0, vocab, size=3):
                context.append(int(token))
            params = [sampler.validate(random_params(sampler.name, rng, vocab), ModelInfo(vocab))]
            if isinstance(sampler, LogitsProcessor):
                chosen = int(np.argmax(sampler.process(logits.copy(), params, [context])))
            else:
                chosen = int(sampler.select(logits.copy(), params, [context])[0])
            changed = changed or chosen != top
            if sampler.argmax_invariant:
                assert chosen == top, f"{sampler.name} is flagged argmax-invariant but moved the argmax"
        if not sampler.argmax_invariant:
            assert changed, f"{sampler.name} is not flagged argmax-invariant, yet never moved the argmax"


# -- default chains from generation_config.json ------------------------------------------------------------------


HF_PROCESSOR_NAMES = {
    hf.SequenceBiasLogitsProcessor: "logit_bias",
    hf.RepetitionPenaltyLogitsProcessor: "repetition_penalty",
    hf.TemperatureLogitsWarper: "temperature",
    hf.TopKLogitsWarper: "top_k",
    hf.TopPLogitsWarper: "top_p",
    hf.MinPLogitsWarper: "min_p",
    hf.TypicalLogitsWarper: "typical_p",
}


@pytest.mark.parametrize(
    "config",
    [
        {},
        {"do_sample": True},
        {"do_sample": True, "temperature": 0.6, "top_p": 0.9},
        {"do_sample": True, "temperature": 0.7, "top_k": 0, "top_p": 0.8, "min_p": 0.05, "typical_p": 0.9},
        {"do_sample": False, "temperature": 0.6, "repetition_penalty": 1.1},
        {"do_sample": True, "top_k": 20, "repetition_penalty": 1.3, "sequence_bias": [[[5], -3.0]]},
        {"num_beams": 3, "length_penalty": 0.5, "early_stopping": "never", "repetition_penalty": 1.2},
    ],
)
def test_default_chain_matches_transformers_processor_list(sampler_registry, tiny_gpt2, config):
    """Same processors, same order, same values as generate() would build for this generation_config."""
    generation_config = GenerationConfig(**config)
    merged = tiny_gpt2._prepare_generation_config(generation_config)[0]
    merged._eos_token_tensor = torch.tensor([2])
    processors = tiny_gpt2._get_logits_processor(merged, input_ids_seq_length=3, encoder_input_ids=None)
    expected = [HF_PROCESSOR_NAMES[type(p)] for p in processors]
    chain = default_chain(sampler_registry, config, MODEL)
    names = [step["name"] for step in chain.describe()]
    assert names[:-1] == expected
    assert names[-1] == ("beam_search" if merged.num_beams > 1 else "sample" if merged.do_sample else "greedy")
    for step, processor in zip(chain.processors, processors, strict=True):
        value = next(iter(step.params.values()))
        attribute = {"temperature": "temperature", "top_k": "top_k", "top_p": "top_p", "min_p": "min_p"}.get(
            step.sampler.name
        )
        if attribute:
            assert value == pytest.approx(getattr(processor, attribute))


def test_unusable_generation_config_is_a_failed_precondition(sampler_registry):
    with pytest.raises(
        FailedPrecondition, match=r"generation_config.json: temperature must be in \[0.001, 100\], got 0"
    ):
        default_chain(sampler_registry, {"do_sample": True, "temperature": 0.0}, MODEL)
    assert default_specs({"do_sample": True, "top_k": 0, "top_p": 1.0}) == [{"name": "sample", "params": {}}]


def test_row_context_keeps_prompt_and_output(sampler_registry):
    context = RowContext([1, 2], np.random.default_rng(0))
    for token in range(40):
        context.append(token)
    assert context.all_ids().tolist() == [1, 2, *range(40)]
    fork = context.fork()
    fork.append(99)
    assert len(context.output_ids) == 40 and fork.output_ids[-1] == 99
    assert softmax(np.array([[0.0, -np.inf]], dtype=np.float32)).tolist() == [[1.0, 0.0]]


def test_rows_rerun_after_a_failure_in_their_group_draw_as_if_they_had_run_alone(sampler_registry):
    class RandomDrop(LogitsProcessor):  # draws from each row's generator, as XTC must
        name = "random_drop"
        description = "Removes one random token per row; raises for the whole batch if a row says fail."

        def process(self, logits, params, rows):
            for k, row in enumerate(rows):
                logits[k, row.rng.integers(logits.shape[-1])] = -np.inf
                row.state["drops"] = row.state.get("drops", 0) + 1
            if any(p["fail"] for p in params):
                raise ValueError("this batch holds a failing row")
            return logits

    sample = chain_of(sampler_registry, ("temperature", {"temperature": 1.0}))
    drop = RandomDrop()

    def chain(fail: bool):
        return type(sample)((type(sample.last)(drop, {"fail": fail}),), sample.last)

    def fresh(fail: bool, seed: int = 5):
        return new_rows(chain(fail), [1, 2], seed)[0]

    alone = fresh(False)
    expected = [int(sample_next_tokens([alone], step_logits(s)).token_ids[0]) for s in range(4)]
    good, bad = fresh(False), fresh(True, seed=6)
    assert good.chain.shape == bad.chain.shape  # one group: they are tried together first
    tokens = []
    for s in range(4):
        result = sample_next_tokens([good, bad], step_logits(s, rows=2))
        assert result.errors[1] and "failing row" in result.errors[1] and result.errors[0] is None
        tokens.append(int(result.token_ids[0]))
    assert tokens == expected
    assert good.context.rng.bit_generator.state == alone.context.rng.bit_generator.state
    assert good.context.state == alone.context.state == {"drops": 4}

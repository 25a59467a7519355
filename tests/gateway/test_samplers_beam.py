"""Beam search against transformers' generate(num_beams=..., do_sample=False).

Two kinds of model drive both sides: fixed synthetic log-prob tables (a transformers model
whose logits are a hash of the sequence, so EOS frequency and length are under control),
and a tiny random GPT-2 called step by step in PyTorch.
"""

from __future__ import annotations

import hashlib

import numpy as np
import pytest
import torch
from transformers import GenerationConfig, GenerationMixin, PretrainedConfig, PreTrainedModel
from transformers.modeling_outputs import CausalLMOutputWithPast

from muestra.gateway.engine.sampling import ModelInfo, SearchRequest, run_search, validate_chain
from muestra.plugin.builtins.beam_search import BeamSearch

PAD = 1


class TableConfig(PretrainedConfig):
    model_type = "muestra_beam_table"

    def __init__(self, vocab_size=12, seed=0, eos_ids=(0,), eos_boost=0.0, **kwargs):
        self.vocab_size = vocab_size
        self.seed = seed
        self.eos_ids = list(eos_ids)
        self.eos_boost = eos_boost
        super().__init__(**kwargs)


def table_logits(config: TableConfig, sequence: list[int]) -> np.ndarray:
    """Fixed logits for every sequence: a seeded draw keyed by a hash of the ids."""
    digest = hashlib.sha256(np.asarray([config.seed, *sequence], dtype=np.int64).tobytes()).digest()
    rng = np.random.default_rng(int.from_bytes(digest[:8], "little"))
    logits = rng.normal(size=config.vocab_size).astype(np.float32) * 2.0
    logits[config.eos_ids] += config.eos_boost
    return logits


class TableModel(PreTrainedModel, GenerationMixin):
    """A transformers causal LM whose next-token logits come from table_logits (no cache)."""

    config_class = TableConfig

    def __init__(self, config):
        super().__init__(config)
        self.unused = torch.nn.Parameter(torch.zeros(1))
        self.post_init()

    def forward(self, input_ids=None, attention_mask=None, **kwargs):
        logits = torch.zeros(*input_ids.shape, self.config.vocab_size)
        for row, ids in enumerate(input_ids.tolist()):
            logits[row, -1] = torch.from_numpy(table_logits(self.config, ids))
        return CausalLMOutputWithPast(logits=logits)


def hf_beam_search(model, prompts, num_beams, max_new_tokens, eos_ids, **options):
    """transformers' finished hypotheses: per prompt, [(generated ids, score)] best first."""
    output = model.generate(
        torch.tensor(prompts),
        attention_mask=torch.ones(len(prompts), len(prompts[0]), dtype=torch.long),
        num_beams=num_beams,
        do_sample=False,
        max_new_tokens=max_new_tokens,
        eos_token_id=list(eos_ids) or None,
        pad_token_id=PAD,
        num_return_sequences=num_beams,
        output_scores=True,
        return_dict_in_generate=True,
        **options,
    )
    prompt_length = len(prompts[0])
    results = []
    for p in range(len(prompts)):
        rows = range(p * num_beams, (p + 1) * num_beams)
        results.append(
            [(output.sequences[r, prompt_length:].tolist(), float(output.sequences_scores[r])) for r in rows]
        )
    return results


def assert_same_hypotheses(ours, theirs) -> None:
    assert len(ours) == len(theirs)
    for hypothesis, (ids, score) in zip(ours, theirs, strict=True):
        assert hypothesis.token_ids == ids[: len(hypothesis.token_ids)]
        assert all(t == PAD for t in ids[len(hypothesis.token_ids) :])  # transformers pads shorter ones
        assert hypothesis.score == pytest.approx(score, rel=1e-5, abs=1e-5)


def beam_chain(registry, model_info, processors=(), **params):
    specs = [{"name": n, "params": p} for n, p in processors] + [{"name": "beam_search", "params": params}]
    return validate_chain(registry, specs, model_info)


CASES = [
    # num_beams, early_stopping, length_penalty, eos ids, eos boost
    (2, False, 1.0, (0,), 1.5),
    (3, False, 1.0, (0,), 0.5),
    (3, True, 1.0, (0,), 1.5),
    (3, "never", 1.0, (0,), 1.0),
    (4, False, 0.0, (0,), 1.0),
    (4, "never", 2.0, (0,), 1.5),
    (4, True, -1.0, (0, 5), 1.0),
    (2, "never", -0.5, (0, 5), 0.0),
    (5, False, 1.5, (0, 5, 7), 0.5),
    (3, False, 1.0, (), 0.0),  # no EOS: every hypothesis runs to max_new_tokens
]


@pytest.mark.parametrize("num_beams, early_stopping, length_penalty, eos_ids, eos_boost", CASES)
def test_beam_search_on_synthetic_tables_equals_transformers(
    sampler_registry, num_beams, early_stopping, length_penalty, eos_ids, eos_boost
):
    config = TableConfig(vocab_size=12, seed=num_beams, eos_ids=eos_ids or (0,), eos_boost=eos_boost)
    model = TableModel(config).eval()
    model.generation_config = GenerationConfig()
    prompts = [[3, 4, 6], [9, 8, 10]]  # one generate() call with two prompts; ours runs them one by one
    options = {"early_stopping": early_stopping, "length_penalty": length_penalty}
    theirs = hf_beam_search(model, prompts, num_beams, 9, eos_ids, use_cache=False, **options)
    info = ModelInfo(vocab_size=12, eos_token_ids=eos_ids)
    chain = beam_chain(sampler_registry, info, num_beams=num_beams, **options)

    def step(sequences):
        return np.stack([table_logits(config, sequence) for sequence in sequences])

    for prompt, expected in zip(prompts, theirs, strict=True):
        assert_same_hypotheses(run_search(step, chain, prompt, info, max_new_tokens=9), expected)


GPT2_CASES = [
    # num_beams, early_stopping, length_penalty, repetition_penalty
    (3, False, 1.0, None),
    (4, True, 0.0, None),
    (2, "never", 0.5, None),
    (4, False, -1.0, 1.5),
]


@pytest.mark.parametrize("num_beams, early_stopping, length_penalty, repetition_penalty", GPT2_CASES)
def test_beam_search_driven_step_by_step_equals_transformers_generate(
    sampler_registry, tiny_gpt2, num_beams, early_stopping, length_penalty, repetition_penalty
):
    """The gateway's loop, with a PyTorch forward pass standing in for the lm service."""
    eos = tiny_gpt2.config.eos_token_id
    info = ModelInfo(vocab_size=tiny_gpt2.config.vocab_size, eos_token_ids=(eos,))
    options = {"early_stopping": early_stopping, "length_penalty": length_penalty}
    processors = [("repetition_penalty", {"repetition_penalty": repetition_penalty})] if repetition_penalty else []
    chain = beam_chain(sampler_registry, info, processors, num_beams=num_beams, **options)
    if repetition_penalty:
        options["repetition_penalty"] = repetition_penalty

    @torch.no_grad()
    def step(sequences):
        return tiny_gpt2(torch.tensor(sequences)).logits[:, -1].float().numpy()

    finished_on_eos = 0
    for prompt in ([5, 17, 33, 8], [60, 61, 3, 3], [90, 12, 44, 7]):
        (theirs,) = hf_beam_search(tiny_gpt2, [prompt], num_beams, 12, [eos], **options)
        ours = run_search(step, chain, prompt, info, max_new_tokens=12)
        assert_same_hypotheses(ours, theirs)
        finished_on_eos += sum(h.token_ids[-1] == eos for h in ours)
    assert finished_on_eos > 0  # hypotheses finished on EOS, not only at max_new_tokens


def test_first_step_fans_the_prompt_row_out_to_distinct_beams():
    search = BeamSearch(num_beams=3, eos_token_ids=(0,), max_new_tokens=5)
    log_probs = np.log(np.array([[0.05, 0.4, 0.3, 0.2, 0.05]], dtype=np.float32))
    step = search.step(log_probs)
    assert step.source_rows == [0, 0, 0]  # every beam continues the one prefilled row
    assert step.next_tokens == [1, 2, 3]
    assert not step.done
    # Next step: rows are the three beams; beam 1 (token 2) has by far the best continuation.
    table = np.full((3, 5), np.log(0.01), dtype=np.float32)
    table[1, 4] = np.log(0.96)
    step = search.step(table)
    assert step.source_rows[0] == 1 and step.next_tokens[0] == 4


def test_search_ends_at_max_new_tokens_and_refuses_more_steps():
    search = BeamSearch(num_beams=2, eos_token_ids=(0,), max_new_tokens=2)
    log_probs = np.log(np.array([[0.01, 0.29, 0.3, 0.2, 0.1, 0.1]], dtype=np.float32))
    assert not search.step(log_probs).done
    assert search.step(np.repeat(log_probs, 2, axis=0)).done
    results = search.results()
    assert len(results) == 2 and all(len(h.token_ids) == 2 for h in results)
    assert results[0].score >= results[1].score
    assert [h.token_ids for h in results] == [[2, 2], [2, 1]]
    with pytest.raises(RuntimeError, match="finished"):
        search.step(np.repeat(log_probs, 2, axis=0))


def test_search_request_forks_each_beams_history(sampler_registry):
    info = ModelInfo(vocab_size=6, eos_token_ids=(0,))
    chain = beam_chain(sampler_registry, info, num_beams=2)
    request = SearchRequest(chain, [3, 3], info, max_new_tokens=4)
    logits = np.array([[0.0, 2.0, 1.0, -1.0, -1.0, -1.0]], dtype=np.float32)
    step = request.step(logits)
    assert [c.all_ids().tolist() for c in request.contexts] == [[3, 3, t] for t in step.next_tokens]

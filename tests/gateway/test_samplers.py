"""Built-in logits processors against transformers' LogitsProcessors and OpenAI's formulas.

Every batch mixes rows with different parameters; transformers' processors take one value,
so each row is compared with the transformers processor built with that row's value.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers.generation import logits_process as hf

from muestra.gateway.engine.sampling import ModelInfo
from muestra.plugin import RowContext

VOCAB = 1000
MODEL = ModelInfo(vocab_size=VOCAB, eos_token_ids=(2,), context_length=512)
# Row scales from flat (0.3) to peaked (12): nuclei from hundreds of tokens down to one.
SCALES = [0.3, 1.0, 2.5, 6.0, 12.0]


def random_logits(seed: int, rows: int = len(SCALES), vocab: int = VOCAB) -> np.ndarray:
    rng = np.random.default_rng(seed)
    scales = np.resize(np.array(SCALES, dtype=np.float32), rows)
    return (rng.normal(size=(rows, vocab)).astype(np.float32) * scales[:, None]).astype(np.float32)


def random_contexts(seed: int, rows: int, vocab: int = VOCAB) -> list[RowContext]:
    """Rows with prompts and outputs that repeat tokens (so counts above 1 occur)."""
    rng = np.random.default_rng(seed)
    contexts = []
    for _ in range(rows):
        pool = rng.integers(0, vocab, size=12)
        context = RowContext(rng.choice(pool, size=rng.integers(1, 20)), np.random.default_rng(0))
        for token in rng.choice(pool, size=rng.integers(0, 25)):
            context.append(int(token))
        contexts.append(context)
    return contexts


def run_processor(registry, name: str, logits: np.ndarray, values: list[dict], contexts=None) -> np.ndarray:
    sampler = registry.get(name)
    params = [sampler.validate(v, MODEL) for v in values]
    contexts = contexts or random_contexts(0, len(values))
    return sampler.process(logits.copy(), params, contexts)


def hf_row(processor, logits_row: np.ndarray, input_ids=(0,)) -> np.ndarray:
    ids = torch.tensor([list(input_ids)], dtype=torch.long)
    return processor(ids, torch.from_numpy(logits_row.copy())[None, :])[0].numpy()


def assert_same_scores(ours: np.ndarray, theirs: np.ndarray) -> None:
    np.testing.assert_array_equal(np.isneginf(ours), np.isneginf(theirs))
    finite = np.isfinite(theirs)
    np.testing.assert_allclose(ours[finite], theirs[finite], rtol=1e-6, atol=1e-6)


HF_EQUIVALENTS = [
    ("temperature", "temperature", [0.25, 0.7, 1.0, 1.6, 3.0], hf.TemperatureLogitsWarper),
    ("top_k", "top_k", [1, 3, 40, 999, 1000], lambda k: hf.TopKLogitsWarper(top_k=k)),
    ("top_p", "top_p", [0.05, 0.5, 0.9, 0.97, 1.0], lambda p: hf.TopPLogitsWarper(top_p=p)),
    ("min_p", "min_p", [0.0, 0.02, 0.1, 0.5, 1.0], lambda p: hf.MinPLogitsWarper(min_p=p)),
    ("typical_p", "typical_p", [0.2, 0.5, 0.9, 0.95, 0.999], lambda m: hf.TypicalLogitsWarper(mass=m)),
]


@pytest.mark.parametrize("name, field, values, make_hf", HF_EQUIVALENTS, ids=[e[0] for e in HF_EQUIVALENTS])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_warper_equals_transformers_row_by_row(sampler_registry, name, field, values, make_hf, seed):
    logits = random_logits(seed)
    # Rotate the values so each row scale meets several values across seeds.
    values = values[seed:] + values[:seed]
    ours = run_processor(sampler_registry, name, logits, [{field: v} for v in values])
    for row, value in enumerate(values):
        assert_same_scores(ours[row], hf_row(make_hf(value), logits[row]))


def test_top_p_equals_transformers_on_a_large_vocabulary(sampler_registry):
    """50k tokens: the candidate path (argpartition, widened x8) against transformers' full sort."""
    logits = random_logits(7, rows=6, vocab=50_000)
    values = [0.3, 0.8, 0.95, 0.5, 0.99, 0.9]
    ours = run_processor(sampler_registry, "top_p", logits, [{"top_p": v} for v in values])
    for row, value in enumerate(values):
        assert_same_scores(ours[row], hf_row(hf.TopPLogitsWarper(top_p=value), logits[row]))


def test_top_k_keeps_ties_with_the_kth_score_like_transformers(sampler_registry):
    logits = np.array([[1.0, 3.0, 2.0, 2.0, 2.0, 0.5], [5.0, 5.0, 5.0, 1.0, 0.0, -1.0]], dtype=np.float32)
    ours = run_processor(sampler_registry, "top_k", logits, [{"top_k": 2}, {"top_k": 1}], random_contexts(0, 2, 6))
    for row, k in enumerate([2, 1]):
        assert_same_scores(ours[row], hf_row(hf.TopKLogitsWarper(top_k=k), logits[row]))
    assert np.isfinite(ours[0]).sum() == 4  # 3.0 and the three tied 2.0s


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_repetition_penalty_equals_transformers_with_prompt_and_output(sampler_registry, seed):
    logits = random_logits(seed)
    contexts = random_contexts(seed, len(SCALES))
    values = [0.5, 1.0, 1.2, 1.5, 3.0]
    ours = run_processor(
        sampler_registry, "repetition_penalty", logits, [{"repetition_penalty": v} for v in values], contexts
    )
    for row, value in enumerate(values):
        processor = hf.RepetitionPenaltyLogitsProcessor(penalty=value)
        assert_same_scores(ours[row], hf_row(processor, logits[row], contexts[row].all_ids().tolist()))


def test_logit_bias_equals_transformers_sequence_bias_of_single_tokens(sampler_registry):
    logits = random_logits(3)
    biases = [{"5": -100.0, "17": 3.5}, {}, {"999": 100.0}, {"0": -0.25, "1": 0.25, "2": 7.0}, {"42": -100.0}]
    ours = run_processor(sampler_registry, "logit_bias", logits, [{"logit_bias": b} for b in biases])
    for row, bias in enumerate(biases):
        if not bias:
            np.testing.assert_array_equal(ours[row], logits[row])
            continue
        processor = hf.SequenceBiasLogitsProcessor(sequence_bias=[[[int(t)], b] for t, b in bias.items()])
        assert_same_scores(ours[row], hf_row(processor, logits[row]))


def openai_penalized(logits: np.ndarray, output_ids, presence: float, frequency: float) -> np.ndarray:
    """OpenAI's documented formula, token by token:
    mu[j] -> mu[j] - c[j] * alpha_frequency - float(c[j] > 0) * alpha_presence."""
    expected = logits.astype(np.float64).copy()
    for j in range(len(expected)):
        c = list(output_ids).count(j)
        expected[j] = expected[j] - c * frequency - float(c > 0) * presence
    return expected


@pytest.mark.parametrize("seed", [0, 1])
def test_presence_and_frequency_penalties_follow_openais_formula(sampler_registry, seed):
    logits = random_logits(seed)
    contexts = random_contexts(seed + 10, len(SCALES))
    presence = [0.0, 0.5, -1.0, 2.0, 1.25]
    frequency = [1.0, 0.0, 0.3, -2.0, 0.75]
    ours = run_processor(
        sampler_registry, "presence_penalty", logits, [{"presence_penalty": p} for p in presence], contexts
    )
    ours = run_processor(
        sampler_registry, "frequency_penalty", ours, [{"frequency_penalty": f} for f in frequency], contexts
    )
    for row in range(len(SCALES)):
        expected = openai_penalized(logits[row], contexts[row].output_ids, presence[row], frequency[row])
        np.testing.assert_allclose(ours[row], expected, rtol=1e-5, atol=1e-5)
    # The prompt does not count for OpenAI's penalties (it does for repetition_penalty).
    prompt_only = RowContext([7, 7, 8], np.random.default_rng(0))
    untouched = run_processor(
        sampler_registry, "frequency_penalty", logits[:1], [{"frequency_penalty": 2.0}], [prompt_only]
    )
    np.testing.assert_array_equal(untouched, logits[:1])


def test_chained_warpers_equal_transformers_chain_row_by_row(sampler_registry):
    """temperature -> top_k -> top_p -> min_p, as transformers' do_sample chain, with per-row values."""
    logits = random_logits(11, rows=6, vocab=50_000)
    temperatures, ks = [0.7, 1.0, 1.3, 0.5, 2.0, 0.9], [50, 5, 1000, 20_000, 50, 1]
    top_ps, min_ps = [0.9, 0.5, 0.95, 0.99, 0.3, 0.8], [0.0, 0.05, 0.01, 0.001, 0.2, 0.0]
    ours = run_processor(sampler_registry, "temperature", logits, [{"temperature": t} for t in temperatures])
    ours = run_processor(sampler_registry, "top_k", ours, [{"top_k": k} for k in ks])
    ours = run_processor(sampler_registry, "top_p", ours, [{"top_p": p} for p in top_ps])
    ours = run_processor(sampler_registry, "min_p", ours, [{"min_p": p} for p in min_ps])
    for row in range(6):
        chain = hf.LogitsProcessorList(
            [
                hf.TemperatureLogitsWarper(temperatures[row]),
                hf.TopKLogitsWarper(ks[row]),
                hf.TopPLogitsWarper(top_ps[row]),
                hf.MinPLogitsWarper(min_ps[row]),
            ]
        )
        assert_same_scores(ours[row], hf_row(chain, logits[row]))

"""The samplers' numeric helpers take shortcuts that must not change a single score: the k-th largest score and
the top scores come from a few candidates (the blocks whose maxima can hold them), and equal np.partition over
the whole row, bit for bit, on random rows with ties, -inf runs, odd vocabularies and every k."""

from __future__ import annotations

import numpy as np
import pytest

from muestra.plugin.numeric import _best_scores, kth_largest, nucleus_threshold


def rows(seed: int):
    rng = np.random.default_rng(seed)
    for trial in range(400):
        vocab = int(rng.choice([7, 100, 1000, 1024, 32000, 49152, 50257]))
        scores = (rng.standard_normal((int(rng.integers(1, 5)), vocab)) * rng.uniform(0.1, 10)).astype(np.float32)
        if trial % 3 == 0:
            scores = np.round(scores, 1)  # many ties
        if trial % 4 == 0:
            scores[:, rng.integers(0, vocab, vocab // 2)] = -np.inf  # an earlier filter's work
        if trial % 7 == 0:
            scores[0, : vocab // 2] = -np.inf  # whole blocks removed
        yield rng, scores


@pytest.mark.parametrize("seed", [0, 1])
def test_the_kth_largest_score_is_np_partitions(seed):
    for rng, scores in rows(seed):
        vocab = scores.shape[-1]
        k = int(rng.integers(1, min(vocab, 300) + 1))
        expected = np.partition(scores, vocab - k, axis=-1)[:, vocab - k : vocab - k + 1]
        got = kth_largest(scores, k)
        assert got.dtype == scores.dtype and np.array_equal(got, expected)


@pytest.mark.parametrize("seed", [2, 3])
def test_the_best_scores_and_the_nucleus_are_those_of_the_whole_row(seed):
    for rng, scores in rows(seed):
        vocab = scores.shape[-1]
        width = min(256, vocab)
        expected = np.sort(np.partition(scores, vocab - width, axis=-1)[:, -width:], axis=-1)
        assert np.array_equal(np.sort(_best_scores(scores, width), axis=-1), expected)
        mass = rng.uniform(0.05, 1.0, (scores.shape[0], 1))
        threshold = nucleus_threshold(scores, mass)
        # The nucleus by the definition, from a full sort: the best tokens while the mass before each is below p.
        top = scores.max(axis=-1, keepdims=True)
        normaliser = np.sum(np.exp(scores - top), axis=-1, keepdims=True, dtype=np.float64)
        ordered = -np.sort(-scores, axis=-1)
        p = np.exp(ordered - top, dtype=np.float64) / normaliser
        before = np.cumsum(p, axis=-1) - p
        inside = np.sum(before < mass, axis=-1)
        assert np.array_equal(threshold[:, 0], ordered[np.arange(len(ordered)), inside - 1])


@pytest.mark.parametrize("seed", [2])
def test_top_k_and_top_p_keep_what_the_plain_masks_keep(seed):
    """top_k and top_p mask in place (and top_k without a copy when one k serves every row): the same scores, bit for
    bit, as masking a copy of each group's rows, with several ks and top_ps in one call."""
    from muestra.plugin.builtins.top_k import TopK
    from muestra.plugin.builtins.top_p import TopP

    for rng, scores in rows(seed):
        n, vocab = scores.shape
        ks = [int(rng.integers(1, vocab + 1)) for _ in range(n)] if rng.random() < 0.5 else [5] * n
        expected = scores.copy()
        for row, k in enumerate(ks):
            part = expected[row : row + 1]
            part[part < kth_largest(part, k)] = -np.inf
        got = TopK().process(scores.copy(), [{"top_k": k} for k in ks], None)
        assert np.array_equal(got, expected)
        ps = [float(rng.choice([0.3, 0.9, 1.0])) for _ in range(n)]
        expected = got.copy()
        for row, p in enumerate(ps):
            if p < 1.0 and np.isfinite(expected[row]).any():
                part = expected[row : row + 1]
                part[part < nucleus_threshold(part, np.array([p]))] = -np.inf
        if np.isfinite(got).any(axis=-1).all():
            assert np.array_equal(TopP().process(got.copy(), [{"top_p": p} for p in ps], None), expected)


def test_pick_tokens_refuses_what_it_refused_before():
    """pick_tokens checks each row's maximum first: NaN anywhere, or a row with nothing left, still fails, and a row
    holding +inf beside finite scores still passes that check and reaches the selector (whose pick of +inf the
    last check refuses, as before)."""
    from muestra.plugin import RowContext, pick_tokens
    from muestra.plugin.builtins.greedy import Greedy
    from muestra.plugin.builtins.temperature import Temperature

    def pick(row):
        chain, params = [Temperature(), Greedy()], [[{"temperature": 1.0}], [{}]]
        context = [RowContext([1], np.random.default_rng(0))]
        return pick_tokens(chain, params, np.array([row], dtype=np.float32), context)[0]

    assert pick([0.0, 2.0, 1.0]).tolist() == [1]
    for broken in ([0.0, np.nan, 1.0], [-np.inf, -np.inf, -np.inf], [np.nan, -np.inf, np.inf]):
        with pytest.raises(RuntimeError, match="NaN or remove every token"):
            pick(broken)
    with pytest.raises(RuntimeError, match="greedy picked a token that the processors removed"):
        pick([0.0, np.inf, 1.0])

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

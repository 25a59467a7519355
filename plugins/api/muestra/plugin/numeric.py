"""Vectorised helpers for samplers: softmax, per-row parameter columns, candidate selection."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """Row-wise log-softmax, float32; -inf scores stay -inf."""
    top = np.max(logits, axis=-1, keepdims=True)
    shifted = logits - top
    return (shifted - np.log(np.sum(np.exp(shifted), axis=-1, keepdims=True))).astype(np.float32, copy=False)


def softmax(logits: np.ndarray) -> np.ndarray:
    """Row-wise softmax, float32; -inf scores get probability 0."""
    shifted = np.exp(logits - np.max(logits, axis=-1, keepdims=True))
    return (shifted / np.sum(shifted, axis=-1, keepdims=True)).astype(np.float32, copy=False)


def column(params: Sequence[dict], key: str, dtype=np.float32) -> np.ndarray:
    """One parameter of every row as a [rows, 1] array, ready to broadcast against [rows, vocab]."""
    return np.array([p[key] for p in params], dtype=dtype).reshape(-1, 1)


def group_rows(values: Sequence) -> list[tuple[object, np.ndarray]]:
    """Rows that share a value: [(value, row indices), ...] in order of first appearance."""
    groups: dict = {}
    for row, value in enumerate(values):
        groups.setdefault(value, []).append(row)
    return [(value, np.array(rows, dtype=np.int64)) for value, rows in groups.items()]


def kth_largest(logits: np.ndarray, k: int) -> np.ndarray:
    """Each row's k-th largest score, [rows, 1], in O(vocab) (np.partition, no sort)."""
    vocab = logits.shape[-1]
    candidates = _candidates(logits, k)
    if candidates is None:
        return np.partition(logits, vocab - k, axis=-1)[:, vocab - k : vocab - k + 1]
    return np.array([[np.partition(row, row.size - k)[row.size - k]] for row in candidates], dtype=logits.dtype)


def _candidates(logits: np.ndarray, k: int) -> list[np.ndarray] | None:
    """Per row, a subset of its scores that holds its k largest (with ties), or None when there is no cheap one.

    The row is cut into blocks; the k-th largest of the blocks' maxima is at most the row's k-th largest score
    (k blocks have a score at least that high), so the scores at or above it hold the k largest. np.partition
    over the whole row costs ~6x more than the blocks' maxima and that comparison. The scores are the row's
    own, so whatever is taken from them (a k-th value, a sorted top) is what the whole row gives.
    """
    rows, vocab = logits.shape
    block = 256
    while block > 16 and vocab // block < 4 * k:
        block //= 2
    blocks = vocab // block
    if blocks < 2 * k:
        return None
    whole = blocks * block
    maxima = logits[:, :whole].reshape(rows, blocks, block).max(axis=-1)
    if whole < vocab:
        maxima = np.concatenate([maxima, logits[:, whole:].max(axis=-1, keepdims=True)], axis=-1)
    bound = np.partition(maxima, maxima.shape[-1] - k, axis=-1)[:, maxima.shape[-1] - k]
    if np.isnan(bound).any():
        return None  # NaN scores: leave their order to np.partition
    return [row[row >= limit] for row, limit in zip(logits, bound, strict=True)]


def nucleus_threshold(logits: np.ndarray, mass, first_candidates: int = 256) -> np.ndarray:
    """Each row's lowest score inside its top-p nucleus, [rows, 1]: keep `logits >= threshold`.

    The nucleus is the most likely tokens, best first, up to and including the first one at
    which their probability mass reaches `mass` (a token is in it when the mass of the tokens
    before it is below `mass`). Only the `first_candidates` best scores are partitioned out
    (np.partition, values only) and sorted; a row whose candidates hold too little mass is
    retried with enough candidates for the mass still missing, and with the whole row once
    that is over a quarter of the vocabulary.
    """
    rows, vocab = logits.shape
    mass = np.broadcast_to(np.asarray(mass, dtype=np.float64).reshape(-1, 1), (rows, 1))
    top = np.max(logits, axis=-1, keepdims=True)
    normaliser = np.sum(np.exp(logits - top), axis=-1, keepdims=True, dtype=np.float64)
    threshold = np.empty((rows, 1), dtype=logits.dtype)
    todo = np.arange(rows)
    width = min(vocab, max(1, first_candidates))
    while todo.size:
        part = logits if todo.size == rows else logits[todo]
        if width < vocab:
            part = _best_scores(part, width)
        best_first = np.ascontiguousarray(np.sort(part, axis=-1)[:, ::-1])
        p = np.exp(best_first - top[todo], dtype=np.float64)
        p /= normaliser[todo]
        before = np.cumsum(p, axis=-1)
        total = before[:, -1].copy()
        before -= p  # the mass of the tokens before each one
        inside = np.sum(before < mass[todo], axis=-1)  # >= 1: nothing comes before the first
        settled = (total >= mass[todo, 0]) | (width >= vocab)
        threshold[todo[settled], 0] = best_first[settled, inside[settled] - 1]
        # Every token left out is at most as likely as the last candidate: at least this many more are needed.
        with np.errstate(divide="ignore", invalid="ignore"):
            missing = (mass[todo, 0] - total)[~settled] / p[~settled, -1]
        todo = todo[~settled]
        if todo.size:
            width = max(8 * width, width + int(np.ceil(np.nan_to_num(missing.max(), posinf=vocab))))
            width = vocab if width > vocab // 4 else width
    return threshold


def _best_scores(logits: np.ndarray, width: int) -> np.ndarray:
    """The `width` highest scores of each row, unordered (padded with -inf)."""
    finite = logits > -np.inf
    counts = np.count_nonzero(finite, axis=-1)
    if counts.max() > width:
        candidates = _candidates(logits, width)
        if candidates is None:
            return np.partition(logits, logits.shape[-1] - width, axis=-1)[:, -width:]
        return np.stack([np.partition(row, row.size - width)[-width:] for row in candidates])
    # An earlier filter (top_k) left few finite scores: np.partition is slow on the many equal
    # -inf, so gather the finite ones instead (row by row: np.nonzero over the batch costs 4x more).
    best = np.full((logits.shape[0], width), -np.inf, dtype=logits.dtype)
    for row, (scores, kept) in enumerate(zip(logits, finite, strict=True)):
        best[row, : counts[row]] = scores[kept]
    return best


def mass_prefix_mask(keys: np.ndarray, probs: np.ndarray, mass: np.ndarray, first_candidates: int = 256) -> np.ndarray:
    """Per row, which tokens belong to the shortest prefix, in ascending `keys` order, whose
    probability mass reaches `mass` (a token is in it when the mass strictly before it is
    below `mass`; the first token always is). Typical-p uses it with keys = |surprise - entropy|.

    It takes the `first_candidates` smallest keys with np.argpartition and sorts only those;
    rows whose candidates hold too little mass are retried with 8 times as many, and with
    the whole row once that is over a quarter of the vocabulary. (For top-p, where the
    order is the scores' own, nucleus_threshold is cheaper: it needs no indices.)
    """
    rows, vocab = keys.shape
    mass = np.broadcast_to(np.asarray(mass, dtype=np.float64).reshape(-1, 1), (rows, 1))
    keep = np.zeros((rows, vocab), dtype=bool)
    todo = np.arange(rows)
    width = min(vocab, max(1, first_candidates))
    while todo.size:
        row_keys = keys if todo.size == rows else keys[todo]
        if width < vocab:
            candidates = np.argpartition(row_keys, width - 1, axis=-1)[:, :width]
            by_key = np.argsort(np.take_along_axis(row_keys, candidates, axis=-1), axis=-1)
            order = np.take_along_axis(candidates, by_key, axis=-1)
        else:
            order = np.argsort(row_keys, axis=-1)  # introsort: a stable sort takes 6x longer
        p = np.take_along_axis(probs if todo.size == rows else probs[todo], order, axis=-1).astype(np.float64)
        cumulative = np.cumsum(p, axis=-1)
        inside = cumulative - p < mass[todo]
        inside[:, 0] = True
        # Tokens outside the candidates have at least cumulative[-1] mass before them.
        settled = (cumulative[:, -1:] >= mass[todo])[:, 0] | (width >= vocab)
        done_rows = todo[settled]
        sub = keep[done_rows]  # a copy (fancy indexing): fill it, then write it back
        np.put_along_axis(sub, order[settled], inside[settled], axis=-1)
        keep[done_rows] = sub
        todo = todo[~settled]
        width = 8 * width
        width = vocab if width > vocab // 4 else width
    return keep

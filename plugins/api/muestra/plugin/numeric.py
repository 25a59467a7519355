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
    return np.partition(logits, vocab - k, axis=-1)[:, vocab - k : vocab - k + 1]


def mass_prefix_mask(keys: np.ndarray, probs: np.ndarray, mass: np.ndarray, first_candidates: int = 64) -> np.ndarray:
    """Per row, which tokens belong to the shortest prefix, in ascending `keys` order, whose
    probability mass reaches `mass` (a token is in it when the mass strictly before it is
    below `mass`; the first token always is). Top-p uses keys = -logits.

    It never sorts a whole row unless it must: it takes the `first_candidates` smallest keys
    with np.argpartition, sorts only those, and widens (x8) just for rows whose candidates
    hold too little mass.
    """
    rows, vocab = keys.shape
    mass = np.broadcast_to(np.asarray(mass, dtype=np.float64).reshape(-1, 1), (rows, 1))
    keep = np.zeros((rows, vocab), dtype=bool)
    todo = np.arange(rows)
    width = min(vocab, max(1, first_candidates))
    while todo.size:
        row_keys = keys[todo]
        if width < vocab:
            candidates = np.argpartition(row_keys, width - 1, axis=-1)[:, :width]
        else:
            candidates = np.broadcast_to(np.arange(vocab), (todo.size, vocab))
        by_key = np.argsort(np.take_along_axis(row_keys, candidates, axis=-1), axis=-1, kind="stable")
        order = np.take_along_axis(candidates, by_key, axis=-1)
        p = np.take_along_axis(probs[todo], order, axis=-1).astype(np.float64)
        cumulative = np.cumsum(p, axis=-1)
        before = cumulative - p
        inside = before < mass[todo]
        inside[:, 0] = True
        # Tokens outside the candidates have at least cumulative[-1] mass before them.
        settled = (cumulative[:, -1:] >= mass[todo])[:, 0] | (width >= vocab)
        done_rows = todo[settled]
        sub = keep[done_rows]  # a copy (fancy indexing): fill it, then write it back
        np.put_along_axis(sub, order[settled], inside[settled], axis=-1)
        keep[done_rows] = sub
        todo = todo[~settled]
        width = min(vocab, width * 8)
    return keep

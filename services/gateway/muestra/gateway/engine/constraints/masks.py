"""Allowed-token bitmasks as llguidance fills them: int32 words, bit (i % 32) of word (i / 32) is token i."""

from __future__ import annotations

import numpy as np


def allowed_ids(mask: np.ndarray, vocab_size: int) -> np.ndarray:
    """The ids a mask allows, in order."""
    bits = np.unpackbits(mask.view(np.uint8), count=vocab_size, bitorder="little")
    return np.flatnonzero(bits)


def apply_mask(scores: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """Set -inf in one row of scores wherever the mask leaves a token out; returns the row."""
    vocab = scores.shape[-1]
    bits = np.unpackbits(mask.view(np.uint8), count=min(vocab, 32 * mask.size), bitorder="little")
    scores[: bits.size][bits == 0] = -np.inf
    scores[bits.size :] = -np.inf
    return scores

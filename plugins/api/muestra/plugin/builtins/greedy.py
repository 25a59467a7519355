"""Greedy decoding: the highest-scoring token."""

import numpy as np

from muestra.plugin import TokenSelector


class Greedy(TokenSelector):
    name = "greedy"
    description = "Pick the highest-scoring token (argmax); deterministic."
    runs_in_lm = True
    argmax_invariant = True

    def select(self, logits, params, rows) -> np.ndarray:
        return np.argmax(logits, axis=-1).astype(np.int64)

"""Multinomial sampling from the processed distribution, with each row's own seeded generator."""

import numpy as np

from muestra.plugin import TokenSelector, hookimpl


class Sample(TokenSelector):
    name = "sample"
    description = "Draw the token from the softmax of the processed scores (multinomial sampling)."

    def select(self, logits, params, rows) -> np.ndarray:
        # Inverse-CDF sampling: one uniform draw per row from that row's generator, so a row's
        # token never depends on which other rows share the batch.
        weights = np.exp(logits - np.max(logits, axis=-1, keepdims=True), dtype=np.float64)
        cdf = np.cumsum(weights, axis=-1)
        draws = np.array([row.rng.random() for row in rows]).reshape(-1, 1) * cdf[:, -1:]
        # The first index whose cdf exceeds the draw; a token with weight 0 never qualifies.
        tokens = np.sum(cdf <= draws, axis=-1)
        return np.minimum(tokens, logits.shape[-1] - 1).astype(np.int64)


@hookimpl
def register_samplers(register):
    register(Sample())

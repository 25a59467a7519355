"""Multinomial sampling from the processed distribution, with each row's own seeded generator."""

import numpy as np

from muestra.plugin import TokenSelector

BLOCK = 256


class Sample(TokenSelector):
    name = "sample"
    description = "Draw the token from the softmax of the processed scores (multinomial sampling)."
    runs_in_lm = True

    def select(self, logits, params, rows) -> np.ndarray:
        # Inverse-CDF sampling, one uniform draw per row from that row's generator, so a row's
        # token never depends on which other rows share the batch. Two levels, blocks of 256
        # tokens and then the tokens of the chosen block, instead of a cumsum over the vocabulary.
        n, vocab = logits.shape
        weights = np.exp(logits - np.max(logits, axis=-1, keepdims=True))
        whole = vocab - vocab % BLOCK
        block_mass = weights[:, :whole].reshape(n, -1, BLOCK).sum(axis=-1, dtype=np.float64)
        if whole < vocab:
            tail = weights[:, whole:].sum(axis=-1, keepdims=True, dtype=np.float64)
            block_mass = np.concatenate([block_mass, tail], axis=-1)
        block_cdf = np.cumsum(block_mass, axis=-1)
        draw = np.array([row.rng.random() for row in rows]) * block_cdf[:, -1]
        # The first block whose cumulative mass exceeds the draw (a block of weight 0 never does).
        block = np.minimum(np.sum(block_cdf <= draw[:, None], axis=-1), block_mass.shape[1] - 1)
        index = np.arange(n)
        columns = block[:, None] * BLOCK + np.arange(BLOCK)
        inner = np.where(columns < vocab, weights[index[:, None], np.minimum(columns, vocab - 1)], 0.0)
        inner_cdf = np.cumsum(inner, axis=-1, dtype=np.float64)
        # Then the first token of that block whose cumulative weight exceeds what is left of the
        # draw, kept below the block's total so rounding cannot run past its last nonzero weight.
        left = draw - (block_cdf[index, block] - block_mass[index, block])
        left = np.minimum(left, np.nextafter(inner_cdf[:, -1], -np.inf))
        return (block * BLOCK + np.sum(inner_cdf <= left[:, None], axis=-1)).astype(np.int64)

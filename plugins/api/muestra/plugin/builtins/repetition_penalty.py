"""Repetition penalty (CTRL): shrink the scores of every token already in the prompt or the output.

transformers' RepetitionPenaltyLogitsProcessor: each seen token once, score * penalty if
negative, score / penalty otherwise; the prompt counts, as in transformers' generate.
"""

import numpy as np

from muestra.plugin import Float, LogitsProcessor


class RepetitionPenalty(LogitsProcessor):
    name = "repetition_penalty"
    description = "Divide positive (multiply negative) scores of tokens seen in the prompt or output."
    runs_in_lm = True
    parameters = {
        "repetition_penalty": Float(1.0, "Above 1 discourages repeats, below 1 encourages.", gt=0.0, le=100.0)
    }

    def process(self, logits, params, rows):
        # One gather/scatter for the whole batch: (row, token) pairs of every row's seen tokens.
        seen = [np.unique(row.all_ids()) for row in rows]
        row_index = np.repeat(np.arange(len(rows)), [len(ids) for ids in seen])
        token_index = np.concatenate(seen) if seen else np.zeros(0, dtype=np.int64)
        penalty = np.array([p["repetition_penalty"] for p in params], dtype=np.float32)[row_index]
        scores = logits[row_index, token_index]
        logits[row_index, token_index] = np.where(scores < 0, scores * penalty, scores / penalty)
        return logits

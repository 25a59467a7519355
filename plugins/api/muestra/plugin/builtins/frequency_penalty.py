"""Frequency penalty, OpenAI's formula: subtract the penalty once per earlier occurrence of a token."""

import numpy as np

from muestra.plugin import Float, LogitsProcessor


class FrequencyPenalty(LogitsProcessor):
    name = "frequency_penalty"
    description = "Subtract frequency_penalty times the count of each token generated so far (OpenAI)."
    runs_in_lm = True
    parameters = {
        "frequency_penalty": Float(0.0, "Positive discourages, negative encourages repeats.", ge=-2.0, le=2.0)
    }

    def process(self, logits, params, rows):
        # mu[j] -= frequency_penalty * c[j], c[j] counting the generated tokens only.
        counted = [np.unique(row.output_ids, return_counts=True) for row in rows]
        row_index = np.repeat(np.arange(len(rows)), [len(ids) for ids, _ in counted])
        if row_index.size == 0:
            return logits
        token_index = np.concatenate([ids for ids, _ in counted])
        counts = np.concatenate([c for _, c in counted]).astype(np.float32)
        penalty = np.array([p["frequency_penalty"] for p in params], dtype=np.float32)
        logits[row_index, token_index] -= penalty[row_index] * counts
        return logits

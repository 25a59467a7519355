"""Presence penalty, OpenAI's formula: subtract the penalty from every token already generated."""

import numpy as np

from muestra.plugin import Float, LogitsProcessor


class PresencePenalty(LogitsProcessor):
    name = "presence_penalty"
    description = "Subtract presence_penalty from the score of every token generated so far (OpenAI)."
    runs_in_lm = True
    parameters = {"presence_penalty": Float(0.0, "Positive discourages, negative encourages repeats.", ge=-2.0, le=2.0)}

    def process(self, logits, params, rows):
        # mu[j] -= presence_penalty * (c[j] > 0), c[j] counting the generated tokens only.
        seen = [np.unique(row.output_ids) for row in rows]
        row_index = np.repeat(np.arange(len(rows)), [len(ids) for ids in seen])
        token_index = np.concatenate(seen) if seen else np.zeros(0, dtype=np.int64)
        penalty = np.array([p["presence_penalty"] for p in params], dtype=np.float32)
        logits[row_index, token_index] -= penalty[row_index]
        return logits

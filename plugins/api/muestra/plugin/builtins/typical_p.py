"""Locally typical sampling: keep tokens whose surprise is closest to the entropy; transformers' TypicalLogitsWarper."""

import numpy as np

from muestra.plugin import Float, LogitsProcessor, column, log_softmax, mass_prefix_mask


class TypicalP(LogitsProcessor):
    name = "typical_p"
    description = "Keep the tokens whose surprise is closest to the entropy, up to typical_p of the mass."
    runs_in_lm = True
    parameters = {"typical_p": Float(0.9, "Probability mass to keep.", gt=0.0, lt=1.0)}
    # It can drop the most likely token when that token is far more predictable than average.
    argmax_invariant = False

    def process(self, logits, params, rows):
        logp = log_softmax(logits)
        p = np.exp(logp)
        entropy = -np.sum(np.where(p > 0, logp, 0.0) * p, axis=-1, keepdims=True)  # 0 * log 0 = 0
        distance = np.abs(-logp - entropy)
        keep = mass_prefix_mask(distance, p, column(params, "typical_p"))
        logits[~keep] = -np.inf
        return logits

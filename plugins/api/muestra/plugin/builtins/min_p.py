"""Min-p: drop tokens less likely than min_p times the most likely one; transformers' MinPLogitsWarper."""

import numpy as np

from muestra.plugin import Float, LogitsProcessor, column


class MinP(LogitsProcessor):
    name = "min_p"
    description = "Drop tokens whose probability is below min_p times the top token's probability."
    runs_in_lm = True
    parameters = {"min_p": Float(0.0, "Fraction of the top probability a token needs.", ge=0.0, le=1.0)}
    argmax_invariant = True

    def process(self, logits, params, rows):
        # p_i < min_p * p_max  <=>  exp(l_i - l_max) < min_p: no normalisation needed.
        relative = np.exp(logits - np.max(logits, axis=-1, keepdims=True))
        logits[relative < column(params, "min_p")] = -np.inf
        return logits

"""Top-p (nucleus): keep the most likely tokens until their mass reaches p; transformers' TopPLogitsWarper."""

import numpy as np

from muestra.plugin import Float, LogitsProcessor, column, nucleus_threshold


class TopP(LogitsProcessor):
    name = "top_p"
    description = "Keep the smallest set of most likely tokens whose probability reaches top_p."
    runs_in_lm = True
    parameters = {"top_p": Float(1.0, "Probability mass to keep.", gt=0.0, le=1.0)}
    argmax_invariant = True

    def process(self, logits, params, rows):
        top_p = column(params, "top_p")
        active = top_p[:, 0] < 1.0
        if not active.any():
            return logits
        part = logits if active.all() else logits[active]
        # Candidates by np.partition, not a full-vocabulary sort (see nucleus_threshold).
        np.putmask(part, part < nucleus_threshold(part, top_p[active]), -np.inf)
        if not active.all():
            logits[active] = part
        return logits

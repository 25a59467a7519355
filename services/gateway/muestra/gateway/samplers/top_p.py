"""Top-p (nucleus): keep the most likely tokens until their mass reaches p; transformers' TopPLogitsWarper."""

import numpy as np

from muestra.plugin import Float, LogitsProcessor, column, hookimpl, mass_prefix_mask, softmax


class TopP(LogitsProcessor):
    name = "top_p"
    description = "Keep the smallest set of most likely tokens whose probability reaches top_p."
    parameters = {"top_p": Float(1.0, "Probability mass to keep.", gt=0.0, le=1.0)}
    argmax_invariant = True

    def process(self, logits, params, rows):
        top_p = column(params, "top_p")
        active = top_p[:, 0] < 1.0
        if not active.any():
            return logits
        part = logits[active]
        # Candidates by argpartition, not a full-vocabulary sort (see mass_prefix_mask).
        keep = mass_prefix_mask(-part, softmax(part), top_p[active])
        part[~keep] = -np.inf
        logits[active] = part
        return logits


@hookimpl
def register_samplers(register):
    register(TopP())

"""Top-k: keep the k highest scores (ties with the k-th are kept); transformers' TopKLogitsWarper."""

import numpy as np

from muestra.plugin import Int, LogitsProcessor, group_rows, kth_largest


class TopK(LogitsProcessor):
    name = "top_k"
    description = "Keep only the k highest-scoring tokens."
    runs_in_lm = True
    parameters = {"top_k": Int(50, "How many tokens to keep.", ge=1, le=1_000_000)}
    argmax_invariant = True

    def process(self, logits, params, rows):
        vocab = logits.shape[-1]
        # One O(vocab) np.partition per distinct k; no sort.
        groups = group_rows([min(p["top_k"], vocab) for p in params])
        for k, index in groups:
            if k == vocab:
                continue
            # One group of every row is masked in place; others go through a copy of their rows.
            part = logits if len(groups) == 1 else logits[index]
            np.putmask(part, part < kth_largest(part, k), -np.inf)
            if part is not logits:
                logits[index] = part
        return logits

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
        for k, index in group_rows([min(p["top_k"], vocab) for p in params]):
            if k == vocab:
                continue
            part = logits[index]
            part[part < kth_largest(part, k)] = -np.inf
            logits[index] = part
        return logits

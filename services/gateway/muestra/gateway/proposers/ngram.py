"""Prompt lookup (transformers' prompt_lookup_num_tokens, vLLM's "ngram"): find the latest earlier place where
the row's last few tokens occurred, in the prompt or the text so far, and propose what followed them there.

It costs a few vectorised comparisons per row and step, and pays where the output quotes its input:
summaries, extraction, code edits, answers from a given context.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from muestra.plugin import ADAPTIVE, MAX_DRAFT_TOKENS, DraftProposer, DraftRow, Int, SamplerParamError


def lookup(ids: np.ndarray, n: int, k: int) -> np.ndarray:
    """The up to k ids that followed the latest earlier occurrence of ids' last n ids (empty: none)."""
    if ids.size <= n:
        return ids[:0]
    tail = ids[-n:]
    # Candidate starts: every earlier window of n ids, compared position by position.
    starts = np.flatnonzero(ids[: ids.size - n] == tail[0])
    for offset in range(1, n):
        starts = starts[ids[starts + offset] == tail[offset]]
        if not starts.size:
            return ids[:0]
    if not starts.size:
        return ids[:0]
    begin = int(starts[-1]) + n
    return ids[begin : begin + k]


class NgramProposer(DraftProposer):
    name = "ngram"
    description = "Prompt lookup: proposes what followed the last few tokens where they occurred before."
    parameters = {
        "max_draft_tokens": MAX_DRAFT_TOKENS,
        "max_ngram": Int(5, "Longest tail of tokens looked up (tried first).", ge=1, le=16),
        # Two-token tails match common phrases of open-ended text, whose continuations are seldom the same.
        "min_ngram": Int(3, "Shortest tail of tokens looked up.", ge=1, le=16),
        "adaptive": ADAPTIVE,
    }

    def validate(self, params):
        checked = super().validate(params)
        if checked["min_ngram"] > checked["max_ngram"]:
            raise SamplerParamError(
                self.name, "min_ngram", f"is {checked['min_ngram']}, more than max_ngram {checked['max_ngram']}"
            )
        return checked

    def propose(self, rows: Sequence[DraftRow]) -> list[Sequence[int]]:
        drafts = []
        for row in rows:
            found = row.ids[:0]
            for n in range(row.params["max_ngram"], row.params["min_ngram"] - 1, -1):
                found = lookup(row.ids, n, row.max_tokens)
                if found.size:
                    break
            drafts.append(found.tolist())
        return drafts

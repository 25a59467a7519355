"""Prompt lookup (transformers' prompt_lookup_num_tokens, vLLM's "ngram"): find the earlier place where the
row's last tokens occurred, in the prompt or the text so far, and propose what followed them there.

It costs a few vectorised comparisons per row and step, and pays where the output quotes its input:
summaries, extraction, code edits, answers from a given context, and text that repeats itself.

A short match predicts little: on the default model, drafts after a match of 2 to 4 tokens kept 1 to 3
tokens on average, and after 6 or more, 9 to 13 of 16 (greedy; docs/benchmarks.md). A verification costs
about three plain steps on CPUs, so the proposer only drafts after a match of min_ngram tokens (6).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from muestra.plugin import ADAPTIVE, MAX_DRAFT_TOKENS, DraftProposer, DraftRow, Int, SamplerParamError


def lookup(ids: np.ndarray, k: int, min_ngram: int, max_ngram: int | None = None) -> np.ndarray:
    """The k ids that followed the earlier occurrence of ids' last tokens with the longest match (at least
    min_ngram tokens, counted up to max_ngram; the latest of equals), repeating the text from there where
    it runs out; empty: no such occurrence."""
    max_ngram = max(min_ngram, max_ngram or min_ngram)
    size = ids.size
    if size <= min_ngram:
        return ids[:0]
    tail = ids[size - min_ngram :]
    # Candidate starts: every earlier window of min_ngram ids, compared position by position.
    starts = np.flatnonzero(ids[: size - min_ngram] == tail[0])
    for offset in range(1, min_ngram):
        starts = starts[ids[starts + offset] == tail[offset]]
        if not starts.size:
            return ids[:0]
    if not starts.size:
        return ids[:0]
    # Then how far each match reaches back, up to max_ngram tokens in all.
    matched = np.full(starts.size, min_ngram)
    alive = np.ones(starts.size, dtype=bool)
    for back in range(1, max_ngram - min_ngram + 1):
        before = starts - back
        alive &= before >= 0
        if not alive.any():
            break
        alive &= ids[np.maximum(before, 0)] == ids[size - min_ngram - back]
        matched += alive
    begin = int(starts[np.flatnonzero(matched == matched.max())[-1]]) + min_ngram
    found = ids[begin : begin + k]
    if found.size < k:
        # The continuation runs into the end, so the text's last size - begin ids repeat: the draft goes on
        # repeating them, as an overlapping copy would (np.resize repeats an array cyclically).
        found = np.resize(found, k)
    return found


def quiet_tokens(ids: np.ndarray, min_ngram: int) -> int:
    """For ids whose last min_ngram tokens did not occur earlier: the fewest tokens to come before they can.

    A match of min_ngram tokens t tokens from now would begin with the last min_ngram - t tokens of ids, so
    those must already occur earlier: t is at least min_ngram less the longest such tail now."""
    size = ids.size
    # Ends of the earlier occurrences of ids' last `length` + 1 tokens, for growing lengths.
    ends = np.flatnonzero(ids[: size - 1] == ids[-1]) if size > 1 else ids[:0]
    length = 0
    while ends.size and length + 1 < min_ngram:
        length += 1
        ends = ends[ends >= length]
        ends = ends[ids[ends - length] == ids[size - 1 - length]]
    return max(1, min_ngram - length)


class NgramProposer(DraftProposer):
    name = "ngram"
    description = "Prompt lookup: proposes what followed the last few tokens where they occurred before."
    parameters = {
        "max_draft_tokens": MAX_DRAFT_TOKENS,
        "max_ngram": Int(16, "Longest match counted: the longest match up to it wins.", ge=1, le=64),
        "min_ngram": Int(6, "Shortest match that drafts (tokens at the end that occurred before).", ge=1, le=64),
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
        return [
            lookup(row.ids, row.max_tokens, row.params["min_ngram"], row.params["max_ngram"]).tolist() for row in rows
        ]

    def quiet(self, row: DraftRow) -> int:
        return quiet_tokens(row.ids, row.params["min_ngram"])

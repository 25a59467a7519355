"""A draft proposer that knows the answer, for bench/speculative_bounds.py only (never installed).

It reads, from the file named by $MUESTRA_BENCH_ORACLE, the ids (prompt, then output) that each bench text
gave without drafts, one list per sampling mode, and for a row whose ids begin one of them proposes what
follows there. Its drafts are therefore all accepted, and how fast a run goes with them bounds what any
proposer can give on this stack:
- `ngram: 0`: the true continuation, max_tokens of it at every step (any proposer, even one that is always
  right).
- `ngram: n`: only the part of the ngram lookup's draft (after a match of n tokens) that is right, and only
  when at least `min_keep` tokens of it are (prompt lookup with a perfect judge of when it pays).
"""

from __future__ import annotations

import json
import os

import numpy as np

from muestra.gateway.engine.proposers.ngram import lookup
from muestra.plugin import ADAPTIVE, MAX_DRAFT_TOKENS, DraftProposer, Int, hookimpl


def _answers() -> list[list[np.ndarray]]:
    path = os.environ.get("MUESTRA_BENCH_ORACLE")
    if not path:
        return [[], []]
    return [[np.asarray(ids, dtype=np.int64) for ids in table] for table in json.loads(open(path).read())]


class Oracle(DraftProposer):
    name = "bench_oracle"
    description = "Knows each bench text's output (bench/speculative_bounds.py): bounds what drafts can give."
    parameters = {
        "max_draft_tokens": MAX_DRAFT_TOKENS,
        "table": Int(0, "Which answers: 0 greedy, 1 sampled.", ge=0, le=1),
        "ngram": Int(0, "0: the true continuation; n: the right part of a lookup after an n-token match.", ge=0),
        "min_keep": Int(1, "Fewest right tokens a draft of the lookup must have.", ge=1, le=16),
        "adaptive": ADAPTIVE,
    }

    def __init__(self) -> None:
        self.answers = _answers()

    def propose(self, rows):
        return [self._draft(row) for row in rows]

    def _draft(self, row) -> list[int]:
        size = row.ids.size
        answer = next(
            (a for a in self.answers[row.params["table"]] if a.size > size and np.array_equal(a[:size], row.ids)),
            None,
        )
        if answer is None:
            return []
        truth = answer[size : size + row.max_tokens]
        if row.params["ngram"]:
            guess = lookup(row.ids, row.max_tokens, row.params["ngram"], 16)[: truth.size]
            wrong = np.flatnonzero(guess != truth[: guess.size])
            truth = truth[: wrong[0] if wrong.size else guess.size]
        return truth.tolist() if truth.size >= row.params["min_keep"] else []


@hookimpl
def register_proposers(register):
    register(Oracle())

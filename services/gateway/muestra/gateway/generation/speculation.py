"""Speculative decoding in the step loop: which rows get drafts, how long, and what the lm's verdict does.

Before a Decode, each eligible row asks its proposer for up to k draft tokens; the Decode scores the row's
pending token and its drafts in one forward (DecodeBatch.draft_lengths). Then the row's own sampler chain
runs on those positions in order, with its random generator and processor state: a draft stays while the
chain picks exactly it, and the first token it does not pick is replaced by the chain's own. The tokens a
row takes are those it would have taken one step at a time, with the same random draws. A greedy row's
argmax comparison runs in the lm (RowOutput.accepted_drafts); a sampled row tells the lm in its next Decode
how many rejected drafts to drop (DecodeBatch.rollback).

Not every row drafts. Rows with a constraint or stop strings step one token at a time (their masks and
texts are known one token at a time), and so do beam searches. k adapts per row: it grows while every draft
is accepted and shrinks to what was accepted otherwise. A row whose accepted tokens are not worth the
measured extra cost of its verification (each drafted row costs its own forward on fused-attention graphs)
stops drafting for a while, longer each time, so text that no proposer predicts is not slowed down.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from muestra.gateway import metrics
from muestra.gateway.generation.request import Sequence
from muestra.gateway.proposers.registry import Speculation
from muestra.plugin import DraftRow
from muestra.v1 import lm_pb2

# Weight of the newest measurement in the running estimates.
WEIGHT = 0.3
# Plain steps a row waits before it drafts again once drafting stopped paying, first and at most.
BACKOFF_STEPS = 16
MAX_BACKOFF_STEPS = 512
# What a row that never drafted is assumed to gain per verification, in accepted tokens.
OPTIMISTIC_ACCEPTED = 2.0


@dataclasses.dataclass
class RowSpeculation:
    """One completion's speculation: its proposer, draft length, and what its drafts have been worth."""

    speculation: Speculation
    k: int
    # Running mean of the drafts accepted per verification (None: none yet).
    accepted: float | None = None
    # Plain steps left before it drafts again, and the next pause's length.
    pause: int = 0
    backoff: int = BACKOFF_STEPS
    # The proposer's private state.
    state: dict = dataclasses.field(default_factory=dict)
    # Totals for the request's usage.
    draft_tokens: int = 0
    accepted_tokens: int = 0

    @classmethod
    def start(cls, speculation: Speculation) -> RowSpeculation:
        return cls(speculation, speculation.max_draft_tokens)

    def verified(self, drafted: int, accepted: int) -> None:
        """A verification of `drafted` tokens kept `accepted` of them."""
        self.draft_tokens += drafted
        self.accepted_tokens += accepted
        self.accepted = accepted if self.accepted is None else self.accepted + WEIGHT * (accepted - self.accepted)
        limit = self.speculation.max_draft_tokens
        if self.speculation.adaptive:
            self.k = min(limit, self.k + 2) if accepted == drafted else max(1, accepted + 1)


class SpeculationPolicy:
    """A replica's view of what verification costs: plain steps against steps with drafts, per drafted row."""

    def __init__(self, model_name: str) -> None:
        self.model_name = model_name
        # Running estimate of a plain Decode's time (s) and of the extra time each drafted row adds to one.
        self.plain_s: float | None = None
        self.extra_s: float | None = None

    def timed(self, total_s: float, drafted_rows: int) -> None:
        if drafted_rows == 0:
            self.plain_s = total_s if self.plain_s is None else self.plain_s + WEIGHT * (total_s - self.plain_s)
        elif self.plain_s is not None:
            extra = max(0.0, total_s - self.plain_s) / drafted_rows
            self.extra_s = extra if self.extra_s is None else self.extra_s + WEIGHT * (extra - self.extra_s)

    def pays(self, row: RowSpeculation, rows: int) -> bool:
        """Whether the tokens a row's drafts are expected to add are worth their extra time in this batch."""
        if not row.speculation.adaptive or self.plain_s is None or self.extra_s is None or row.accepted is None:
            return True  # measure first
        return row.accepted * self.plain_s / max(rows, 1) >= self.extra_s

    def draft(self, rows: list, max_draft_tokens: int, context_length: int) -> int:
        """Give each eligible row of the next Decode its drafts (Sequence.drafts); how many rows got some."""
        asking: dict[int, tuple] = {}
        for row in rows:
            if isinstance(row, Sequence):
                row.drafts = []
            if not eligible(row) or max_draft_tokens <= 0:
                continue
            spec = row.speculation
            if spec.pause > 0:
                spec.pause -= 1
                continue
            if not self.pays(spec, len(rows)):
                spec.pause, spec.backoff = spec.backoff, min(2 * spec.backoff, MAX_BACKOFF_STEPS)
                spec.accepted = None  # the next verification measures it again
                continue
            held = len(row.request.prompt_ids) + len(row.generated)
            room = min(
                spec.k,
                max_draft_tokens,
                row.request.max_tokens - len(row.generated) - 1,  # the pending token is the row's last but these
                context_length - held,
            )
            if room < 1:
                continue
            ids = np.concatenate([row.sampling.context.prompt_ids, np.asarray(row.generated, dtype=np.int64)])
            asking.setdefault(id(spec.speculation.proposer), (spec.speculation.proposer, []))[1].append(
                (row, DraftRow(ids, room, spec.speculation.params, spec.state))
            )
        drafted = 0
        for proposer, entries in asking.values():
            proposals = proposer.propose([draft for _, draft in entries])
            for (row, draft), proposal in zip(entries, proposals, strict=True):
                tokens = [int(t) for t in list(proposal)[: draft.max_tokens]]
                if tokens:
                    row.drafts = tokens
                    drafted += 1
        return drafted


def eligible(row) -> bool:
    """Whether a row may draft: a running completion with a proposer, no constraint and no stop strings, whose
    pending token is all it feeds next and whose output the lm can give per position."""
    return (
        isinstance(row, Sequence)
        and row.speculation is not None
        and not row.finished
        and not row.in_flight
        and not row.queued
        and row.pending_token is not None
        and row.sampling.constraint is None
        and not row.request.stop
        and row.sampling.output_kind in (lm_pb2.ARGMAX, lm_pb2.LOGITS)
    )


def count(row: Sequence, drafted: int, accepted: int, model_name: str) -> None:
    """Record a verification's verdict on the row and in the metrics."""
    row.speculation.verified(drafted, accepted)
    proposer = row.speculation.speculation.proposer.name
    metrics.SPEC_DRAFTS.labels(model_name, proposer).inc()
    metrics.SPEC_DRAFT_TOKENS.labels(model_name, proposer).inc(drafted)
    metrics.SPEC_ACCEPTED_TOKENS.labels(model_name, proposer).inc(accepted)

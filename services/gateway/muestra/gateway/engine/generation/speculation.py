"""Speculative decoding in the step loop: which rows get drafts, how long, and what the lm's verdict does.

Before a Decode, each eligible row asks its proposer for up to k draft tokens; the Decode scores the row's
pending token and its drafts in one forward (DecodeBatch.draft_lengths). Then the row's own sampler chain
runs on those positions in order, with its random generator and processor state: a draft stays while the
chain picks exactly it, and the first token it does not pick is replaced by the chain's own. The tokens a
row takes are those it would have taken one step at a time, with the same random draws. A greedy row's
argmax comparison runs in the lm (RowOutput.accepted_drafts); a sampled row tells the lm in its next Decode
how many rejected drafts to drop (DecodeBatch.rollback).

Not every row drafts. Rows with a constraint step one token at a time (their masks are known one token at
a time), and so do beam searches. A row with stop strings drafts: when the text of a step's tokens holds a
stop string, the detokenizer ends the row at the token that completed it. A row's draft length grows while every draft
is accepted and falls back to START_DRAFT otherwise. Each verification weighs the drafts it kept against
the measured extra time of a drafting row (each costs its own forward on fused-attention graphs), in a
running balance with a little credit: a row whose drafts have cost more than they kept stops drafting for a
few tokens, longer each time it happens again before its drafts pay, so text that no proposer predicts is
not slowed down, and a copied passage's last misses do not stop the drafts that will copy the next one.
"""

from __future__ import annotations

import dataclasses
import inspect
import itertools
import logging

import numpy as np

from muestra.gateway import metrics
from muestra.gateway.engine.generation.request import Sequence
from muestra.gateway.engine.proposers.registry import Speculation
from muestra.plugin import DraftRow
from muestra.v1 import lm_pb2

log = logging.getLogger("muestra.gateway.speculation")

# Weight of the newest measurement in the running estimates.
WEIGHT = 0.3
# A row's drafts keep a balance, in tokens: each verification adds the drafts it kept less what it cost (the
# extra time of a drafting row, in plain steps). Alone in its batch, where a verification is one forward with
# its pending token, good runs build credit, up to CREDIT, that a few misses at the end of a copied passage
# spend, and the row pauses once its balance falls below -DEBT. In a batch of several rows each drafting row
# costs a forward of its own (docs/speculative.md), and a row pauses after any verification that did not pay.
CREDIT = 4.0
DEBT = 3.0
# In a batch of several rows a drafting row's own forward costs about a step of the whole batch, so a
# verification pays only when it keeps about as many tokens as the batch has rows. Rows there draft only
# while this replica's verifications keep that many on average (a running mean, alone or in batches);
# otherwise one row probes every PROBE_EVERY steps, so that the mean follows the traffic.
PROBE_EVERY = 64
# Tokens a row generates without drafts once drafting stopped paying, first and at most (each pause in a
# row doubles it; a verification that pays resets it).
FIRST_PAUSE = 32
MAX_PAUSE = 512
# A row's draft length to start with, and to fall back to after a rejection; it grows by GROWTH while every
# draft is accepted, up to the request's max_draft_tokens. Never shorter: on CPUs a step of two tokens
# already costs most of what a step of nine does (docs/speculative.md), so short drafts do not pay.
START_DRAFT = 8
GROWTH = 8
# A greedy burst (the lm's own steps, no drafts) ends where a row could draft again, when that is at most this
# many tokens away: further away, drafts rarely begin soon, and short bursts cost a round trip per step
# (measured in docs/benchmarks.md, session 10).
QUIET_BURST = 2


@dataclasses.dataclass
class RowSpeculation:
    """One completion's speculation: its proposer, draft length, and what its drafts have been worth."""

    speculation: Speculation
    k: int
    # What its drafts gained over their cost so far, in tokens (see CREDIT), and what a verification cost when
    # it last drafted.
    balance: float = 0.0
    needed: float = 0.0
    credit: float = CREDIT
    # The row drafts again once it has generated this many tokens; the next pause's length.
    resume_at: int = 0
    pause: int = FIRST_PAUSE
    # The proposer's private state.
    state: dict = dataclasses.field(default_factory=dict)
    # Totals for the request's usage.
    draft_tokens: int = 0
    accepted_tokens: int = 0

    @classmethod
    def start(cls, speculation: Speculation) -> RowSpeculation:
        limit = speculation.max_draft_tokens
        return cls(speculation, min(START_DRAFT, limit) if speculation.adaptive else limit)

    def verified(self, drafted: int, accepted: int) -> None:
        """A verification of `drafted` tokens kept `accepted` of them."""
        self.draft_tokens += drafted
        self.accepted_tokens += accepted
        self.balance = min(self.credit, self.balance + accepted - self.needed)
        if accepted > self.needed:
            self.pause = FIRST_PAUSE  # drafts pay again: the next pause starts short
        limit = self.speculation.max_draft_tokens
        if self.speculation.adaptive:
            self.k = min(limit, self.k + GROWTH) if accepted == drafted else min(limit, START_DRAFT)


class SpeculationPolicy:
    """A replica's view of what verification costs: plain steps against steps with drafts, per drafted row.

    Costs are the scheduler's own step times (the lm's Decode, sampling and the verdicts), so that what
    speculation saves besides forwards (a round trip and a sampling pass per token) counts too."""

    def __init__(self, model_name: str, vocab_size: int) -> None:
        self.model_name = model_name
        # Draft ids must be below it (a proposer's draft ends before the first that is not).
        self.vocab_size = vocab_size
        # Running estimates: a plain step's time per row and token (s), and the extra time each drafted row
        # adds to a step.
        self.plain_s: float | None = None
        self.extra_s: float | None = None
        # The proposers asked at the last step (by id), told when none of their rows asks any more.
        self._asked: dict[int, object] = {}
        # Running mean of the drafts a verification kept (None: none yet), and batch steps since rows in a
        # batch last drafted while it was below what they need.
        self.kept: float | None = None
        self._unprobed_steps = 0
        # After a step without drafts: the fewest tokens before one of the rows asked could draft, where that is
        # at most QUIET_BURST (None otherwise); the scheduler ends a greedy burst there.
        self.quiet: int | None = None

    def verified(self, kept: int) -> None:
        """A verification kept `kept` drafts."""
        self.kept = kept if self.kept is None else self.kept + WEIGHT * (kept - self.kept)

    def timed(self, step_s: float, steps: int, rows: int, drafted_rows: int) -> None:
        """A scheduler step of `steps` lm steps (a greedy burst) over `rows` rows took step_s; drafted_rows of them
        had drafts."""
        rows = max(rows, 1)
        if drafted_rows == 0:
            per_token = step_s / max(steps, 1) / rows
            self.plain_s = per_token if self.plain_s is None else self.plain_s + WEIGHT * (per_token - self.plain_s)
        elif self.plain_s is not None:
            extra = max(0.0, step_s - self.plain_s * rows) / drafted_rows
            self.extra_s = extra if self.extra_s is None else self.extra_s + WEIGHT * (extra - self.extra_s)

    def _valid(self, token) -> bool:
        return 0 <= int(token) < self.vocab_size

    def needed(self) -> float:
        """Accepted tokens per verification that pay for a drafted row's extra time: what it adds to a step, in
        plain steps of one row."""
        if self.plain_s is None or self.extra_s is None or self.plain_s <= 0:
            return 0.0  # not measured yet: draft, and measure
        return self.extra_s / self.plain_s

    async def draft(self, rows: list, max_draft_tokens: int, context_length: int) -> int:
        """Give each eligible row of the next Decode its drafts (Sequence.drafts); how many rows got some."""
        asking: dict[int, tuple] = {}
        quiet: list[int | None] = []
        needed = self.needed()
        alone = sum(isinstance(row, Sequence) for row in rows) == 1
        debt = DEBT if alone else 0.0
        # In a batch, while verifications keep fewer drafts than they need, an adaptive row drafts only as a
        # probe now and then.
        probes = len(rows)
        if not alone and self.kept is not None and self.kept < needed:
            self._unprobed_steps += 1
            probes = 1 if self._unprobed_steps >= PROBE_EVERY else 0
            # Each probe starts at another row, so that one row whose text has no match does not stop them.
            turn = self._unprobed_steps % len(rows)
            rows = rows[turn:] + rows[:turn]
        for row in rows:
            if isinstance(row, Sequence):
                row.drafts = []
            if not eligible(row) or max_draft_tokens <= 0:
                continue
            spec = row.speculation
            if spec.speculation.adaptive:
                if probes == 0:
                    continue
                if len(row.generated) < spec.resume_at:
                    quiet.append(spec.resume_at - len(row.generated))
                    continue
                if spec.balance < -debt:
                    # Not worth it now: a pause, longer each time drafts have not paid since the last one; then
                    # the row drafts again with an even balance.
                    spec.resume_at = len(row.generated) + spec.pause
                    spec.pause = min(2 * spec.pause, MAX_PAUSE)
                    spec.balance = 0.0
                    quiet.append(spec.resume_at - len(row.generated))
                    continue
                spec.needed, spec.credit = needed, CREDIT if alone else 0.0
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
                (row, DraftRow(ids, room, spec.speculation.params, spec.state, self))
            )
            probes -= spec.speculation.adaptive
        for key, proposer in self._asked.items():
            if key not in asking:
                try:
                    proposer.idle(self)
                except Exception:
                    log.exception("proposer %s failed to free what it held", proposer.name)
        self._asked = {key: proposer for key, (proposer, _) in asking.items()}
        drafted = 0
        for proposer, entries in asking.values():
            proposals = await _proposals(proposer, [draft for _, draft in entries])
            for (row, draft), proposal in zip(entries, proposals, strict=True):
                tokens = [int(t) for t in itertools.takewhile(self._valid, list(proposal)[: draft.max_tokens])]
                if tokens:
                    row.drafts = tokens
                    drafted += 1
                else:
                    quiet.append(_quiet(proposer, draft))
        if drafted:
            self._unprobed_steps = 0
        soonest = min((q for q in quiet if q is not None), default=None)
        self.quiet = soonest if soonest is not None and soonest <= QUIET_BURST else None
        return drafted


async def _proposals(proposer, rows: list[DraftRow]) -> list:
    """The proposer's drafts for `rows`; none for any of them if it fails (the rows step one token at a time)."""
    try:
        proposals = proposer.propose(rows)
        if inspect.isawaitable(proposals):
            proposals = await proposals
        proposals = list(proposals)
        if len(proposals) != len(rows):
            raise ValueError(f"gave {len(proposals)} drafts for {len(rows)} rows")
        return proposals
    except Exception:
        log.exception("proposer %s failed; its rows step without drafts this time", proposer.name)
        return [()] * len(rows)


def _quiet(proposer, row: DraftRow) -> int | None:
    """The proposer's bound on the tokens the row takes before it could draft for it (None: none, or it failed)."""
    try:
        quiet = proposer.quiet(row)
        return None if quiet is None else max(1, int(quiet))
    except Exception:
        log.exception("proposer %s failed to bound its next draft", proposer.name)
        return None


def eligible(row) -> bool:
    """Whether a row may draft: a running completion with a proposer and no constraint, whose pending token is all
    it feeds next and whose output the lm can give per position."""
    return (
        isinstance(row, Sequence)
        and row.speculation is not None
        and not row.finished
        and not row.in_flight
        and not row.queued
        and row.pending_token is not None
        and row.sampling.constraint is None
        and row.sampling.output_kind in (lm_pb2.ARGMAX, lm_pb2.LOGITS)
    )


def count(row: Sequence, drafted: int, accepted: int, model_name: str) -> None:
    """Record a verification's verdict on the row and in the metrics."""
    row.speculation.verified(drafted, accepted)
    proposer = row.speculation.speculation.proposer.name
    metrics.SPEC_DRAFTS.labels(model_name, proposer).inc()
    metrics.SPEC_DRAFT_TOKENS.labels(model_name, proposer).inc(drafted)
    metrics.SPEC_ACCEPTED_TOKENS.labels(model_name, proposer).inc(accepted)

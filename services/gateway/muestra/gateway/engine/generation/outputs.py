"""What a step's output does to the rows: the tokens they take, and the rules that end them.

A row takes a token from its sampler chain (or the lm's argmax), from a greedy burst, or from its
grammar when that allows one token only (fast-forward: taken at once, fed to the lm later). Each taken
token is streamed, advances the row's constraint, and may end the row:
- EOS (unless ignore_eos) or one of the request's stop_token_ids: STOP, and the id is not shown as text;
- its constraint complete: STOP; its constraint broken or at a dead end: ERROR;
- max_tokens generated, or the context length reached: LENGTH.
Stop strings end rows later, once the text is known (Detokenizer). A beam group streams its n best
hypotheses when its search is done.
"""

from __future__ import annotations

import time
from collections.abc import Collection
from typing import Protocol

import numpy as np

from muestra.gateway import metrics
from muestra.gateway.engine.constraints.engine import fill_masks
from muestra.gateway.engine.generation.batch import Row, groups
from muestra.gateway.engine.generation.request import BeamGroup, Sequence
from muestra.gateway.engine.generation.speculation import count
from muestra.gateway.engine.sampling import StepResult, sample_next_tokens
from muestra.v1 import gateway_pb2, lm_pb2

# Forced tokens a row may take ahead of the lm.
MAX_QUEUED = 16


class ModelLimits(Protocol):
    name: str
    eos_token_ids: tuple[int, ...]
    tokenizer_vocab_size: int
    context_length: int


class OutputProcessor:
    def __init__(self, model: ModelLimits) -> None:
        self.model = model

    def accept(
        self,
        rows: list[Row],
        logits: np.ndarray | None,
        index: list[int],
        argmax: list[int],
        taken: Collection[int] = (),
    ) -> list[BeamGroup]:
        """Pick every row's next token (samplers, or the beam search) and apply the finish rules; the beam
        groups whose search is done (to be finished with `finish_beams` once their text is known). The rows at
        the positions in `taken` have their tokens already (the lm picked them: accept_burst)."""
        # Rows whose drafts were verified take their tokens in accept_verified.
        taken = set(taken)
        positions = [
            i
            for i, row in enumerate(rows)
            if isinstance(row, Sequence) and not row.in_flight and not row.drafts and i not in taken
        ]
        if positions:
            chosen = [rows[i] for i in positions]
            result = sample_next_tokens(
                [row.sampling for row in chosen], logits, [index[i] for i in positions], [argmax[i] for i in positions]
            )
            now = time.monotonic()
            for k, row in enumerate(chosen):
                self._take_sampled(row, result, k, now)
            next_masks(chosen)
            self.fast_forward(chosen, now)
        done = []
        for group, where in groups(rows).items():
            group.pending = group.search.step(logits[[index[p] for p in where]])
            if group.search.done:
                done.append(group)
        return done

    def accept_burst(self, rows: list[Row], outputs) -> None:
        """Take each row's tokens of a burst (RowOutput.greedy_ids: argmaxes, or a sampled row's picks), in order,
        until the row finishes (the lm ran them all: tokens after a row's end are dropped, and the row leaves the
        batch next step). A sampled row goes on from the generator and sampler state the lm left it in, or ends
        with its chain's error."""
        now = time.monotonic()
        for row, out in zip(rows, outputs, strict=True):
            for token in out.greedy_ids:
                if row.finished:
                    break
                row.pending_token = None  # the lm fed every token of the burst but the last
                row.sampling.context.append(token)
                self.take_token(row, token, now)
            if out.sampler_error and not row.finished:
                row.finish(gateway_pb2.ERROR)
                row.error = out.sampler_error
            elif out.rng_json:
                row.sampling.went_on_in_lm(out.rng_json, out.state_json)

    def accept_verified(self, rows: list[Row], outputs, logits: np.ndarray | None) -> list[int]:
        """Take the tokens of the rows whose drafts this step verified (speculation.py): a greedy row's accepted
        drafts and the argmax after them (the lm compared them), or, for a sampled row, what its chain picks at
        each position in order while that is the draft, then the chain's own token. How many drafts each
        verification kept."""
        now = time.monotonic()
        kept = []
        for row, out in zip(rows, outputs, strict=True):
            if not isinstance(row, Sequence):
                continue
            if not row.drafts:
                continue
            drafts, row.drafts = row.drafts, []
            if row.finished:  # a stop string matched while this step ran; the row leaves next step
                continue
            if row.sampling.output_kind == lm_pb2.ARGMAX:
                accepted = min(out.accepted_drafts, len(drafts))
                for token in [*drafts[:accepted], out.argmax]:
                    if row.finished:
                        break
                    row.pending_token = None  # the lm holds every accepted draft
                    row.sampling.context.append(token)
                    self.take_token(row, token, now)
            else:
                accepted = self._judge(row, drafts, logits, out.logits_row, now)
                row.rollback = len(drafts) - accepted
            count(row, len(drafts), accepted, self.model.name)
            kept.append(accepted)
        return kept

    def _judge(self, row: Sequence, drafts: list[int], logits: np.ndarray, first: int, now: float) -> int:
        """Run the row's chain on the verified positions in order; how many drafts it picked before its first
        other token (which it takes instead, as one step at a time would)."""
        accepted = 0
        for position in range(len(drafts) + 1):
            row.pending_token = None  # the lm holds every token fed so far
            result = sample_next_tokens([row.sampling], logits, [first + position])
            self._take_sampled(row, result, 0, now)
            if position == len(drafts) or result.errors[0] is not None or int(result.token_ids[0]) != drafts[position]:
                break
            accepted += 1
            if row.finished:
                break
        return accepted

    def fast_forward(self, rows: list[Sequence], now: float) -> None:
        """Take every token a row's grammar forces (the only one it allows) right away, without sampling; they
        are fed to the lm later, several in one step when the batch allows (step_policy.tokens_per_row)."""
        for row in rows:
            while not row.finished and row.sampling.forced_token is not None and len(row.queued) < MAX_QUEUED:
                token = row.sampling.forced_token
                row.sampling.context.append(token)
                self.take_token(row, token, now)
                next_masks([row])

    def _take_sampled(self, row: Sequence, result: StepResult, k: int, now: float) -> None:
        if row.finished:  # a stop string matched while this step ran; the row leaves next step
            return
        if result.errors[k] is not None:
            row.finish(gateway_pb2.ERROR)
            row.error = result.errors[k]
            return
        self.take_token(row, int(result.token_ids[k]), now)
        if row.request.logprobs:
            row.unsent_logprobs.append(token_logprob(row.generated[-1], result, k))

    def take_token(self, row: Sequence, token: int, now: float) -> None:
        """Append a chosen token to a row: stream it, advance its constraint, and apply the finish rules."""
        request = row.request
        row.generated.append(token)
        if row.first_token_at is None:
            row.first_token_at = now
            metrics.TIME_TO_FIRST_TOKEN.labels(self.model.name).observe(now - request.arrival)
        else:
            metrics.INTER_TOKEN_LATENCY.labels(self.model.name).observe(now - row.last_token_at)
        row.last_token_at = now
        row.unsent_ids.append(token)
        constraint = row.sampling.constraint
        if constraint is not None and not constraint.consume(token):
            row.finish(gateway_pb2.ERROR)
            row.error = constraint.error
            return
        if not request.ignore_eos and token in self.model.eos_token_ids:
            row.finish(gateway_pb2.STOP, f"eos:{token}")
        elif token in request.stop_token_ids:
            row.finish(gateway_pb2.STOP, f"token:{token}")
        else:
            if token < self.model.tokenizer_vocab_size:
                row.detok.append(token)
            if row.pending_token is None:
                row.pending_token = token
            else:
                row.queued.append(token)
            if constraint is not None and constraint.complete:
                row.finish(gateway_pb2.STOP, "constraint")
        if not row.finished and (
            len(row.generated) >= request.max_tokens
            or len(request.prompt_ids) + len(row.generated) >= self.model.context_length
        ):
            row.finish(gateway_pb2.LENGTH)

    def finish_beams(self, group: BeamGroup, hypotheses: list, texts: list[str]) -> None:
        """A finished search: stream its best hypotheses (with their texts) as the n completions."""
        now = time.monotonic()
        for sequence, hypothesis, text in zip(group.sequences, hypotheses, texts, strict=False):
            sequence.generated = list(hypothesis.token_ids)
            sequence.unsent_ids = list(hypothesis.token_ids)
            sequence.first_token_at = sequence.first_token_at or now
            ends_with_eos = bool(hypothesis.token_ids) and hypothesis.token_ids[-1] in self.model.eos_token_ids
            out = sequence.stops.feed(text)
            if sequence.stops.matched is not None:
                sequence.finish(gateway_pb2.STOP, sequence.stops.matched)
            else:
                out += sequence.stops.flush()
                sequence.finish(gateway_pb2.STOP if ends_with_eos else gateway_pb2.LENGTH)
            sequence.emit_text(out)
            sequence.emit_done()
        for sequence in group.sequences[len(hypotheses) :]:
            sequence.emit_done(error="beam search produced fewer hypotheses than n")


def token_logprob(token: int, result: StepResult, k: int) -> gateway_pb2.TokenLogprob:
    """Row k's chosen token with its logprob and the top alternatives, as a step's result gives them."""
    top_ids = result.top_ids[k] if result.top_ids[k] is not None else ()
    top_logprobs = result.top_logprobs[k] if result.top_ids[k] is not None else ()
    top = [
        gateway_pb2.TopLogprob(token_id=int(t), logprob=float(lp)) for t, lp in zip(top_ids, top_logprobs, strict=True)
    ]
    return gateway_pb2.TokenLogprob(token_id=token, logprob=float(result.logprobs[k]), top=top)


def next_masks(rows: list[Sequence]) -> None:
    """Compute the next allowed tokens of the constrained rows still running; a dead end ends its row."""
    running = [row for row in rows if row.sampling.constraint is not None and not row.finished]
    # Within the context (max_tokens is at most what it leaves); a request without JSON endings never gets near.
    far = 2**31
    tokens_left = [row.request.max_tokens - len(row.generated) if row.request.json_endings else far for row in running]
    fill_masks([row.sampling.constraint for row in running], tokens_left, [row.request.max_tokens for row in running])
    for row in running:
        if row.sampling.constraint.error:
            row.finish(gateway_pb2.ERROR)
            row.error = row.sampling.constraint.error

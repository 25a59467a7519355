"""How the next Decode runs: how many tokens each row feeds, whether the lm may run a burst and how long,
which ids end one, and the running estimate of a step's time that bounds it.

When every row is greedy (the lm's argmax) or sampled with a chain the lm runs itself (a sampled burst:
DecodeBatch.samplers), none has a constraint or stop strings, and nobody waits, one Decode runs several
steps (DecodeRequest.greedy_steps): the lm feeds each pick back itself, as vLLM's multi-step scheduling
does. A burst is at most --greedy-burst steps and about --greedy-burst-ms long, so a request that arrives
meanwhile waits no longer than that for its prefill.
"""

from __future__ import annotations

import collections

from muestra.gateway.engine.generation.batch import Row, requests
from muestra.gateway.engine.generation.request import Sequence
from muestra.v1 import lm_pb2

# Most tokens one row feeds in one step (the lm's default --max-tokens-per-row is 32).
MAX_TOKENS_PER_STEP = 16
# Most stop ids one Decode lists (the lm's limit); with more, a burst runs its full length.
MAX_STOP_IDS = 1024
# Weight of the newest step in the running estimate of a replica's time per step.
STEP_TIME_WEIGHT = 0.2
# --row-invariant: which requests' Decodes ask the lm for bits independent of the batch.
ROW_INVARIANT = ("seeded", "all", "off")


def tokens_per_row(rows: list[Row]) -> int:
    """How many tokens every row can feed in one step: more than one only for a lone row with tokens queued
    (onnxruntime's fused attention takes several new tokens after a past only for a batch of one)."""
    if len(rows) != 1 or not isinstance(rows[0], Sequence):
        return 1
    return min(1 + len(rows[0].queued), MAX_TOKENS_PER_STEP)


def bursts(row: Row, runnable: frozenset[tuple[str, str, str]] = frozenset()) -> bool:
    """Whether the lm may pick this row's next tokens itself, several steps in a row: a row that has no
    constraint, feeds one token, has no stop strings (text, not ids, would end it somewhere inside the
    burst, and the tokens after that point would still count as generated), and is greedy (ships no logits)
    or sampled with a chain of `runnable` samplers (the lm's, DescribeModelResponse.samplers)."""
    return (
        isinstance(row, Sequence)
        and not row.in_flight
        and not row.queued
        and row.sampling.constraint is None
        and not row.request.stop
        and (row.sampling.output_kind == lm_pb2.ARGMAX or sampled_in_lm(row, runnable))
    )


def sampled_in_lm(row: Row, runnable: frozenset[tuple[str, str, str]]) -> bool:
    """Whether the lm picks this row's tokens with its chain when it runs a burst (DecodeBatch.samplers)."""
    return isinstance(row, Sequence) and bool(runnable) and row.sampling.runs_in_lm(runnable)


def picked_in_lm(rows: list[Row], runnable: frozenset[tuple[str, str, str]]) -> set[int]:
    """The rows (by id) whose next token the lm picks with their own chains (DecodeBatch.samplers), in a burst or
    in a step of its own: sampled rows whose chain it runs, that feed one token (none queued or in flight), and
    whose generator no other row of the step shares (rows sharing one draw in turn: only one place may hold it).
    Such a row ships no logits; the others of the step are picked here as before."""
    if not runnable:
        return set()
    generators = collections.Counter(id(row.sampling.context.rng) for row in rows if isinstance(row, Sequence))
    return {
        id(row)
        for row in rows
        if isinstance(row, Sequence)
        and not row.in_flight
        and not row.queued
        and generators[id(row.sampling.context.rng)] == 1
        and sampled_in_lm(row, runnable)
    }


def wants_row_invariance(mode: str, seeded: bool, chain) -> bool:
    """Whether a request's tokens must not depend on its batch (--row-invariant): under `seeded`,
    a sampled request that gave a seed (an argmax chain's token moves only at an exact near-tie); under `all`,
    every request."""
    if mode == "all":
        return True
    return mode == "seeded" and seeded and not (chain.is_search or chain.argmax_only)


def row_invariant(rows: list[Row]) -> bool:
    """DecodeRequest.row_invariant for a step of these rows: whether a step that runs one of them alone must
    still give it the bits it gets in any batch (the lm's one-row kernels round otherwise; ~1.7x that step).
    Steps of several rows are row-invariant anyway, so this is only ever a lone request's cost."""
    return any(request.row_invariant for request in requests(rows))


def stop_ids(rows: list[Sequence], eos: tuple[int, ...]) -> list[int]:
    """Ids after which rows end (EOS unless ignored, stop_token_ids): the lm ends a burst once all rows met one."""
    ids: set[int] = set()
    for request in requests(rows):
        ids |= request.stop_token_ids
        if not request.ignore_eos:
            ids.update(eos)
    return sorted(ids) if len(ids) <= MAX_STOP_IDS else []


class StepPolicy:
    """The burst length of a replica's next Decode, from its limits and its measured step time."""

    def __init__(self, greedy_burst: int, greedy_burst_ms: float, context_length: int) -> None:
        self.greedy_burst = greedy_burst
        self.greedy_burst_s = greedy_burst_ms / 1000
        self.context_length = context_length
        # Running estimate of one decode step's time (None until a step was timed).
        self.step_s: float | None = None

    def burst(
        self,
        rows: list[Row],
        max_greedy_steps: int,
        joinable: bool,
        runnable: frozenset[tuple[str, str, str]] = frozenset(),
    ) -> int:
        """Steps for the next Decode: 1 unless every row may burst and no request could join now."""
        burst = min(self.greedy_burst, max_greedy_steps)
        if burst <= 1 or joinable or self.step_s is None or not all(bursts(row, runnable) for row in rows):
            return 1
        generators = [id(row.sampling.context.rng) for row in rows if sampled_in_lm(row, runnable)]
        if len(set(generators)) < len(generators):
            return 1  # rows that share a generator draw in turn: only one place may hold it
        if self.step_s > 0:
            burst = min(burst, int(self.greedy_burst_s / self.step_s))
        # No row may pass the context length (its KV holds its prompt and all but its pending token), and
        # steps past the longest remaining max_tokens would only be dropped.
        room = min(self.context_length - len(row.request.prompt_ids) - len(row.generated) for row in rows)
        wanted = max(row.request.max_tokens - len(row.generated) for row in rows)
        return max(1, min(burst, room, wanted))

    def timed(self, total_us: int, steps: int) -> None:
        """A Decode of `steps` steps took the lm `total_us`."""
        if total_us and steps:
            step_s = total_us / 1e6 / steps
            self.step_s = step_s if self.step_s is None else self.step_s + STEP_TIME_WEIGHT * (step_s - self.step_s)

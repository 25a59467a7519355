"""The per-token hot path: run each row's sampler chain over a batch of logits.

Rows whose chains have the same samplers in the same order are processed together (each
with its own params); registered objects are called directly, never through pluggy.
Logprobs are computed from the final processed distribution, the one the selector draws
from (log_softmax of the scores after every processor; OpenAI's and vLLM's
"processed_logprobs"): a token a processor removed has logprob -inf and is never listed
in the top alternatives.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Sequence

import numpy as np

from muestra.gateway.engine.constraints.masks import apply_mask
from muestra.gateway.engine.sampling.chain import Chain
from muestra.plugin import RowContext, group_rows, log_softmax, pick_tokens
from muestra.runtime.errors import InvalidArgument, check_limit
from muestra.v1 import lm_pb2

log = logging.getLogger("muestra.samplers")
MAX_TOP_LOGPROBS = 20


@dataclasses.dataclass
class SamplingRow:
    """One sequence being generated: its chain (with its params) and its context."""

    chain: Chain
    context: RowContext
    logprobs: bool = False
    top_logprobs: int = 0
    # The row's output constraint (a RowConstraint), and whether the lm applies its mask.
    constraint: object = None
    mask_in_lm: bool = True

    @property
    def forced_token(self) -> int | None:
        """The next token, when the constraint allows only one and no logprobs are wanted (no sampling)."""
        if self.constraint is None or self.logprobs:
            return None
        return self.constraint.forced

    def runs_in_lm(self, runnable: frozenset[tuple[str, str, str]]) -> bool:
        """Whether an lm that runs these samplers (DescribeModelResponse.samplers) may pick this row's tokens
        itself (a sampled burst): a sampled row whose chain it runs, with no logprobs and no constraint, whose
        generator is numpy's PCG64 and whose sampler state JSON can carry."""
        return (
            self.output_kind == lm_pb2.LOGITS
            and self.constraint is None
            and not self.logprobs
            and self.chain.lm_json is not None
            and self.chain.sources <= runnable
            and type(self.context.rng.bit_generator) is np.random.PCG64
            and _json_state(self.context.state) is not None
        )

    def lm_sampler(self) -> lm_pb2.RowSampler:
        """The row as an lm picks its tokens (DecodeBatch.samplers): chain, generator, state and ids."""
        return lm_pb2.RowSampler(
            chain_json=self.chain.lm_json,
            rng_json=json.dumps(self.context.rng.bit_generator.state),
            state_json=_json_state(self.context.state) or "",
            prompt_ids=self.context.prompt_ids.tolist(),
            output_ids=self.context.output_ids.tolist(),
        )

    def went_on_in_lm(self, rng_json: str, state_json: str) -> None:
        """Take the generator and sampler state an lm left the row in after picking for it."""
        self.context.rng.bit_generator.state = json.loads(rng_json)
        self.context.state = json.loads(state_json) if state_json else {}

    @property
    def output_kind(self) -> int:
        """What the lm service must return for this row: lm_pb2.ARGMAX or lm_pb2.LOGITS."""
        if self.forced_token is not None:
            return lm_pb2.ARGMAX
        if self.constraint is not None and not self.mask_in_lm:
            return lm_pb2.LOGITS
        if self.chain.argmax_only and not self.logprobs and not self.chain.is_search:
            return lm_pb2.ARGMAX
        return lm_pb2.LOGITS


def _json_state(state: dict) -> str | None:
    """A row's sampler state as JSON ("{}" for none), or None when JSON cannot carry it."""
    try:
        return json.dumps(state) if state else "{}"
    except (TypeError, ValueError):
        return None


def request_generators(seed: int, n: int = 1) -> list[np.random.Generator]:
    """The request's generators: default_rng(seed) for one completion; for n, n independent
    streams spawned from the seed, so no completion's draws depend on another's."""
    if n == 1:
        return [np.random.default_rng(seed)]
    return [np.random.default_rng(child) for child in np.random.SeedSequence(seed).spawn(n)]


def new_rows(
    chain: Chain,
    prompt_ids: Sequence[int],
    seed: int,
    n: int = 1,
    logprobs: bool = False,
    top_logprobs: int = 0,
    constraint=None,
    mask_in_lm: bool = True,
) -> list[SamplingRow]:
    """The n rows of a request that picks tokens row by row (search strategies use SearchRequest).

    `constraint` (a CompiledConstraint) gives each row its own place in the grammar."""
    if chain.is_search:
        raise ValueError(f"{chain.last.sampler.name} is a search strategy: drive it with SearchRequest")
    check_limit("top_logprobs", top_logprobs, 0, MAX_TOP_LOGPROBS)
    if top_logprobs and not logprobs:
        raise InvalidArgument("top_logprobs", "needs logprobs to be true")
    return [
        SamplingRow(
            chain,
            RowContext(prompt_ids, rng),
            logprobs,
            top_logprobs,
            constraint.new_row() if constraint is not None else None,
            mask_in_lm,
        )
        for rng in request_generators(seed, n)
    ]


@dataclasses.dataclass
class StepResult:
    """Per row: the chosen token, its logprob and the top alternatives (when asked), or an error."""

    token_ids: np.ndarray  # int64 [rows]; -1 for a row with an error
    logprobs: np.ndarray  # float32 [rows]; NaN where not asked for
    top_ids: list[np.ndarray | None]
    top_logprobs: list[np.ndarray | None]
    # A message for each row whose chain failed (its request should end with an error).
    errors: list[str | None]

    @classmethod
    def empty(cls, rows: int) -> StepResult:
        return cls(
            np.full(rows, -1, dtype=np.int64),
            np.full(rows, np.nan, dtype=np.float32),
            [None] * rows,
            [None] * rows,
            [None] * rows,
        )


def sample_next_tokens(
    rows: Sequence[SamplingRow],
    logits: np.ndarray | None,
    logits_row: Sequence[int] | None = None,
    argmax: Sequence[int] | None = None,
) -> StepResult:
    """Pick every row's next token and append it to the row's context.

    Shaped like the lm service's BatchOutput: `logits` holds the rows that asked for LOGITS,
    row i's at logits_row[i] (-1 for an ARGMAX row, whose token is argmax[i]). Without
    logits_row, logits has one row per row.
    """
    result = StepResult.empty(len(rows))
    if logits_row is None:
        logits_row = range(len(rows))
    with_logits = []
    for i, row in enumerate(rows):
        if row.forced_token is not None:  # the constraint allows one token: no sampling
            result.token_ids[i] = row.forced_token
        elif logits_row[i] >= 0:
            with_logits.append(i)
        elif row.output_kind == lm_pb2.ARGMAX and argmax is not None:
            result.token_ids[i] = argmax[i]
        else:
            result.errors[i] = "internal: the lm service returned no logits for a row that needs them"
    for _, members in group_rows([rows[i].chain.shape for i in with_logits]):
        index = [with_logits[m] for m in members]
        saved = [rows[i].context.snapshot() for i in index]
        try:
            _run_chain(rows, index, logits, logits_row, result)
        except Exception:  # noqa: BLE001 - retried row by row below, where it is logged
            # Isolate the failing rows: the others of the group still get their tokens, the same ones
            # (their generators and sampler state are put back as they were before the failed try).
            for i, snapshot in zip(index, saved, strict=True):
                rows[i].context.restore(snapshot)
            for i in index:
                try:
                    _run_chain(rows, [i], logits, logits_row, result)
                except Exception as exc:
                    log.exception("sampler chain %s failed", [step.sampler.name for step in rows[i].chain.steps])
                    result.token_ids[i] = -1
                    result.errors[i] = f"sampler chain failed: {exc}"
    for i, row in enumerate(rows):
        if result.errors[i] is None:
            row.context.append(int(result.token_ids[i]))
    return result


def _run_chain(rows, index: list[int], logits: np.ndarray, logits_row, result: StepResult) -> None:
    chain = rows[index[0]].chain
    contexts = [rows[i].context for i in index]
    scores = np.array(logits[[logits_row[i] for i in index]], dtype=np.float32)
    for k, i in enumerate(index):
        if rows[i].constraint is not None and not rows[i].mask_in_lm:
            apply_mask(scores[k], rows[i].constraint.mask)
    params = [[rows[i].chain.steps[position].params for i in index] for position in range(len(chain.steps))]
    tokens, scores = pick_tokens([step.sampler for step in chain.steps], params, scores, contexts)
    result.token_ids[index] = tokens
    wanted = [k for k, i in enumerate(index) if rows[i].logprobs]
    if not wanted:
        return
    logprobs = log_softmax(scores[wanted])
    for k, row_logprobs in zip(wanted, logprobs, strict=True):
        i = index[k]
        result.logprobs[i] = row_logprobs[tokens[k]]
        top_n = min(rows[i].top_logprobs, row_logprobs.shape[-1])
        if top_n:
            top = np.argpartition(-row_logprobs, top_n - 1)[:top_n]
            top = top[np.argsort(-row_logprobs[top], kind="stable")]
            top = top[np.isfinite(row_logprobs[top])]
            result.top_ids[i] = top
            result.top_logprobs[i] = row_logprobs[top]

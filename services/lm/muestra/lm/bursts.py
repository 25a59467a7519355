"""Bursts: several steps in one Decode, each row's pick (its argmax, or its sampler chain's token) fed back."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from muestra.lm import metrics
from muestra.lm.batch import Batch, OutputSpec
from muestra.lm.model import OnnxDecoder
from muestra.lm.sampling import SampledRow, pick
from muestra.runtime.errors import InvalidArgument
from muestra.v1 import lm_pb2


def check_burst_rows(
    greedy_steps: int, specs: list[OutputSpec], allowed: list[bytes] | None, sampled: list[SampledRow | None] | None
) -> None:
    """Rows of a burst (greedy steps, or sampled rows) take no masks, and want ARGMAX unless a chain picks for them."""
    field = "greedy_steps" if greedy_steps > 1 else "samplers"
    if allowed is not None and any(allowed):
        raise InvalidArgument(field, "rows with allowed_tokens masks take one step per call, with no samplers")
    wrong = next(
        (r for r, (kind, _) in enumerate(specs) if kind != lm_pb2.ARGMAX and (not sampled or not sampled[r])),
        None,
    )
    if greedy_steps > 1 and wrong is not None:
        raise InvalidArgument(
            "greedy_steps", f"every row must want ARGMAX outputs or have a sampler chain; row {wrong} does not"
        )


def burst(
    decoder: OnnxDecoder,
    batch: Batch,
    next_ids: np.ndarray,
    steps: int,
    stop_ids: Sequence[int],
    sampled: list[SampledRow | None] | None,
    prefill_waiting: Callable[[], bool],
    lost: Callable[[], None],
) -> tuple[np.ndarray, int, np.ndarray, list[str | None] | None]:
    """Step `batch` up to `steps` times, feeding each row's pick back (its argmax, or its chain's token); the
    last logits, µs, each row's picks, and each row's chain error. A chain that fails ends the call there.

    A step that fails after the first calls `lost` before it raises: the batch has moved on past what its caller
    knows, and cannot be stepped again."""
    stops = np.asarray(sorted(set(stop_ids)), dtype=np.int64)
    stopped = np.zeros(batch.rows, dtype=bool)
    taken: list[np.ndarray] = []
    forward_us = 0
    errors = None
    for step in range(steps):
        try:
            logits, us = batch.step(decoder, next_ids)
        except Exception:
            if step:
                lost()
            raise
        forward_us += us
        batch.suppress(logits)  # bursts take no allowed-token masks
        next_ids = logits.argmax(axis=-1)
        if sampled is not None:
            picks, errors = pick(sampled, logits)
            metrics.SAMPLED_TOKENS.inc(int(np.count_nonzero(picks >= 0)))
            next_ids = np.where(picks >= 0, picks, next_ids)
        taken.append(next_ids)
        if errors is not None and any(errors):
            break  # the failing rows end here; their callers get the error
        if stops.size:
            stopped |= np.isin(next_ids, stops)
            if stopped.all():
                break
        if prefill_waiting():
            break  # a prompt waits for the model thread: it goes after this step, not after the whole burst
        next_ids = next_ids[:, None]
    return logits, forward_us, np.stack(taken, axis=1), errors

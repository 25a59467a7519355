"""Draft tokens: whether a graph can verify them, a Decode's drafts and rollbacks checked, the verification step."""

from __future__ import annotations

import numpy as np

from muestra.lm.batch import Batch, OutputSpec
from muestra.lm.engine_io import DecodeInput, StepResult
from muestra.lm.lanes import Lanes
from muestra.lm.model import OnnxDecoder
from muestra.runtime.errors import InvalidArgument
from muestra.v1 import lm_pb2


def why_drafts_are_refused(decoder: OnnxDecoder) -> str:
    """Why this graph cannot verify drafts as one token at a time would, or "" when it can."""
    if not decoder.multi_position_logits:
        return (
            "this model's graph gives only its last position's logits, so it cannot verify drafts "
            "(max_draft_tokens 0; export it again with muestra export-lm)"
        )
    if decoder.int8_before_kv:
        return (
            f"this graph quantizes activations to int8 before its KV ({decoder.int8_before_kv}), so a drafted "
            "position's KV would differ from a one-token step's; drafts are refused (max_draft_tokens 0)"
        )
    return ""


def draft_counts(item: DecodeInput, batch: Batch) -> np.ndarray:
    if item.drafts is None:
        return np.zeros(batch.rows, dtype=np.int64)
    return np.array([d.size for d in item.drafts], dtype=np.int64)


def check_rollback(i: int, item: DecodeInput, batch: Batch) -> np.ndarray:
    """The tokens each row drops before the step (item.rollback, checked), or zeros."""
    if item.rollback is None:
        return np.zeros(batch.rows, dtype=np.int64)
    if item.rollback.size != batch.rows:
        raise InvalidArgument(
            f"batches[{i}].rollback", f"got {item.rollback.size} counts for a batch of {batch.rows} rows"
        )
    over = np.flatnonzero(item.rollback >= batch.lengths)
    if over.size:
        row = int(over[0])
        raise InvalidArgument(
            f"batches[{i}].rollback[{row}]",
            f"row {row} holds {int(batch.lengths[row])} tokens; it cannot drop {int(item.rollback[row])}",
        )
    return item.rollback


def check_draft_rows(drafts: list[np.ndarray], specs: list[OutputSpec], allowed) -> None:
    for row, draft in enumerate(drafts):
        if not draft.size:
            continue
        if specs[row][0] == lm_pb2.TOP_N:
            raise InvalidArgument("draft_lengths", f"row {row} has drafts and wants TOP_N output (LOGITS or ARGMAX)")
        if allowed is not None and allowed[row]:
            raise InvalidArgument("draft_lengths", f"row {row} has drafts and an allowed_tokens mask")


def rolled_back(decoder: OnnxDecoder, item: DecodeInput, batch: Batch | Lanes) -> Batch | Lanes:
    """The batch without the tokens its caller rejected: a copy (the original stays until the step succeeded)."""
    if item.rollback is None or not item.rollback.any():
        return batch
    return batch.rolled_back_copy(decoder, item.rollback)


def verify(
    decoder: OnnxDecoder, batch: Batch, next_ids: np.ndarray, drafts: list[np.ndarray], specs, allowed
) -> StepResult:
    """One verification step: ARGMAX rows accept their drafts here and drop the rest from the KV; LOGITS
    rows get every position's logits and keep every draft until their caller's rollback."""
    per_row, forward_us = batch.verify(decoder, next_ids, drafts)
    last = np.empty((batch.rows, decoder.info.vocab_size), dtype=np.float32)
    draft_logits: list[np.ndarray | None] = [None] * batch.rows
    accepted: list[int | None] = [None] * batch.rows
    drop = np.zeros(batch.rows, dtype=np.int64)
    for row, logits in enumerate(per_row):
        if allowed is None or not allowed[row]:  # a step's mask decides alone for its row
            batch.suppress_row(logits, row)
        draft = drafts[row]
        if not draft.size:
            last[row] = logits[0]
        elif specs[row][0] == lm_pb2.ARGMAX:
            picked = logits.argmax(axis=-1)
            matches = picked[:-1] == draft
            taken = int(draft.size if matches.all() else np.argmin(matches))
            accepted[row] = taken
            drop[row] = draft.size - taken
            last[row] = logits[taken]
        else:
            last[row], draft_logits[row] = logits[0], logits[1:]
    batch.rollback(decoder, drop)
    drafted = [int(d.size) for d in drafts]
    return StepResult("", last, specs, forward_us, allowed, None, draft_logits, accepted, drafted)

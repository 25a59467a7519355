"""Per-row results of a step, as each row's OutputSpec asks: full logits, top-n, or the argmax only."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from muestra.lm.batch import OutputSpec
from muestra.v1 import common_pb2, lm_pb2

_FULL = (lm_pb2.OUTPUT_KIND_UNSPECIFIED, lm_pb2.LOGITS)


def top_n(row: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """The n largest logits of a row and their ids, by descending logit (ties: lower id first)."""
    n = min(n, row.shape[0])
    candidates = np.argpartition(-row, n - 1)[:n] if n < row.shape[0] else np.arange(row.shape[0])
    order = np.lexsort((candidates, -row[candidates]))
    ids = candidates[order]
    return ids, row[ids]


def logsumexp(rows: np.ndarray) -> np.ndarray:
    """log(sum(exp(row))) of each row, computed stably."""
    peak = rows.max(axis=-1, keepdims=True)
    return (peak + np.log(np.exp(rows - peak).sum(axis=-1, keepdims=True)))[..., 0]


def apply_allowed(logits: np.ndarray, allowed: Sequence[bytes]) -> np.ndarray:
    """The logits with -inf for every token a row's bitmask leaves out (rows with b"" unchanged)."""
    logits = np.array(logits, dtype=np.float32)  # the session's output buffer is not ours to change
    vocab = logits.shape[-1]
    for i, mask in enumerate(allowed):
        if mask:
            bits = np.unpackbits(
                np.frombuffer(mask, dtype=np.uint8), count=min(vocab, 8 * len(mask)), bitorder="little"
            )
            row = logits[i]
            row[: bits.size][bits == 0] = -np.inf
            row[bits.size :] = -np.inf
    return logits


def batch_output(
    logits: np.ndarray,
    specs: Sequence[OutputSpec],
    allowed: Sequence[bytes] | None = None,
    greedy_ids: np.ndarray | None = None,
    draft_logits: Sequence[np.ndarray | None] | None = None,
    accepted: Sequence[int | None] | None = None,
) -> lm_pb2.BatchOutput:
    """Pack a step's last-position logits (float32 [rows, vocab]) per row spec; argmax is always set.

    Rows with an allowed-token bitmask are masked first, so their argmax, top-n and logits all see
    only the allowed tokens. `greedy_ids` ([rows, steps], a burst's picks) go to each row's greedy_ids.
    A LOGITS row with `draft_logits` ships them right after its own row (RowOutput.positions); an ARGMAX
    row's `accepted` count goes to its accepted_drafts."""
    if allowed is not None and any(allowed):
        logits = apply_allowed(logits, allowed)
    argmax = logits.argmax(axis=-1)
    full = [i for i, (kind, _) in enumerate(specs) if kind in _FULL]
    extra = draft_logits or [None] * len(specs)
    out = lm_pb2.BatchOutput()
    logits_row: dict[int, int] = {}
    if full:
        parts, at = [], 0
        for i in full:
            logits_row[i] = at
            parts.append(logits[i : i + 1])
            at += 1
            if extra[i] is not None:
                parts.append(extra[i])
                at += len(extra[i])
        packed = logits if at == len(full) == len(specs) else np.concatenate(parts)
        out.logits.CopyFrom(
            common_pb2.Tensor(
                dtype=common_pb2.FLOAT32,
                shape=[at, logits.shape[-1]],
                data=np.ascontiguousarray(packed, dtype="<f4").tobytes(),
            )
        )
    for i, (kind, n) in enumerate(specs):
        row = out.rows.add(logits_row=logits_row.get(i, -1), argmax=int(argmax[i]))
        if extra[i] is not None and i in logits_row:
            row.positions = 1 + len(extra[i])
        if accepted is not None and accepted[i] is not None:
            row.accepted_drafts = accepted[i]
        if greedy_ids is not None:
            row.greedy_ids.extend(greedy_ids[i].tolist())
        if kind == lm_pb2.TOP_N:
            ids, values = top_n(logits[i], n)
            row.top_ids.extend(ids.tolist())
            row.top_logits.extend(values.tolist())
            row.logsumexp = float(logsumexp(logits[i]))
    return out

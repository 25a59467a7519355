"""What a request may ask of the lm (its flags and its model's sizes), and the checks of its fields against that."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from muestra.lm.batch import NO_IDS, Batch, OutputSpec
from muestra.lm.drafts import check_rollback, draft_counts, why_drafts_are_refused
from muestra.lm.engine_io import DecodeInput, PrefillInput
from muestra.lm.lanes import Lanes
from muestra.lm.model import OnnxDecoder
from muestra.runtime.errors import InvalidArgument, check_limit
from muestra.v1 import lm_pb2

_KINDS = (lm_pb2.OUTPUT_KIND_UNSPECIFIED, lm_pb2.LOGITS, lm_pb2.TOP_N, lm_pb2.ARGMAX)
# Distinct suppressed-id sets kept for sharing (usually one per model, or a few with stop ids).
_SUPPRESSED_SETS = 64


class Limits:
    """Each check raises InvalidArgument naming the field it refuses."""

    def __init__(
        self,
        decoder: OnnxDecoder,
        max_batch_rows: int,
        max_top_n: int,
        max_tokens_per_row: int,
        max_greedy_steps: int,
        max_draft_tokens: int,
    ) -> None:
        self.info = decoder.info
        self.max_batch_rows = max_batch_rows
        self.max_top_n = max_top_n
        self.max_tokens_per_row = max_tokens_per_row
        self.max_greedy_steps = max_greedy_steps
        # Why this graph cannot verify drafts ("" when it can); then it takes none.
        self.drafts_refused = why_drafts_are_refused(decoder)
        self.max_draft_tokens = 0 if self.drafts_refused else max_draft_tokens
        self._suppressed_sets: dict[bytes, np.ndarray] = {}

    def check_output(self, field: str, kind: int, top_n: int) -> OutputSpec:
        if kind not in _KINDS:
            raise InvalidArgument(f"{field}.kind", f"unknown output kind {kind}")
        if kind == lm_pb2.TOP_N:
            check_limit(f"{field}.top_n", top_n, 1, self.max_top_n)
        return (kind, top_n)

    def check_allowed(self, field: str, allowed: bytes) -> bytes:
        """An allowed-token bitmask: at most one bit per id (rounded up to 32-bit words), one token at least."""
        limit = (self.info.vocab_size + 31) // 32 * 4
        if len(allowed) > limit:
            raise InvalidArgument(
                field, f"is {len(allowed)} bytes; a vocabulary of {self.info.vocab_size} takes at most {limit}"
            )
        if allowed and not any(allowed):
            raise InvalidArgument(field, "allows no token")
        return allowed

    def check_suppressed(self, field: str, ids) -> np.ndarray:
        """A row's suppressed ids: valid ids, at most one per vocabulary entry; sorted, without repeats."""
        ids = np.fromiter(ids, dtype=np.int64, count=len(ids))
        check_limit(field, ids.size, 0, self.info.vocab_size)
        self.check_ids(field, ids)
        if not ids.size:
            return NO_IDS
        ids = np.unique(ids)
        # Rows with equal sets share one array, so a step suppresses them with one assignment.
        key = ids.tobytes()
        if key not in self._suppressed_sets and len(self._suppressed_sets) >= _SUPPRESSED_SETS:
            self._suppressed_sets.clear()
        return self._suppressed_sets.setdefault(key, ids)

    def check_ids(self, field: str, ids: np.ndarray) -> None:
        if ids.size and int(ids.max()) >= self.info.vocab_size:
            bad = int(np.argmax(ids >= self.info.vocab_size))
            raise InvalidArgument(
                f"{field}[{bad}]", f"token id {int(ids[bad])} is out of range (vocab_size {self.info.vocab_size})"
            )

    def check_prompts(self, rows: Sequence[PrefillInput]) -> list[int]:
        """Each row's length once prefilled; raises when a prompt is empty, too long or holds a bad id."""
        check_limit("rows", len(rows), 1, self.max_batch_rows)
        context = self.info.context_length
        for i, row in enumerate(rows):
            field = f"rows[{i}].input_ids"
            if row.input_ids.size == 0:
                raise InvalidArgument(field, "the prompt is empty")
            held = row.input_ids.size + (row.past[0].shape[1] if row.past is not None else 0)
            if held >= context:
                raise InvalidArgument(
                    field, f"the prompt has {held} tokens; it must be shorter than the context length {context}"
                )
            self.check_ids(field, row.input_ids)
        return [r.input_ids.size + (r.past[0].shape[1] if r.past is not None else 0) for r in rows]

    def _check_drafts(self, i: int, item: DecodeInput, batch: Batch) -> np.ndarray:
        """Each row's number of drafts (checked against the service's limit), or zeros."""
        counts = draft_counts(item, batch)
        if item.drafts is None:
            return counts
        field = f"batches[{i}].draft_lengths"
        if len(item.drafts) != batch.rows:
            raise InvalidArgument(field, f"got {len(item.drafts)} lengths for a batch of {batch.rows} rows")
        if self.max_draft_tokens == 0:
            raise InvalidArgument(field, self.drafts_refused or "this service runs with max_draft_tokens 0")
        for row, count in enumerate(counts.tolist()):
            check_limit(f"{field}[{row}]", count, 0, self.max_draft_tokens)
        self.check_ids(f"batches[{i}].draft_ids", np.concatenate(item.drafts))
        return counts

    def check_decode_batch(
        self, i: int, item: DecodeInput, batch: Batch | Lanes, tokens_per_row: int, added: int
    ) -> None:
        """Batch `i` of a Decode: its ids, specs, samplers, drafts and rollback fit its rows, and what the call adds
        to a row (`added` tokens and its drafts, after its rollback) fits the context."""
        if item.next_ids.size != batch.rows * tokens_per_row:
            per_row = f" x {tokens_per_row} tokens_per_row" if tokens_per_row > 1 else ""
            raise InvalidArgument(
                f"batches[{i}].next_ids", f"got {item.next_ids.size} ids for a batch of {batch.rows} rows{per_row}"
            )
        if item.outputs is not None and len(item.outputs) != batch.rows:
            raise InvalidArgument(
                f"batches[{i}].outputs", f"got {len(item.outputs)} specs for a batch of {batch.rows} rows"
            )
        if item.samplers is not None and len(item.samplers) != batch.rows:
            raise InvalidArgument(
                f"batches[{i}].samplers", f"got {len(item.samplers)} samplers for a batch of {batch.rows} rows"
            )
        self.check_ids(f"batches[{i}].next_ids", item.next_ids)
        held = batch.lengths - check_rollback(i, item, batch)
        adds = added + self._check_drafts(i, item, batch)
        full = np.flatnonzero(held + adds > self.info.context_length)
        if full.size:
            row = int(full[0])
            raise InvalidArgument(
                f"batches[{i}].next_ids",
                f"row {row} holds {int(held[row])} tokens; {int(adds[row])} more would "
                f"pass the context length {self.info.context_length}",
            )

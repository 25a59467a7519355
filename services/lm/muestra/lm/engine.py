"""The lm's engine: prefills and steps of the batches it holds, within its limits and its KV budget.

Every method runs on one thread: the server calls them from a single-thread executor, so model calls
are serialized and the batch table (batch_table.py) is never touched concurrently. A request that
breaks a limit (limits.py) raises before any batch changes; a batch is replaced only after its step
succeeded.

Every batch belongs to the lease it was created under (the caller's `x-muestra-lease`, or none):
only calls under that lease may step, filter or clear it, `release` frees a lease's batches (its
step stream ended), and `expire` frees batches nobody used for a while (a caller that left).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from muestra.lm.adoption import adopt_past
from muestra.lm.batch import NO_IDS, Batch, RowCache
from muestra.lm.batch_table import BatchTable
from muestra.lm.bursts import burst, check_burst_rows
from muestra.lm.drafts import check_draft_rows, draft_counts, rolled_back, verify
from muestra.lm.engine_io import ChunkedPrefill, DecodeInput, Load, PrefillInput, StepResult
from muestra.lm.hot_tier import HotTier, Resident
from muestra.lm.lanes import Lanes, join
from muestra.lm.limits import Limits
from muestra.lm.model import OnnxDecoder
from muestra.lm.sampling import LmSamplers
from muestra.runtime.errors import InvalidArgument, ResourceExhausted, check_limit
from muestra.v1 import lm_pb2


class Engine:
    def __init__(
        self,
        decoder: OnnxDecoder,
        max_batch_rows: int,
        kv_budget_bytes: int,
        max_top_n: int,
        max_tokens_per_row: int = 32,
        max_greedy_steps: int = 64,
        max_draft_tokens: int = 16,
        hot_tier: HotTier | None = None,
        samplers: LmSamplers | None = None,
    ) -> None:
        self.decoder = decoder
        self.info = decoder.info
        self.limits = Limits(decoder, max_batch_rows, max_top_n, max_tokens_per_row, max_greedy_steps, max_draft_tokens)
        self.kv_budget_bytes = kv_budget_bytes
        self.table = BatchTable()
        # The KV of rows that left, kept within the budget's room (None: none is kept).
        self.hot = hot_tier
        # The sampler chains this service runs for sampled rows (None: it runs none).
        self.samplers = samplers
        # Whether a prefill waits for the model thread (the server's); a greedy burst then ends at its next step.
        self.prefill_waiting: Callable[[], bool] = lambda: False
        # Called on this thread with each cached row that leaves (its KV, as the hot tier keeps it, and its
        # RowCache): the shared tier's writes.
        self.on_row_left: Callable[[Resident, RowCache], None] | None = None

    @property
    def batches(self) -> dict[str, Batch | Lanes]:
        return self.table.batches

    def load(self) -> Load:
        return Load(len(self.batches), self.table.rows, self.table.held_bytes, self.kv_budget_bytes)

    def _bytes_for(self, lengths: Sequence[int]) -> int:
        """KV bytes a batch of rows holding these lengths takes in this model's storage."""
        return self.decoder.storage_cls.bytes_for(lengths, self.info.kv_bytes_per_token, self.info.context_length)

    def _reserve(self, call: str, freed: int, needed: int, transient: int = 0) -> None:
        """Raise unless live rows fit the budget after this call; the hot tier gives up what they need."""
        held = self.table.held_bytes - freed
        after = held + needed
        if after + transient > self.kv_budget_bytes:
            extra = f" plus {transient} bytes of prefill logits" if transient else ""
            raise ResourceExhausted(
                f"kv_budget_bytes: this {call} needs {needed} bytes of KV{extra}, which with the "
                f"{held} bytes held by other batches exceeds the budget of "
                f"{self.kv_budget_bytes} bytes; finish or filter rows first"
            )
        self._make_room(after + transient)

    def _make_room(self, live: int) -> None:
        """Evict the hot tier's least recently used rows until it fits beside `live` bytes of live KV."""
        if self.hot is not None and live + self.hot.nbytes > self.kv_budget_bytes:
            self.hot.evict(live + self.hot.nbytes - self.kv_budget_bytes)

    def _leave(self, batch: Batch | Lanes, rows: Sequence[int], freed: bool = False) -> None:
        """Rows leaving `batch` (finished, cancelled): keep the KV of cached ones in the hot tier and hand them
        to on_row_left; a row shorter than one cache block is not worth keeping. The lone row of a batch that
        is `freed` with it gives the tier its buffers as they are (a chat's turn: no copy of its KV)."""
        for row in rows:
            cache = batch.cache[row] if batch.cache else None
            length = int(batch.lengths[row])
            if cache is None or length < cache.block_size:
                continue
            ids, kv = batch.row_ids(row), batch.row_kv(row, length)
            if self.hot is not None:
                alone = freed and isinstance(batch, Batch) and batch.rows == 1 and self.decoder.device == "cpu"
                owner = batch.kv.values if alone else None
                nbytes = batch.nbytes if alone else 0
                resident = self.hot.keep(ids, kv, cache.block_size, cache.stored_blocks, owner, nbytes)
                self._make_room(self.table.held_bytes)
            else:
                copied = tuple(np.array(a, order="C", copy=True) for a in kv)
                nbytes = sum(a.nbytes for a in copied)
                resident = Resident(ids.copy(), copied, nbytes, cache.block_size, cache.stored_blocks)
            if self.on_row_left is not None:
                self.on_row_left(resident, cache)

    def _adopt(self, row: PrefillInput) -> None:
        """Just before a prompt runs, the longest past this service holds for it (adoption.py)."""
        if row.cache is not None and self.hot is not None:
            adopt_past(row, self.hot, self.batches.values(), self.decoder.storage_cls)

    def prefill(self, rows: Sequence[PrefillInput], lease: str = "") -> StepResult:
        for row in rows:
            self._adopt(row)
        lengths = self.limits.check_prompts(rows)
        fresh = [r.input_ids.size for r in rows if r.past is None]
        transient = 0
        if self.decoder.logits_all and fresh:
            transient = len(fresh) * max(fresh) * self.info.vocab_size * 4
        self._reserve("Prefill", 0, self._bytes_for(lengths), transient)
        batch, logits, forward_us = Batch.from_prefill(
            self.decoder,
            [r.input_ids for r in rows],
            [r.request_id for r in rows],
            [r.output for r in rows],
            [r.past for r in rows],
            [r.suppressed for r in rows],
            [r.history if r.history is not None else r.input_ids for r in rows],
            [r.cache for r in rows],
        )
        allowed = [r.allowed for r in rows]
        batch.suppress(logits, [bool(a) for a in allowed])
        return StepResult(self.table.store(batch, lease), logits, batch.outputs, forward_us, allowed)

    def begin_prefill(self, row: PrefillInput, lease: str, chunk_tokens: int) -> ChunkedPrefill:
        """A one-row prefill run `chunk_tokens` at a time by prefill_chunk (other calls may run between two
        chunks); its whole KV is reserved now, so no chunk can fail for want of room."""
        self._adopt(row)
        (length,) = self.limits.check_prompts([row])
        transient = chunk_tokens * self.info.vocab_size * 4 if self.decoder.logits_all else 0
        needed = self._bytes_for([length])
        self._reserve("Prefill", 0, needed, transient)
        self.table.pending_bytes += needed
        return ChunkedPrefill(row, lease, chunk_tokens, length, needed)

    def prefill_chunk(self, job: ChunkedPrefill) -> StepResult | None:
        """Run the next chunk of `job`; after the last one, its batch is stored and its result returned."""
        row, start = job.row, job.done
        end = min(start + job.chunk_tokens, row.input_ids.size)
        ids = row.input_ids[start:end]
        if job.batch is None:
            history = row.history if row.history is not None else row.input_ids
            past = row.past[0].shape[1] if row.past is not None else 0
            job.batch, logits, us = Batch.from_prefill(
                self.decoder, [ids], [row.request_id], [row.output], [row.past], [row.suppressed],
                [history[: past + end]], [row.cache], hold=job.length,
            )  # fmt: skip
        else:
            logits, us = job.batch.step(self.decoder, ids[None, :])
        job.done, job.forward_us, job.chunks = end, job.forward_us + us, job.chunks + 1
        if end < row.input_ids.size:
            return None
        self.table.pending_bytes -= job.reserved
        job.reserved = 0
        batch = job.batch
        batch.suppress(logits, [bool(row.allowed)])
        job.batch_id = self.table.store(batch, job.lease)
        return StepResult(job.batch_id, logits, batch.outputs, job.forward_us, [row.allowed])

    def abandon_prefill(self, job: ChunkedPrefill) -> None:
        """The caller of a chunked prefill left: free what it holds (its reservation, or its finished batch)."""
        self.table.pending_bytes -= job.reserved
        job.reserved = 0
        if job.batch_id:
            self.table.drop(job.batch_id)
        job.batch = None

    def decode(
        self,
        items: Sequence[DecodeInput],
        lease: str = "",
        tokens_per_row: int = 1,
        greedy_steps: int = 1,
        stop_ids: Sequence[int] = (),
        row_invariant: bool = False,
    ) -> StepResult:
        """Append tokens_per_row tokens to every row (each item's next_ids holds them row after row) and step.

        With greedy_steps > 1, every row's argmax is then fed back and stepped, up to greedy_steps forwards
        in all, or until every row has produced one of stop_ids. Without row_invariant, a step of one row alone
        may take the model's one-row kernels (faster; its bits then differ from the same row in a batch)."""
        self.decoder.lone_rows_invariant = row_invariant
        try:
            return self._decode(items, lease, tokens_per_row, greedy_steps, stop_ids)
        finally:
            self.decoder.lone_rows_invariant = False

    def _decode(
        self,
        items: Sequence[DecodeInput],
        lease: str,
        tokens_per_row: int,
        greedy_steps: int,
        stop_ids: Sequence[int],
    ) -> StepResult:
        if not items:
            raise InvalidArgument("batches", "give at least one batch")
        check_limit("tokens_per_row", tokens_per_row, 1, self.limits.max_tokens_per_row)
        check_limit("greedy_steps", greedy_steps, 1, self.limits.max_greedy_steps)
        if greedy_steps > 1 and tokens_per_row > 1:
            raise InvalidArgument("greedy_steps", "needs tokens_per_row 1 (feed forced tokens in a call of their own)")
        drafting = any(item.drafts is not None for item in items)
        if drafting and (tokens_per_row > 1 or greedy_steps > 1):
            field = "tokens_per_row" if tokens_per_row > 1 else "greedy_steps"
            raise InvalidArgument(field, "a Decode with draft tokens feeds one next id per row and runs one step")
        sampling = any(item.samplers is not None for item in items)
        if sampling and (tokens_per_row > 1 or drafting):
            field = "tokens_per_row" if tokens_per_row > 1 else "draft_lengths"
            raise InvalidArgument(field, "rows with samplers feed one next id per row and take no drafts")
        # The KV a call may add to a row: its fed tokens, then one per greedy step after the first.
        added = tokens_per_row + greedy_steps - 1
        seen = set()
        batches = []
        for i, item in enumerate(items):
            if item.batch_id in seen:
                raise InvalidArgument(f"batches[{i}].batch_id", f"batch {item.batch_id!r} is listed twice")
            seen.add(item.batch_id)
            batch = self.table.get(f"batches[{i}].batch_id", item.batch_id, lease)
            self.limits.check_decode_batch(i, item, batch, tokens_per_row, added)
            batches.append(batch)
        rows = sum(b.rows for b in batches)
        if rows > self.limits.max_batch_rows:
            raise InvalidArgument(
                "batches", f"the batches hold {rows} rows together; max_batch_rows is {self.limits.max_batch_rows}"
            )
        pairs = list(zip(items, batches, strict=True))
        lengths = np.concatenate([b.lengths - (i.rollback if i.rollback is not None else 0) for i, b in pairs])
        lengths += added + np.concatenate([draft_counts(i, b) for i, b in pairs])
        freed = sum(self.table.stored_bytes(item.batch_id) for item in items)
        self._reserve("Decode", freed, self._bytes_for(lengths.tolist()))

        specs = [s for item, b in zip(items, batches, strict=True) for s in (item.outputs or b.outputs)]
        allowed = None
        if any(item.allowed for item in items):
            allowed = [a for item, b in zip(items, batches, strict=True) for a in (item.allowed or [b""] * b.rows)]
        sampled = None
        if sampling:
            sampled = [s for item, b in zip(items, batches, strict=True) for s in (item.samplers or [None] * b.rows)]
        if greedy_steps > 1 or sampling:
            check_burst_rows(greedy_steps, specs, allowed, sampled)
        drafts = None
        if drafting:
            drafts = [d for item, b in zip(items, batches, strict=True) for d in (item.drafts or [NO_IDS] * b.rows)]
            check_draft_rows(drafts, specs, allowed)

        # Rolled back and joined copies replace the originals only once the step has succeeded.
        batches = [rolled_back(self.decoder, item, b) for item, b in zip(items, batches, strict=True)]
        # Rows far longer than their neighbours keep a buffer (a lane) of their own rather than pad them all.
        batch = batches[0] if len(batches) == 1 else join(self.decoder, batches)
        next_ids = np.concatenate([item.next_ids for item in items]).reshape(rows, tokens_per_row)
        if drafts is not None:
            result = verify(self.decoder, batch, next_ids[:, 0], drafts, specs, allowed)
            batch.outputs = specs
            result.batch_id = self.table.store(batch, lease, [item.batch_id for item in items])
            return result
        errors = None
        if greedy_steps > 1 or sampling:
            # A step after the first that fails leaves the batches past what their callers know: they go.
            given = [item.batch_id for item in items]
            logits, forward_us, greedy_ids, errors = burst(
                self.decoder, batch, next_ids, greedy_steps, stop_ids, sampled, self.prefill_waiting,
                lambda: self.table.drop(*given),
            )  # fmt: skip
        else:
            # step() changes the batch only once its forward has succeeded.
            logits, forward_us = batch.step(self.decoder, next_ids)
            batch.suppress(logits, None if allowed is None else [bool(a) for a in allowed])
            greedy_ids = None
        batch.outputs = specs
        stored = self.table.store(batch, lease, [item.batch_id for item in items])
        if sampled is not None:  # a sampled row's tokens are in greedy_ids: no logits to ship
            specs = [(lm_pb2.ARGMAX, 0) if row is not None else spec for row, spec in zip(sampled, specs, strict=True)]
        return StepResult(
            stored, logits, specs, forward_us, allowed, greedy_ids, sampled=sampled, sampler_errors=errors
        )

    def filter(self, batch_id: str, rows: Sequence[int], lease: str = "") -> tuple[str, int]:
        batch = self.table.get("batch_id", batch_id, lease)
        check_limit("rows", len(rows), 0, self.limits.max_batch_rows)
        for i, r in enumerate(rows):
            if r >= batch.rows:
                raise InvalidArgument(f"rows[{i}]", f"row {r} is out of range for a batch of {batch.rows} rows")
        kept = set(rows)
        self._leave(batch, [r for r in range(batch.rows) if r not in kept], freed=not rows)
        if not rows:
            self.table.drop(batch_id)
            return "", 0
        self._reserve("Filter", self.table.stored_bytes(batch_id), self._bytes_for(batch.lengths[list(rows)].tolist()))
        return self.table.store(batch.filter(self.decoder, rows), lease, [batch_id]), len(rows)

    def clear(self, batch_ids: Sequence[str], lease: str = "") -> Load:
        """Free these batches of the lease (unknown ids are ignored: they are already free), or all of its batches."""
        for batch_id in list(batch_ids or self.batches):
            if self.table.owns(lease, batch_id):
                batch = self.batches[batch_id]
                self.table.drop(batch_id)
                self._leave(batch, range(batch.rows), freed=True)
        return self.load()

    def release(self, lease: str) -> tuple[int, int]:
        """Free every batch of a lease (its step stream ended); how many batches and rows that freed."""
        return self.table.release(lease)

    def expire(self, idle_s: float) -> tuple[int, int]:
        """Free the batches unused for idle_s seconds (their caller left); how many batches and rows that freed."""
        return self.table.expire(idle_s)

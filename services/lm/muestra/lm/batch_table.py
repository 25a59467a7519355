"""The batches the lm holds between calls: the lease each was created under, its last use, and the KV they hold."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterable, Sequence

from muestra.lm.batch import Batch
from muestra.lm.lanes import Lanes
from muestra.runtime.errors import InvalidArgument


class BatchTable:
    """Batches by id. A batch is known only to calls under its lease; storing one replaces those it grew from."""

    def __init__(self) -> None:
        self.batches: dict[str, Batch | Lanes] = {}
        self._sizes: dict[str, tuple[int, int]] = {}
        # batch id -> (lease, time.monotonic() of its last use)
        self._leases: dict[str, tuple[str, float]] = {}
        self.kv_bytes = 0
        # KV reserved for chunked prefills in progress (their batches are not stored yet).
        self.pending_bytes = 0
        self.rows = 0

    @property
    def held_bytes(self) -> int:
        """KV bytes the stored batches and the chunked prefills in progress hold."""
        return self.kv_bytes + self.pending_bytes

    def owns(self, lease: str, batch_id: str) -> bool:
        return batch_id in self._leases and self._leases[batch_id][0] == lease

    def get(self, field: str, batch_id: str, lease: str) -> Batch | Lanes:
        batch = self.batches.get(batch_id)
        # Another lease's batch is as unknown to this caller as a freed one.
        if batch is None or self._leases[batch_id][0] != lease:
            raise InvalidArgument(
                field, f"unknown batch {batch_id!r} (Decode, Filter and Clear replace or free batches)"
            )
        return batch

    def request_ids(self, batch_ids: Iterable[str], lease: str) -> list[str]:
        """The request ids of the rows of `lease`'s batches among `batch_ids` (for logs)."""
        ids: list[str] = []
        for batch_id in batch_ids:
            batch = self.batches.get(batch_id)
            if batch is not None and self._leases[batch_id][0] == lease:
                ids.extend(batch.request_ids)
        return ids

    def stored_bytes(self, batch_id: str) -> int:
        """The KV bytes a batch held when it was stored."""
        return self._sizes[batch_id][0]

    def store(self, batch: Batch | Lanes, lease: str, replaces: Sequence[str] = ()) -> str:
        self.drop(*replaces)
        batch_id = uuid.uuid4().hex[:16]
        self.batches[batch_id] = batch
        self._leases[batch_id] = (lease, time.monotonic())
        # Sizes as stored: a Decode grows its batch in place before the old entry is dropped.
        self._sizes[batch_id] = (batch.nbytes, batch.rows)
        self.kv_bytes += batch.nbytes
        self.rows += batch.rows
        return batch_id

    def drop(self, *batch_ids: str) -> None:
        """Forget these batches (unknown ids are ignored: they are already gone)."""
        for batch_id in batch_ids:
            if self.batches.pop(batch_id, None) is not None:
                del self._leases[batch_id]
                nbytes, rows = self._sizes.pop(batch_id)
                self.kv_bytes -= nbytes
                self.rows -= rows

    def release(self, lease: str) -> tuple[int, int]:
        """Free every batch of a lease; how many batches and rows that freed."""
        return self._free([b for b, (owner, _) in self._leases.items() if owner == lease])

    def expire(self, idle_s: float) -> tuple[int, int]:
        """Free the batches unused for idle_s seconds; how many batches and rows that freed."""
        cutoff = time.monotonic() - idle_s
        return self._free([b for b, (_, used_at) in self._leases.items() if used_at < cutoff])

    def _free(self, batch_ids: list[str]) -> tuple[int, int]:
        rows = sum(self.batches[b].rows for b in batch_ids)
        self.drop(*batch_ids)
        return len(batch_ids), rows

"""The prefix cache's hot tier: the KV of rows that left their batches, kept in the lm's own memory.

A row that leaves (Filter drops it, Clear frees its batch) leaves the ids whose KV it held (its prompt and
the tokens it was fed: a conversation turn's prompt and answer but the answer's last token) and a copy of
that KV. A new row whose prompt starts with such ids takes their KV from here (PrefixCache.plan), with no
trip through bytes, and prefills only the rest. Reuse runs to the first token that differs, not to a block
boundary: a conversation's next turn starts with the whole previous turn, and the tokens after its last full
block are usually the answer's end and the next message's header.

The tier lives inside the lm's KV budget: the engine evicts its least recently used entries whenever live
rows need the room, so live rows always win the memory. An entry is never changed once kept, so a hit may
read it on another thread while the model thread evicts it (the arrays stay alive while a hit holds them).
"""

from __future__ import annotations

import collections
import dataclasses
import itertools
import threading

import numpy as np
from prometheus_client import Counter, Gauge

# Rows kept at most, whatever their bytes (a lookup compares the prompt with each one's ids).
MAX_ENTRIES = 1024

EVICTIONS = Counter("muestra_lm_hot_tier_evictions_total", "Rows' KV the hot tier dropped to make room for live rows")
EVICTED_BYTES = Counter("muestra_lm_hot_tier_evicted_bytes_total", "Bytes of KV the hot tier dropped for live rows")
KEPT = Counter("muestra_lm_hot_tier_kept_total", "Rows whose KV the hot tier kept when they left their batch")
BYTES = Gauge("muestra_lm_hot_tier_bytes", "Bytes of KV the hot tier holds")
ENTRIES = Gauge("muestra_lm_hot_tier_entries", "Rows whose KV the hot tier holds")


@dataclasses.dataclass
class Resident:
    """The KV of one row that left, as it left (only stored_blocks changes, when its blocks are written)."""

    ids: np.ndarray  # int32 [n]: the ids whose KV it holds
    kv: tuple[np.ndarray, ...]  # one [kv_heads, n, head_dim] array per past input, in the graph's order
    nbytes: int
    # Leading full blocks (of block_size tokens) known to be in the shared tier.
    block_size: int
    stored_blocks: int
    # What keeps the memory of `kv` alive when it is a view on a freed batch's buffers (their OrtValues).
    owner: object = None


def common_prefix(a: np.ndarray, b: np.ndarray, limit: int) -> int:
    """How many leading ids a and b share, up to `limit`."""
    n = min(len(a), len(b), limit)
    differ = np.flatnonzero(a[:n] != b[:n])
    return int(differ[0]) if differ.size else n


class HotTier:
    """Rows' KV by their ids, least recently used first; thread-safe."""

    def __init__(self, max_entries: int = MAX_ENTRIES) -> None:
        self.max_entries = max_entries
        self._entries: collections.OrderedDict[int, Resident] = collections.OrderedDict()
        self._keys = itertools.count()
        self._lock = threading.Lock()
        self.nbytes = 0

    def __len__(self) -> int:
        return len(self._entries)

    def longest(self, ids: np.ndarray, limit: int) -> tuple[Resident | None, int]:
        """The entry sharing the most leading ids with `ids` (at most `limit`), and how many; (None, 0) if none."""
        best, best_key, best_length = None, None, 0
        with self._lock:
            for key, entry in self._entries.items():
                if min(len(entry.ids), limit) <= best_length or not len(ids) or entry.ids[0] != ids[0]:
                    continue
                length = common_prefix(entry.ids, ids, limit)
                if length > best_length:
                    best, best_key, best_length = entry, key, length
            if best_key is not None:
                self._entries.move_to_end(best_key)
        return best, best_length

    def keep(
        self,
        ids: np.ndarray,
        kv: list[np.ndarray],
        block_size: int,
        stored_blocks: int,
        owner: object = None,
        owner_bytes: int = 0,
    ) -> Resident:
        """Keep a leaving row's KV (views on its batch's buffers) under its ids: a copy, or, when the batch goes
        with the row (`owner`: its buffers, `owner_bytes` of them), the views themselves, with no copy.

        An entry whose ids start this row's is dropped (every prompt it would serve, this one serves as
        well); a row whose ids start an entry's is not kept again (the entry serves its prompts)."""
        with self._lock:
            for key, entry in list(self._entries.items()):
                shared = common_prefix(entry.ids, ids, len(ids))
                if shared == len(ids) and len(entry.ids) >= len(ids):
                    self._entries.move_to_end(key)
                    return entry
                if shared == len(entry.ids):
                    self._drop(key)
        if owner is not None:  # nobody writes those buffers any more, and `owner` keeps them alive
            kept, nbytes = tuple(kv), owner_bytes
        else:  # a copy: the next step of the batch writes over its buffers, or frees them
            kept = tuple(np.array(a, order="C", copy=True) for a in kv)
            nbytes = sum(a.nbytes for a in kept)
        resident = Resident(np.array(ids, dtype=np.int32), kept, nbytes, block_size, stored_blocks, owner)
        with self._lock:
            self._entries[next(self._keys)] = resident
            self.nbytes += resident.nbytes
            while len(self._entries) > self.max_entries:
                self._drop(next(iter(self._entries)))
            self._gauges()
        KEPT.inc()
        return resident

    def take(self, resident: Resident) -> bool:
        """Remove `resident` for its buffers to be written on (a conversation's next turn goes on in them);
        False when it is no longer here."""
        with self._lock:
            key = next((k for k, entry in self._entries.items() if entry is resident), None)
            if key is None:
                return False
            self._drop(key)
            self._gauges()
        return True

    def evict(self, nbytes: int) -> int:
        """Drop least recently used entries until `nbytes` are freed (or none is left); the bytes freed."""
        freed = 0
        with self._lock:
            while freed < nbytes and self._entries:
                key = next(iter(self._entries))
                freed += self._entries[key].nbytes
                self._drop(key)
                EVICTIONS.inc()
            EVICTED_BYTES.inc(freed)
            self._gauges()
        return freed

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self.nbytes = 0
            self._gauges()

    def _drop(self, key: int) -> None:
        self.nbytes -= self._entries.pop(key).nbytes

    def _gauges(self) -> None:
        BYTES.set(self.nbytes)
        ENTRIES.set(len(self._entries))

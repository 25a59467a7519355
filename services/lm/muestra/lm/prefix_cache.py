"""The prompt-prefix KV cache: blocks of a prompt's KV, keyed by a hash chain over its token ids.

Keys. A block of `block_size` tokens has the hash h_i = blake2b-128(h_{i-1} | its ids as little-endian
uint32), with h_0 = blake2b-128("muestra-prefix-v1|" + the model fingerprint), so equal prefixes of one
model give equal keys on every replica and after every restart, and another model never shares one.
Only full blocks count, and they cover at most len(prompt) - 1 tokens: the last token is always run.
The gateway computes the chain (and finds how many leading blocks are stored); this service checks it
against the prompt and reads the blocks with one MGET.

Values: one block's header and KV (prefix_blocks.py). A block whose header, size, MAC or fingerprint does
not match is corrupt, foreign or forged: it and every block after it are a miss, and it is overwritten with
the freshly computed KV.

Writes of a prompt's new blocks run on a low-priority thread after the Prefill response has gone out.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import os
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

import numpy as np
from prometheus_client import Counter, Histogram

from muestra.lm.batch import RowCache
from muestra.lm.hot_tier import Resident
from muestra.lm.prefix_blocks import BlockFormat
from muestra.lm.prefix_store import MemoryBlockStore, RedisBlockStore
from muestra.runtime.cache_mac import CacheMac
from muestra.runtime.errors import InvalidArgument
from muestra.runtime.prefix_hash import block_hashes

log = logging.getLogger("muestra.lm.prefix_cache")

# Writes waiting for the writer thread beyond this are dropped (each holds a prompt's KV alive).
MAX_PENDING_WRITES = 16
# A hit leaves at least this many prompt tokens to run. One token would run alone, and a one-position forward
# rounds apart from a several-position one in the last bits (MatMulNBits' and the attention's one-row kernels);
# with two or more, a hit's logits are bitwise those of prefilling the whole prompt (measured on the default
# model and the tests' fixture), so a prompt gives the same bits whatever the cache holds of it.
MIN_SUFFIX = 2
# Block hashes whose sightings are counted (with min_sightings > 1), least recently seen dropped first.
SIGHTINGS_KEPT = 1 << 16

QUERIES = Counter(
    "muestra_lm_prefix_cache_queries_total",
    "Prompt tokens of rows that asked the prefix cache (vllm:prefix_cache_queries)",
)
HITS = Counter(
    "muestra_lm_prefix_cache_hits_total",
    "Prompt tokens whose KV came from the prefix cache (vllm:prefix_cache_hits)",
)
TIER_HITS = Counter(
    "muestra_lm_prefix_cache_tier_hits_total",
    "Prompt tokens whose KV came from each tier: hot (this lm's memory) or shared (Redis, or the in-process store)",
    ["tier"],
)
HIT_TOKENS = Histogram(
    "muestra_lm_prefix_cache_hit_tokens",
    "Tokens reused per prefilled row that asked the cache",
    buckets=(0, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384),
)
CORRUPT = Counter(
    "muestra_lm_prefix_cache_corrupt_blocks_total", "Blocks ignored (and rewritten) as corrupt or foreign"
)
BLOCKS_WRITTEN = Counter("muestra_lm_prefix_cache_written_blocks_total", "Blocks handed to the cache to store")
DROPPED = Counter(
    "muestra_lm_prefix_cache_dropped_writes_total", "Rows whose blocks were not written: too many writes pending"
)


@dataclasses.dataclass
class PrefixRequest:
    """A Prefill row's prefix instructions, checked against its prompt."""

    hashes: list[bytes]
    block_size: int
    cached_blocks: int
    write: bool
    # The most leading blocks a hit may use (MIN_SUFFIX tokens are left to run).
    usable_blocks: int = 0
    # Write the row's blocks when it leaves its batch (PrefixBlocks.write_on_leave).
    write_on_leave: bool = False


@dataclasses.dataclass
class PrefixPlan:
    """What the cache gave one row, and which of its blocks to write once it has run."""

    request: PrefixRequest
    # KV of the reused tokens, one [kv_heads, cached_tokens, head_dim] array per past input, or None.
    past: list[np.ndarray] | None
    cached_tokens: int
    # (block index, overwrite): blocks to store after the prefill.
    writes: list[tuple[int, bool]]
    # Where the reused tokens came from: "hot" (this lm's memory), "shared" (Redis or the in-process store), "".
    tier: str = ""
    # Leading blocks of the prompt known to be in the shared tier once the writes above are done.
    stored_blocks: int = 0


def _leading(blocks: set[int], count: int) -> int:
    """How many of blocks 0, 1, ... count - 1 are in `blocks`, from the first on."""
    return next((i for i in range(count) if i not in blocks), count)


def _lower_priority() -> None:
    """Run this thread at a lower priority than the model's (Linux: per-thread nice)."""
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
    except (AttributeError, OSError):
        pass


class PrefixCache:
    """Reads a row's cached blocks before its prefill and writes its new ones after the response."""

    def __init__(
        self,
        store: RedisBlockStore | MemoryBlockStore,
        fingerprint: str,
        block_format: BlockFormat,
        key_prefix: str,
        max_block_size: int,
        min_sightings: int = 2,
    ) -> None:
        self.store = store
        self.fingerprint = fingerprint
        self.format = block_format
        self.key_prefix = key_prefix
        self.max_block_size = max_block_size
        self.read_pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="lm-prefix-read")
        self.write_pool = ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="lm-prefix-write", initializer=_lower_priority
        )
        self._pending = 0
        self._pending_lock = threading.Lock()
        self._corrupt_logged_at = -float("inf")
        # Write-admission: a block is stored once prompts holding it were prefilled here min_sightings times.
        self.min_sightings = min_sightings
        self._sightings: collections.OrderedDict[bytes, int] = collections.OrderedDict()
        self._sightings_lock = threading.Lock()
        self._corrupt_since_log = 0

    def key(self, block_hash: bytes) -> str:
        return self.key_prefix + block_hash.hex()

    def check(
        self,
        field: str,
        ids: np.ndarray,
        block_size: int,
        hashes: Sequence[bytes],
        cached: int,
        write: bool,
        write_on_leave: bool = False,
    ):
        """The row's PrefixRequest; raises InvalidArgument when it does not fit the prompt."""
        if block_size < 1 or block_size > self.max_block_size:
            raise InvalidArgument(f"{field}.block_size", f"must be within [1, {self.max_block_size}], got {block_size}")
        full = max(ids.size - 1, 0) // block_size
        if len(hashes) > full:
            raise InvalidArgument(
                f"{field}.block_hashes",
                f"{len(hashes)} blocks of {block_size} tokens; a prompt of {ids.size} tokens has {full} full blocks "
                "before its last token",
            )
        if cached > len(hashes):
            raise InvalidArgument(f"{field}.cached_blocks", f"is {cached}; only {len(hashes)} block hashes were given")
        expected = block_hashes(self.fingerprint, ids[: len(hashes) * block_size + 1].tolist(), block_size)
        for i, (got, want) in enumerate(zip(hashes, expected, strict=True)):
            if got != want:
                raise InvalidArgument(
                    f"{field}.block_hashes[{i}]",
                    "does not match the prompt's tokens (see docs/prefix_cache.md for the hash chain)",
                )
        usable = min(len(hashes), max(ids.size - MIN_SUFFIX, 0) // block_size)
        return PrefixRequest(list(hashes), block_size, cached, write, usable, write_on_leave)

    def load(self, request: PrefixRequest) -> PrefixPlan:
        """Fetch and verify the leading blocks the caller found cached (one round trip); never raises."""
        hashes, size = request.hashes, request.block_size
        values = self.store.get_many([self.key(h) for h in hashes[: request.cached_blocks]]) or []
        blocks, corrupt = [], set()
        for i, value in enumerate(values):
            if value is None:
                break
            block = self.format.decode(value, size, hashes[i], self.store.verify_macs)
            if block is None:
                corrupt.add(i)
                break
            blocks.append(block)
        # Blocks after the first missing or bad one are of no use (their past is not here), but need
        # no write when they are present and sound.
        verify = self.store.verify_macs
        for i in range(len(blocks) + 1, len(values)):
            if values[i] is not None and self.format.decode(values[i], size, hashes[i], verify) is None:
                corrupt.add(i)
        if corrupt:
            self._count_corrupt(len(corrupt))
        present = {i for i, v in enumerate(values) if v is not None} - corrupt
        blocks = blocks[: request.usable_blocks]
        used = len(blocks)
        writes = [(i, i in corrupt) for i in range(used, len(hashes)) if i not in present] if request.write else []
        if writes and self.min_sightings > 1:
            writes = [(i, overwrite) for i, overwrite in writes if self._sighted(hashes[i])]
        past = None
        if blocks:
            # One copy: [tensors, heads, blocks * block_size, dim].
            joined = np.concatenate(blocks, axis=2)
            past = list(joined)
        stored = _leading(present | {i for i, _ in writes}, len(hashes))
        return PrefixPlan(request, past, used * size, writes, "shared" if used else "", stored)

    def from_hot(self, request: PrefixRequest, resident: Resident, length: int) -> PrefixPlan:
        """The plan of a row whose first `length` tokens' KV is a hot-tier entry's (no trip through the store).

        Its prompt's blocks after those the entry knows to be stored are written as load() would write them."""
        size = request.block_size
        known = min(resident.stored_blocks, length // size) if resident.block_size == size else 0
        writes = [(i, False) for i in range(known, len(request.hashes))] if request.write else []
        if writes and self.min_sightings > 1:
            writes = [(i, overwrite) for i, overwrite in writes if self._sighted(request.hashes[i])]
        stored = _leading(set(range(known)) | {i for i, _ in writes}, len(request.hashes))
        past = [a[:, :length] for a in resident.kv]
        return PrefixPlan(request, past, length, writes, "hot", stored)

    def _sighted(self, block_hash: bytes) -> bool:
        """Count one more prompt holding this block; whether it has now been seen min_sightings times."""
        with self._sightings_lock:
            count = self._sightings.pop(block_hash, 0) + 1
            if count < self.min_sightings:
                self._sightings[block_hash] = count
                while len(self._sightings) > SIGHTINGS_KEPT:
                    self._sightings.popitem(last=False)
        return count >= self.min_sightings

    def record(self, plan: PrefixPlan, prompt_tokens: int) -> None:
        """Count one prefilled row that asked the cache."""
        QUERIES.inc(prompt_tokens)
        HITS.inc(plan.cached_tokens)
        if plan.tier:
            TIER_HITS.labels(plan.tier).inc(plan.cached_tokens)
        HIT_TOKENS.observe(plan.cached_tokens)

    def write_later(self, jobs: list[tuple[PrefixPlan, object, int, int]]) -> None:
        """Queue the blocks of each (plan, kv storage, row, row length) for the writer thread."""
        for job in jobs:
            with self._pending_lock:
                if self._pending >= MAX_PENDING_WRITES:
                    DROPPED.inc()
                    continue
                self._pending += 1
            self.write_pool.submit(self._write, *job)

    def _write(self, plan: PrefixPlan, kv, row: int, length: int) -> None:
        try:
            arrays = kv.row_arrays(row, length)
            size, hashes = plan.request.block_size, plan.request.hashes
            items = [
                (self.key(hashes[i]), self.format.encode(arrays, i * size, size, hashes[i]), overwrite)
                for i, overwrite in plan.writes
            ]
            if self.store.put_many(items):
                BLOCKS_WRITTEN.inc(len(items))
        except Exception:  # a write must never take the service down
            log.exception("prefix cache: writing %d blocks failed", len(plan.writes))
        finally:
            with self._pending_lock:
                self._pending -= 1

    def write_left(self, resident: Resident, cache: RowCache) -> None:
        """Queue the full blocks of a row that left (prompt and generated tokens) that the shared tier lacks.

        Only for rows that asked (PrefixBlocks.write_on_leave: chat turns), on first sight, whatever
        min_sightings says: a chat turn that generated is where its conversation stands, and its next turn starts
        with all of it. A row fed nothing after its prompt (a prefill alone) is left to the prompt's own rule, at
        its prefill. The entry then counts the blocks as stored, so the next turn, which adopts it, writes only
        its own new blocks."""
        size = cache.block_size
        full = len(resident.ids) // size
        if not cache.write or full <= cache.stored_blocks or len(resident.ids) <= cache.prompt_tokens:
            return
        with self._pending_lock:
            if self._pending >= MAX_PENDING_WRITES:
                DROPPED.inc()
                return
            self._pending += 1
        resident.stored_blocks = full
        self.write_pool.submit(self._write_left, resident, size, cache.stored_blocks, full)

    def _write_left(self, resident: Resident, size: int, start: int, full: int) -> None:
        try:
            # block_hashes leaves a prompt's last token out; every held id of a finished row counts.
            hashes = block_hashes(self.fingerprint, [*resident.ids[: full * size].tolist(), 0], size)
            items = [
                (self.key(hashes[i]), self.format.encode(resident.kv, i * size, size, hashes[i]), False)
                for i in range(start, full)
            ]
            if self.store.put_many(items):
                BLOCKS_WRITTEN.inc(len(items))
        except Exception:  # a write must never take the service down
            log.exception("prefix cache: writing %d blocks of a finished row failed", full - start)
        finally:
            with self._pending_lock:
                self._pending -= 1

    def _count_corrupt(self, count: int) -> None:
        CORRUPT.inc(count)
        self._corrupt_since_log += count
        now = time.monotonic()
        if now - self._corrupt_logged_at >= 60:
            log.warning(
                "prefix cache: %d corrupt or foreign block(s) ignored and rewritten (at most one such line a minute)",
                self._corrupt_since_log,
            )
            self._corrupt_logged_at, self._corrupt_since_log = now, 0

    def close(self) -> None:
        self.read_pool.shutdown(wait=True)
        self.write_pool.shutdown(wait=True)
        self.store.close()


def open_prefix_cache(config, info) -> PrefixCache | None:
    """The service's prefix cache from its settings (Redis when --redis-url is set), or None when off."""
    if not config.prefix_cache:
        log.info("prefix cache: off")
        return None
    if config.redis_url:
        store = RedisBlockStore(
            config.redis_url, config.prefix_cache_ttl_s, config.redis_timeout_s, config.redis_password
        )
        mac = CacheMac(config.cache_key, "prefix cache")
    else:
        store = MemoryBlockStore(config.prefix_cache_memory_bytes, config.prefix_cache_ttl_s)
        mac = CacheMac(config.cache_key or "in-process", "prefix cache")  # blocks never leave the process
    block_format = BlockFormat(info.fingerprint, info.num_layers, info.num_kv_heads, info.head_dim, info.kv_dtype, mac)
    log.info(
        "prefix cache: %s, keys %s<hash>, a block stored once seen in %d prompt(s)",
        store.describe(), config.prefix_cache_key_prefix, max(config.prefix_cache_min_sightings, 1),
    )  # fmt: skip
    return PrefixCache(
        store, info.fingerprint, block_format, config.prefix_cache_key_prefix, info.context_length,
        config.prefix_cache_min_sightings,
    )  # fmt: skip

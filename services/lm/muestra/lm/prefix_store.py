"""Where the prefix cache's blocks live: Redis, or an in-process LRU with the same interface.

Both stores take and give opaque values (the block format is prefix_blocks.py's business). The Redis
store never raises: when Redis is down, slow or full, a read is a miss and a write is dropped; both are
counted, and `CacheHealth` logs one warning when the backend starts failing and one line when it is back.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Sequence

from prometheus_client import Counter, Gauge, Histogram

from muestra.runtime.calls import BackendHealth
from muestra.runtime.logs import without_password

log = logging.getLogger("muestra.lm.prefix_cache")

# One value to store: (key, bytes-like value, overwrite). Without overwrite, an existing key is kept.
Item = tuple[str, object, bool]

REDIS_SECONDS = Histogram(
    "muestra_lm_prefix_cache_redis_seconds",
    "Latency of the prefix cache's Redis calls (MGET of a row's blocks, pipelined SETs of its new blocks)",
    ["op"],
    buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5),
)
READ_BYTES = Counter("muestra_lm_prefix_cache_read_bytes_total", "Bytes of KV blocks read from the prefix cache")
WRITTEN_BYTES = Counter("muestra_lm_prefix_cache_written_bytes_total", "Bytes of KV blocks written to the prefix cache")
ERRORS = Counter(
    "muestra_lm_prefix_cache_errors_total", "Prefix-cache backend calls that failed (down, slow or full)", ["op"]
)
INCIDENTS = Counter(
    "muestra_lm_prefix_cache_incidents_total", "Times the prefix-cache backend went from answering to failing"
)
SKIPPED = Counter(
    "muestra_lm_prefix_cache_skipped_total", "Backend calls skipped during a failure's backoff window", ["op"]
)
MEMORY_BYTES = Gauge("muestra_lm_prefix_cache_memory_bytes", "Bytes of blocks held by the in-process prefix cache")


class CacheHealth(BackendHealth):
    """The prefix-cache backend's health (muestra.runtime.calls.BackendHealth), on the lm's log and counters."""

    def __init__(self, what: str) -> None:
        super().__init__(
            f"prefix cache: {what}", "every request is a miss", log, errors=ERRORS, incidents=INCIDENTS, skipped=SKIPPED
        )


class RedisBlockStore:
    """Blocks in Redis: one MGET per read, one pipelined SET [NX] EX per write; failures are misses."""

    backend = "redis"
    # Bytes that crossed a network may be damaged, foreign or forged: check every block's MAC.
    verify_macs = True

    def __init__(self, url: str, ttl_s: int, timeout_s: float, password: str = "") -> None:
        import redis
        from redis.backoff import NoBackoff
        from redis.connection import PythonRespSerializer
        from redis.retry import Retry

        self._redis_errors = (redis.RedisError, OSError)
        pool = redis.ConnectionPool.from_url(
            url,
            socket_timeout=timeout_s,
            socket_connect_timeout=timeout_s,
            # No client-side retries: a failure is a miss now, and CacheHealth decides when to try again.
            retry=Retry(NoBackoff(), 0),
            # hiredis still parses replies, but its command packer would copy every value into one buffer
            # (~50 ms of CPU per 64 MiB written); redis-py's own sends large values as they are.
            command_packer=PythonRespSerializer(6000, _encode),
            # A password in the URL wins; otherwise the one from the settings (kept off command lines).
            **({"password": password} if password else {}),
        )
        self.client = redis.Redis(connection_pool=pool)
        self.ttl_s = ttl_s
        self.where = f"Redis at {without_password(url)}"
        self.health = CacheHealth(self.where)

    def describe(self) -> str:
        return f"{self.where} (TTL {self.ttl_s} s)"

    def get_many(self, keys: Sequence[str]) -> list[bytes | None] | None:
        """The values of `keys` (None where absent), or None when Redis is failing."""
        if not keys or not self.health.should_try("read"):
            return None
        started = time.perf_counter()
        try:
            values = self.client.mget(keys)
        except self._redis_errors as exc:
            self.health.failed("read", exc)
            return None
        REDIS_SECONDS.labels("mget").observe(time.perf_counter() - started)
        self.health.succeeded("read")
        READ_BYTES.inc(sum(len(v) for v in values if v is not None))
        return values

    def put_many(self, items: Sequence[Item]) -> bool:
        """Store the items with the TTL (in one round trip); False when Redis failed or was skipped."""
        if not items or not self.health.should_try("write"):
            return False
        started = time.perf_counter()
        try:
            pipe = self.client.pipeline(transaction=False)
            for key, value, overwrite in items:
                pipe.set(key, value, ex=self.ttl_s if self.ttl_s > 0 else None, nx=not overwrite)
            replies = pipe.execute()
        except self._redis_errors as exc:
            self.health.failed("write", exc)
            return False
        REDIS_SECONDS.labels("set").observe(time.perf_counter() - started)
        self.health.succeeded("write")
        WRITTEN_BYTES.inc(sum(_nbytes(v) for (_, v, _), ok in zip(items, replies, strict=True) if ok))
        return True

    def close(self) -> None:
        self.client.close()


class MemoryBlockStore:
    """The embedded default: blocks in this process, least recently used dropped beyond `max_bytes`."""

    backend = "memory"
    verify_macs = False

    def __init__(self, max_bytes: int, ttl_s: int) -> None:
        self.max_bytes = max_bytes
        self.ttl_s = ttl_s
        self.nbytes = 0
        self._lock = threading.Lock()
        # key -> (value, expiry on time.monotonic(), or inf)
        self._blocks: collections.OrderedDict[str, tuple[object, float]] = collections.OrderedDict()
        MEMORY_BYTES.set_function(lambda: self.nbytes)

    def describe(self) -> str:
        return f"in-process LRU of {self.max_bytes} bytes (TTL {self.ttl_s} s)"

    def get_many(self, keys: Sequence[str]) -> list[object | None]:
        now = time.monotonic()
        values = []
        with self._lock:
            for key in keys:
                entry = self._blocks.get(key)
                if entry is not None and entry[1] <= now:
                    self._drop(key)
                    entry = None
                if entry is not None:
                    self._blocks.move_to_end(key)
                values.append(entry[0] if entry is not None else None)
        READ_BYTES.inc(sum(_nbytes(v) for v in values if v is not None))
        return values

    def put_many(self, items: Sequence[Item]) -> bool:
        expiry = time.monotonic() + self.ttl_s if self.ttl_s > 0 else float("inf")
        with self._lock:
            for key, value, overwrite in items:
                if key in self._blocks and not overwrite:
                    continue
                size = _nbytes(value)
                if size > self.max_bytes:
                    continue
                self._drop(key)
                self._blocks[key] = (value, expiry)
                self.nbytes += size
                WRITTEN_BYTES.inc(size)
                while self.nbytes > self.max_bytes:
                    self._drop(next(iter(self._blocks)))
        return True

    def _drop(self, key: str) -> None:
        entry = self._blocks.pop(key, None)
        if entry is not None:
            self.nbytes -= _nbytes(entry[0])

    def close(self) -> None:
        with self._lock:
            self._blocks.clear()
            self.nbytes = 0


def _encode(value) -> bytes | bytearray | memoryview:
    """A command argument as redis-py's packer wants it (keys, values, and the TTL)."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        return value
    if isinstance(value, str):
        return value.encode()
    return repr(value).encode()


def _nbytes(value) -> int:
    return value.nbytes if isinstance(value, memoryview) else len(value)

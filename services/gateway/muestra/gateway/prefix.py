"""The gateway's side of the prompt-prefix KV cache: a prompt's block hashes and its longest cached prefix.

The hash chain (muestra.runtime.prefix_hash, which the lm service uses too): h_0 = blake2b-128("muestra-prefix-v1|"
+ model fingerprint), h_i = blake2b-128(h_{i-1} | block i's ids as little-endian uint32), over the prompt's
full blocks, leaving its last token out. With Redis, one pipelined EXISTS over the blocks' keys finds how
many leading blocks are stored. Without Redis every lm replica keeps its own blocks in process, which the
gateway cannot see: it then sends every block with cached_blocks = all of them, and the lm uses the
longest prefix it holds. Redis failing makes a lookup a miss, counted, with one log line per incident.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence

from prometheus_client import Counter, Histogram

from muestra.runtime.prefix_hash import block_hashes
from muestra.v1 import lm_pb2

log = logging.getLogger("muestra.gateway.prefix")

QUERIES = Counter(
    "muestra_prefix_cache_queries_total",
    "Prompt tokens of requests that used the prefix cache (vllm:prefix_cache_queries)",
    ["model"],
)
HITS = Counter(
    "muestra_prefix_cache_hits_total",
    "Prompt tokens whose KV the lm took from the prefix cache (vllm:prefix_cache_hits)",
    ["model"],
)
FOUND = Counter(
    "muestra_prefix_cache_found_tokens_total",
    "Prompt tokens the gateway's lookup found in Redis (the lm may still miss some: evicted or corrupt)",
    ["model"],
)
REDIS_SECONDS = Histogram(
    "muestra_prefix_cache_lookup_seconds",
    "Latency of the gateway's prefix-cache lookups in Redis (one pipelined EXISTS per request)",
    buckets=(0.0002, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5),
)
ERRORS = Counter("muestra_prefix_cache_errors_total", "Prefix-cache lookups that failed (Redis down or slow)")
INCIDENTS = Counter("muestra_prefix_cache_incidents_total", "Times Redis went from answering lookups to failing")
SKIPPED = Counter("muestra_prefix_cache_skipped_total", "Lookups skipped during a failure's backoff window")


class LookupHealth:
    """Healthy, or failing from an error until a lookup succeeds: one warning and one info line per incident.

    While failing, lookups skip Redis except for one probe per backoff window (1 s, doubling up to 16 s).
    """

    BACKOFF_S = 1.0
    MAX_BACKOFF_S = 16.0

    def __init__(self, what: str) -> None:
        self.what = what
        self.healthy = True
        self._since = 0.0
        self._errors = 0
        self._backoff = self.BACKOFF_S
        self._retry_at = 0.0

    def should_try(self) -> bool:
        if self.healthy:
            return True
        now = time.monotonic()
        if now >= self._retry_at:
            self._retry_at = now + self._backoff
            return True
        SKIPPED.inc()
        return False

    def failed(self, exc: BaseException) -> None:
        ERRORS.inc()
        now = time.monotonic()
        self._errors += 1
        if self.healthy:
            self.healthy, self._since, self._errors, self._backoff = False, now, 1, self.BACKOFF_S
            INCIDENTS.inc()
            log.warning(
                "prefix cache: lookups in %s failed (%s: %s); every request is a miss until it recovers",
                self.what, type(exc).__name__, exc,
            )  # fmt: skip
        else:
            self._backoff = min(self._backoff * 2, self.MAX_BACKOFF_S)
        self._retry_at = now + self._backoff

    def succeeded(self) -> None:
        if not self.healthy:
            self.healthy = True
            log.info(
                "prefix cache: %s answers lookups again after %.1f s (%d failed lookups)",
                self.what, time.monotonic() - self._since, self._errors,
            )  # fmt: skip


class PrefixLookup:
    """Finds the longest cached prefix of a model's prompts and builds the PrefillRow.prefix for it."""

    def __init__(
        self, model: str, fingerprint: str, block_size: int, key_prefix: str, redis=None, health=None, timeout_s=0.25
    ):
        self.model = model
        # The client's socket timeout bounds each read; this bounds the whole pipeline (a miss after it).
        self.pipeline_timeout_s = 4 * timeout_s
        self.fingerprint = fingerprint
        self.block_size = block_size
        self.key_prefix = key_prefix
        self.redis = redis
        self.health = health

    async def prefix_blocks(self, prompt_ids: Sequence[int]) -> lm_pb2.PrefixBlocks | None:
        """The prefix instructions for this prompt (None when it has no full block before its last token)."""
        QUERIES.labels(self.model).inc(len(prompt_ids))
        hashes = block_hashes(self.fingerprint, prompt_ids, self.block_size)
        if not hashes:
            return None
        cached = len(hashes) if self.redis is None else await self._leading_present(hashes)
        return lm_pb2.PrefixBlocks(block_size=self.block_size, block_hashes=hashes, cached_blocks=cached, write=True)

    async def _leading_present(self, hashes: list[bytes]) -> int:
        """How many leading blocks Redis holds (0 when it fails), in one round trip."""
        if not self.health.should_try():
            return 0
        import redis

        started = time.perf_counter()
        try:
            async with self.redis.pipeline(transaction=False) as pipe:
                for block_hash in hashes:
                    pipe.exists(self.key_prefix + block_hash.hex())
                present = await asyncio.wait_for(pipe.execute(), self.pipeline_timeout_s)
        except (redis.RedisError, OSError, asyncio.TimeoutError) as exc:
            self.health.failed(exc)
            return 0
        REDIS_SECONDS.observe(time.perf_counter() - started)
        self.health.succeeded()
        cached = next((i for i, n in enumerate(present) if not n), len(present))
        FOUND.labels(self.model).inc(cached * self.block_size)
        return cached

    def record_hit(self, cached_tokens: int) -> None:
        HITS.labels(self.model).inc(cached_tokens)


def open_redis(url: str, timeout_s: float, password: str = ""):
    """An asyncio Redis client with short timeouts and no client-side retries."""
    import redis.asyncio
    from redis.asyncio.retry import Retry
    from redis.backoff import NoBackoff

    return redis.asyncio.Redis.from_url(
        url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s, retry=Retry(NoBackoff(), 0),
        **({"password": password} if password else {}),
    )  # fmt: skip

"""The gateway's side of the prompt-prefix KV cache: a prompt's block hashes and its longest cached prefix.

The hash chain (muestra.runtime.prefix_hash, which the lm service uses too): h_0 = blake2b-128("muestra-prefix-v1|"
+ model fingerprint), h_i = blake2b-128(h_{i-1} | block i's ids as little-endian uint32), over the prompt's
full blocks, leaving its last token out. With Redis, one pipelined EXISTS over the blocks' keys finds how
many leading blocks are stored. Without Redis every lm replica keeps its own blocks in process, which the
gateway cannot see: it then sends every block with cached_blocks = all of them, and the lm uses the
longest prefix it holds. Redis failing makes a lookup a miss, counted, with one log line per incident, and
lookups skip it for a backoff window (muestra.runtime.calls.BackendHealth).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence

from prometheus_client import Counter, Histogram

from muestra.runtime.calls import BackendHealth
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
TIER_HITS = Counter(
    "muestra_prefix_cache_tier_hits_total",
    "Prompt tokens the lm reused, by tier: hot (the lm's memory of finished rows) or shared (Redis, in-process store)",
    ["model", "tier"],
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


class LookupHealth(BackendHealth):
    """The health of the Redis that lookups go to (muestra.runtime.calls.BackendHealth), on the gateway's counters."""

    def __init__(self, where: str) -> None:
        super().__init__(
            f"prefix cache: {where}",
            "every request is a miss",
            log,
            errors=ERRORS,
            incidents=INCIDENTS,
            skipped=SKIPPED,
        )
        self.where = where


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

    async def prefix_blocks(self, prompt_ids: Sequence[int], conversation: bool = False) -> lm_pb2.PrefixBlocks:
        """The prefix instructions for this prompt; a conversation's row is written when it ends, on first sight."""
        QUERIES.labels(self.model).inc(len(prompt_ids))
        hashes = block_hashes(self.fingerprint, prompt_ids, self.block_size)
        # A prompt without a full block still asks: the lm keeps its row's KV once it is done (its next turn's).
        cached = 0 if not hashes else len(hashes) if self.redis is None else await self._leading_present(hashes)
        return lm_pb2.PrefixBlocks(
            block_size=self.block_size, block_hashes=hashes, cached_blocks=cached, write=True,
            write_on_leave=conversation,
        )  # fmt: skip

    async def _leading_present(self, hashes: list[bytes]) -> int:
        """How many leading blocks Redis holds (0 when it fails), in one round trip."""
        if not self.health.should_try("lookup"):
            return 0
        import redis

        started = time.perf_counter()
        try:
            async with self.redis.pipeline(transaction=False) as pipe:
                for block_hash in hashes:
                    pipe.exists(self.key_prefix + block_hash.hex())
                present = await asyncio.wait_for(pipe.execute(), self.pipeline_timeout_s)
        except (redis.RedisError, OSError, asyncio.TimeoutError) as exc:
            self.health.failed("lookup", exc)
            return 0
        REDIS_SECONDS.observe(time.perf_counter() - started)
        self.health.succeeded("lookup")
        cached = next((i for i, n in enumerate(present) if not n), len(present))
        FOUND.labels(self.model).inc(cached * self.block_size)
        return cached

    def record_hit(self, cached_tokens: int, tier: str = "") -> None:
        HITS.labels(self.model).inc(cached_tokens)
        if tier:
            TIER_HITS.labels(self.model, tier).inc(cached_tokens)


def open_redis(url: str, timeout_s: float, password: str = ""):
    """An asyncio Redis client with short timeouts and no client-side retries."""
    import redis.asyncio
    from redis.asyncio.retry import Retry
    from redis.backoff import NoBackoff

    return redis.asyncio.Redis.from_url(
        url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s, retry=Retry(NoBackoff(), 0),
        **({"password": password} if password else {}),
    )  # fmt: skip

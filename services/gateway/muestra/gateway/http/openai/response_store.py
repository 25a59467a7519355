"""Stored responses of /v1/responses: each under the API key that made it, for a TTL, in Redis or in process.

A record is one JSON object: the response as the API returns it, the request's own input items, and the whole
conversation up to and including this response's output (what `previous_response_id` continues). Another key's
records are out of reach: the owner, a digest of the API key, is part of every record's key.
"""

from __future__ import annotations

import asyncio
import collections
import hashlib
import json
import logging
import time

from prometheus_client import Counter

from muestra.gateway.http.errors import OpenAIError

log = logging.getLogger("muestra.gateway.responses")

STORE_ERRORS = Counter(
    "muestra_responses_store_errors_total", "Calls to the stored responses' Redis that failed", ["operation"]
)


def owner_of(api_key: str | None) -> str:
    """The key space of one API key (a digest: the key itself is never stored); "-" on a gateway without keys."""
    if not api_key:
        return "-"
    return hashlib.blake2b(api_key.encode(), digest_size=12, person=b"muestra-resp").hexdigest()


def unavailable(operation: str) -> OpenAIError:
    return OpenAIError(
        503, f"the stored responses are unavailable (Redis did not answer the {operation}); try again",
        "server_error", None, "store_unavailable",
    )  # fmt: skip


class MemoryStore:
    """In process: the most recent records, at most `max_records` of them and `max_bytes` of JSON together, each
    for `ttl_s` seconds. Lost when the gateway stops."""

    where = "in process"

    def __init__(self, ttl_s: float, max_records: int, max_bytes: int = 256 * 1024 * 1024) -> None:
        self.ttl_s = ttl_s
        self.max_records = max_records
        self.max_bytes = max_bytes
        self.nbytes = 0
        self.records: collections.OrderedDict[tuple[str, str], tuple[float, str]] = collections.OrderedDict()

    def _drop(self, key: tuple[str, str]) -> None:
        _, text = self.records.pop(key)
        self.nbytes -= len(text)

    async def put(self, owner: str, response_id: str, record: dict) -> None:
        key = (owner, response_id)
        if key in self.records:
            self._drop(key)
        text = json.dumps(record, ensure_ascii=False)
        self.records[key] = (time.monotonic() + self.ttl_s, text)
        self.nbytes += len(text)
        while self.records and (len(self.records) > self.max_records or self.nbytes > self.max_bytes):
            self._drop(next(iter(self.records)))

    async def get(self, owner: str, response_id: str) -> dict | None:
        found = self.records.get((owner, response_id))
        if found is None:
            return None
        expires, text = found
        if time.monotonic() >= expires:
            self._drop((owner, response_id))
            return None
        return json.loads(text)

    async def delete(self, owner: str, response_id: str) -> bool:
        if await self.get(owner, response_id) is None:
            return False
        self._drop((owner, response_id))
        return True

    async def close(self) -> None:
        self.records.clear()
        self.nbytes = 0


class RedisStore:
    """In the deployment's Redis, under `key_prefix` + owner + id, each with Redis's own expiry (SET EX)."""

    def __init__(self, redis, key_prefix: str, ttl_s: float, where: str, timeout_s: float = 1.0) -> None:
        self.redis = redis
        self.key_prefix = key_prefix
        self.ttl_ms = max(1, int(ttl_s * 1000))
        self.where = where
        self.timeout_s = timeout_s

    def key(self, owner: str, response_id: str) -> str:
        return f"{self.key_prefix}{owner}:{response_id}"

    async def _call(self, operation: str, call):
        import redis

        try:
            return await asyncio.wait_for(call, self.timeout_s)
        except (redis.RedisError, OSError, asyncio.TimeoutError) as exc:
            STORE_ERRORS.labels(operation).inc()
            log.warning("stored responses: %s at %s failed: %s", operation, self.where, exc)
            raise unavailable(operation) from None

    async def put(self, owner: str, response_id: str, record: dict) -> None:
        text = json.dumps(record, ensure_ascii=False)
        await self._call("write", self.redis.set(self.key(owner, response_id), text, px=self.ttl_ms))

    async def get(self, owner: str, response_id: str) -> dict | None:
        text = await self._call("read", self.redis.get(self.key(owner, response_id)))
        return None if text is None else json.loads(text)

    async def delete(self, owner: str, response_id: str) -> bool:
        return bool(await self._call("delete", self.redis.delete(self.key(owner, response_id))))

    async def close(self) -> None:
        await self.redis.aclose()


def open_store(config):
    """Redis when the gateway has --responses-redis-url or --redis-url (a client of its own, with a longer timeout
    than the prefix lookups'), else in process."""
    url = config.responses_redis_url or config.redis_url
    if not url:
        log.info(
            "stored responses: in process (no --redis-url): the latest %d (at most %d MiB), for %gs, lost at restart",
            config.responses_max_stored, config.responses_max_stored_mib, config.responses_ttl_s,
        )  # fmt: skip
        return MemoryStore(config.responses_ttl_s, config.responses_max_stored, config.responses_max_stored_mib << 20)
    from muestra.gateway.engine.prefix import open_redis
    from muestra.runtime.logs import without_password

    where = f"Redis at {without_password(url)}"
    timeout_s = max(1.0, config.redis_timeout_s)
    # --redis-password is --redis-url's; a Redis of their own has its password in its URL.
    client = open_redis(url, timeout_s, "" if config.responses_redis_url else config.redis_password)
    log.info("stored responses: %s, keys %s*, for %gs", where, config.responses_key_prefix, config.responses_ttl_s)
    return RedisStore(client, config.responses_key_prefix, config.responses_ttl_s, where, timeout_s)

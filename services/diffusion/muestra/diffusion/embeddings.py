"""An optional Redis cache of text-encoder outputs, under the same key rules as the prefix KV cache.

A key hashes a model fingerprint (the text encoder's weight files, its dtype and device type) with the
prompt's token ids, so equal prompts give equal keys on every replica and after every restart. A value is a
one-line JSON header (format version, dtype, shape) followed by the tensor's raw bytes, then a keyed MAC
(muestra.runtime.cache_mac) over both; never pickle. A corrupt, foreign or forged entry is a miss. Redis
being down or slow makes every lookup a miss, logged (one line when it fails, one when it is back) and counted;
no request fails because of the cache, and while Redis fails the cache skips it but for one probe per backoff
window (1 s, doubling to 16 s).
Eviction is Redis's own (maxmemory + LRU, TTLs).
"""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path
from typing import Protocol

import numpy as np
import torch
from prometheus_client import Counter

from muestra.runtime.cache_mac import MAC_BYTES, CacheMac
from muestra.runtime.calls import BackendHealth

log = logging.getLogger("muestra.diffusion.embeddings")

FORMAT_VERSION = 2  # 2: a keyed MAC where version 1 had an unkeyed SHA-256
KEY_PREFIX = "muestra:diffusion:text-embedding:v2:"
QUERIES = Counter("muestra_diffusion_text_embedding_cache_queries_total", "Text-embedding cache lookups")
HITS = Counter("muestra_diffusion_text_embedding_cache_hits_total", "Text-embedding cache lookups that hit")
ERRORS = Counter(
    "muestra_diffusion_text_embedding_cache_errors_total", "Cache reads or writes that failed (Redis down or slow)"
)
INCIDENTS = Counter(
    "muestra_diffusion_text_embedding_cache_incidents_total", "Times Redis went from answering the cache to failing"
)
SKIPPED = Counter(
    "muestra_diffusion_text_embedding_cache_skipped_total", "Cache reads or writes skipped during a failure's backoff"
)
CORRUPT = Counter("muestra_diffusion_text_embedding_cache_corrupt_total", "Entries ignored as corrupt or foreign")
_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


class TextEmbeddingCache(Protocol):
    """Where the engine looks up and stores text-encoder outputs."""

    def get(self, key: str) -> torch.Tensor | None: ...

    def put(self, key: str, embeddings: torch.Tensor) -> None: ...


def text_encoder_fingerprint(folder: Path, dtype: torch.dtype, device: torch.device) -> bytes:
    """SHA-256 over the text encoder's files (names and bytes), its dtype and its device type."""
    digest = hashlib.sha256(f"{dtype}|{device.type}".encode())
    for path in sorted(p for p in (folder / "text_encoder").rglob("*") if p.is_file()):
        digest.update(path.name.encode() + b"\0")
        with open(path, "rb") as file:
            for block in iter(lambda: file.read(1 << 20), b""):
                digest.update(block)
    return digest.digest()


def embedding_key(fingerprint: bytes, token_ids: list[int]) -> str:
    ids = np.asarray(token_ids, dtype="<i8").tobytes()
    return KEY_PREFIX + hashlib.sha256(fingerprint + ids).hexdigest()


def encode_entry(embeddings: torch.Tensor, mac: CacheMac) -> bytes:
    array = embeddings.detach().to("cpu").contiguous()
    payload = array.reshape(-1).view(torch.uint8).numpy().tobytes()
    header = {"v": FORMAT_VERSION, "dtype": str(array.dtype).removeprefix("torch."), "shape": list(array.shape)}
    body = json.dumps(header, separators=(",", ":")).encode() + b"\n" + payload
    return body + mac.sign(body)


def decode_entry(blob: bytes, mac: CacheMac) -> torch.Tensor | None:
    """The tensor in `blob`, or None when the entry is corrupt, forged or in a format this code does not know."""
    try:
        body, signature = blob[:-MAC_BYTES], blob[-MAC_BYTES:]
        if len(blob) <= MAC_BYTES or not mac.verify(signature, body):
            return None
        head, _, payload = body.partition(b"\n")
        header = json.loads(head)
        dtype = _DTYPES[header["dtype"]]
        shape = [int(n) for n in header["shape"]]
        if header["v"] != FORMAT_VERSION:
            return None
        raw = torch.frombuffer(bytearray(payload), dtype=torch.uint8)
        return raw.view(dtype).reshape(shape).clone()
    except (ValueError, KeyError, TypeError, RuntimeError):
        return None


class RedisTextEmbeddingCache:
    """TextEmbeddingCache on Redis, with short timeouts; failures are misses, and a failing Redis is skipped
    between probes (muestra.runtime.calls.BackendHealth: 1 s, doubling up to 16 s)."""

    def __init__(self, url: str, ttl_s: int, mac: CacheMac, timeout_s: float = 0.25, password: str = "") -> None:
        import redis
        from redis.backoff import NoBackoff
        from redis.retry import Retry

        self._redis_errors = (redis.RedisError, OSError)
        self.mac = mac
        self.client = redis.Redis.from_url(
            url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s,
            # No client-side retries: a failure is a miss now, and the health's backoff decides when to try again.
            retry=Retry(NoBackoff(), 0),
            **({"password": password} if password else {}),
        )  # fmt: skip
        self.ttl_s = ttl_s
        self.health = BackendHealth(
            "text-embedding cache", "every prompt is encoded without the cache", log,
            errors=ERRORS, incidents=INCIDENTS, skipped=SKIPPED,
        )  # fmt: skip

    def get(self, key: str) -> torch.Tensor | None:
        QUERIES.inc()
        if not self.health.should_try("read"):
            return None
        try:
            blob = self.client.get(key)
        except self._redis_errors as exc:
            self.health.failed("read", exc)
            return None
        self.health.succeeded("read")
        if blob is None:
            return None
        embeddings = decode_entry(blob, self.mac)
        if embeddings is None:
            CORRUPT.inc()
            return None
        HITS.inc()
        return embeddings

    def put(self, key: str, embeddings: torch.Tensor) -> None:
        if not self.health.should_try("write"):
            return
        try:
            self.client.set(key, encode_entry(embeddings, self.mac), ex=self.ttl_s if self.ttl_s > 0 else None)
        except self._redis_errors as exc:
            self.health.failed("write", exc)
            return
        self.health.succeeded("write")

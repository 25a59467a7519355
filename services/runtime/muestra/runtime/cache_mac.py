"""Keyed MACs on the blocks that services keep in a shared cache (Redis): KV blocks, text embeddings.

Anyone who can write to the cache could otherwise store a well-formed block that changes every later
output for that prefix. A block carries BLAKE2b-128 keyed with the deployment's cache key over its
header and payload; a block whose MAC does not verify is a miss (and is overwritten).
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import secrets

log = logging.getLogger("muestra.runtime.cache")

MAC_BYTES = 16


class CacheMac:
    """MACs under one key: `cache_key` from the settings, or a random one for this process."""

    def __init__(self, cache_key: str, what: str) -> None:
        self.random = not cache_key
        if self.random:
            log.warning(
                "%s: no cache_key configured (MUESTRA_CACHE_KEY or --cache-key-file): blocks are signed with a "
                "random key, so other replicas and later runs of this one cannot use them",
                what,
            )
        secret = cache_key.encode() if cache_key else secrets.token_bytes(32)
        # Any length of secret gives a full-size BLAKE2b key.
        self.key = hashlib.blake2b(secret, digest_size=64, person=b"muestra-cache").digest()

    def sign(self, *parts) -> bytes:
        mac = hashlib.blake2b(key=self.key, digest_size=MAC_BYTES)
        for part in parts:
            mac.update(part)
        return mac.digest()

    def verify(self, expected: bytes, *parts) -> bool:
        return hmac.compare_digest(self.sign(*parts), bytes(expected))

"""The prompt-prefix cache's block keys, shared by the gateway (lookups) and the lm (checks and writes).

h_0 = blake2b-128("muestra-prefix-v1|" + model fingerprint); h_i = blake2b-128(h_{i-1} | block i's ids as
little-endian uint32). Only full blocks count, and they cover at most len(prompt) - 1 tokens: the last
token is always run. Equal prefixes of one model give equal hashes on every replica and after every
restart, and another model never shares one (docs/prefix_cache.md).
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Sequence

HASH_BYTES = 16
ROOT_TAG = b"muestra-prefix-v1|"


def chain_root(fingerprint: str) -> bytes:
    return hashlib.blake2b(ROOT_TAG + fingerprint.encode(), digest_size=HASH_BYTES).digest()


def block_hashes(fingerprint: str, ids: Sequence[int], block_size: int) -> list[bytes]:
    """The chained hash of every full block of a prompt, leaving its last token out."""
    count = max(len(ids) - 1, 0) // block_size
    data = struct.pack(f"<{count * block_size}I", *(int(i) for i in ids[: count * block_size]))
    step = 4 * block_size
    hashes, parent = [], chain_root(fingerprint)
    for i in range(count):
        parent = hashlib.blake2b(parent + data[i * step : (i + 1) * step], digest_size=HASH_BYTES).digest()
        hashes.append(parent)
    return hashes

"""One prefix-cache block as stored: a fixed little-endian header (`_HEADER`), then the block's KV.

The KV is every past input of the model (layer 0 key, layer 0 value, layer 1 key, ...) as [kv_heads,
block_size, head_dim] in the KV dtype. The header holds a keyed MAC (muestra.runtime.cache_mac) over the
rest of the header and the payload; decode() refuses a block whose header, size, MAC or fingerprint does
not match.
"""

from __future__ import annotations

import hashlib
import hmac
import struct
from collections.abc import Sequence

import numpy as np

from muestra.runtime.cache_mac import MAC_BYTES, CacheMac

FORMAT_VERSION = 2  # 2: a keyed MAC where version 1 had an unkeyed xxh3 checksum
MAGIC = b"MKV\x01"
# magic, version, dtype code, 0, layers, kv heads, head dim, block tokens, payload bytes,
# the MAC, blake2b-128 of the fingerprint, the block's hash.
_HEADER = struct.Struct("<4sHBBIIIIQ16s16s16s")
# The MAC covers the header around it and the payload.
_MAC_AT = struct.calcsize("<4sHBBIIIIQ")
_MAC_END = _MAC_AT + MAC_BYTES
_DTYPE_CODES = {np.dtype(np.float32): 1, np.dtype(np.float16): 2}


class BlockFormat:
    """Header and payload of one block of one model's KV."""

    def __init__(
        self, fingerprint: str, num_layers: int, num_kv_heads: int, head_dim: int, dtype: np.dtype, mac: CacheMac
    ) -> None:
        self.mac = mac
        self.fingerprint_digest = hashlib.blake2b(fingerprint.encode(), digest_size=16).digest()
        self.num_layers, self.num_kv_heads, self.head_dim = num_layers, num_kv_heads, head_dim
        self.num_tensors = 2 * num_layers
        self.dtype = np.dtype(dtype)
        self.dtype_code = _DTYPE_CODES[self.dtype]

    def payload_bytes(self, block_size: int) -> int:
        return self.num_tensors * self.num_kv_heads * block_size * self.head_dim * self.dtype.itemsize

    def encode(self, arrays: Sequence[np.ndarray], start: int, block_size: int, block_hash: bytes) -> bytearray:
        """Header + positions [start, start + block_size) of every tensor ([kv_heads, length, head_dim])."""
        size = self.payload_bytes(block_size)
        value = bytearray(_HEADER.size + size)
        payload = np.frombuffer(value, dtype=self.dtype, offset=_HEADER.size).reshape(
            self.num_tensors, self.num_kv_heads, block_size, self.head_dim
        )
        for t, array in enumerate(arrays):
            payload[t] = array[:, start : start + block_size]
        _HEADER.pack_into(
            value, 0, MAGIC, FORMAT_VERSION, self.dtype_code, 0, self.num_layers, self.num_kv_heads,
            self.head_dim, block_size, size, bytes(MAC_BYTES), self.fingerprint_digest,
            block_hash[:16].ljust(16, b"\0"),
        )  # fmt: skip
        value[_MAC_AT:_MAC_END] = self._mac_of(value)
        return value

    def _mac_of(self, value) -> bytes:
        view = memoryview(value)
        return self.mac.sign(view[:_MAC_AT], view[_MAC_END:])

    def decode(self, value, block_size: int, block_hash: bytes, verify_mac: bool) -> np.ndarray | None:
        """The block as [tensors, kv_heads, block_size, head_dim] (a view on `value`), or None if it is not ours."""
        size = self.payload_bytes(block_size)
        if len(value) != _HEADER.size + size:
            return None
        fields = _HEADER.unpack_from(value, 0)
        expected = (
            MAGIC, FORMAT_VERSION, self.dtype_code, 0, self.num_layers, self.num_kv_heads, self.head_dim,
            block_size, size,
        )  # fmt: skip
        if fields[:9] != expected or fields[10] != self.fingerprint_digest:
            return None
        if fields[11] != block_hash[:16].ljust(16, b"\0"):
            return None
        if verify_mac and not hmac.compare_digest(self._mac_of(value), fields[9]):
            return None
        return np.frombuffer(value, dtype=self.dtype, offset=_HEADER.size).reshape(
            self.num_tensors, self.num_kv_heads, block_size, self.head_dim
        )

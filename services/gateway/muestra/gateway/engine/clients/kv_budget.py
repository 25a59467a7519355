"""A replica's KV layout and budget as the lm's Describe gives them, counted in bytes as the lm counts them
(generation/kv_admission.py admits requests by it)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from muestra.v1 import common_pb2, lm_pb2

DTYPE_BYTES = {
    common_pb2.FLOAT32: 4, common_pb2.FLOAT16: 2, common_pb2.BFLOAT16: 2, common_pb2.INT8: 1, common_pb2.UINT8: 1,
}  # fmt: skip
# SharedKV.BLOCK: a shared buffer's capacity grows in blocks of this many positions.
SHARED_BLOCK = 256


@dataclasses.dataclass(frozen=True)
class KvBudget:
    """A replica's KV layout and budget, as its Describe gives them."""

    storage: str  # "concat" or "shared"
    bytes_per_token: int  # keys and values of one position of one row, over every layer
    context_length: int
    budget_bytes: int

    @classmethod
    def from_describe(cls, info: lm_pb2.DescribeModelResponse) -> KvBudget | None:
        """None when the lm does not say enough to count its bytes: its rows are then admitted by count alone."""
        kv = info.kv
        itemsize = DTYPE_BYTES.get(kv.dtype)
        if kv.storage not in ("concat", "shared") or itemsize is None or not info.load.kv_budget_bytes:
            return None
        per_token = 2 * kv.num_layers * kv.num_kv_heads * kv.head_dim * itemsize
        return cls(kv.storage, per_token, info.context_length, info.load.kv_budget_bytes)

    def capacity_for(self, length: int) -> int:
        """Positions a shared buffer holds for a longest row of `length` (SharedKV.capacity_for)."""
        return min(-(-max(length, 1) // SHARED_BLOCK) * SHARED_BLOCK, max(self.context_length, length))

    def batch_bytes(self, lengths: Sequence[int]) -> int:
        """KV bytes of a batch of rows holding these lengths, as the lm counts them (bytes_for)."""
        longest = max(lengths, default=0)
        width = self.capacity_for(longest) if self.storage == "shared" else longest
        return len(lengths) * width * self.bytes_per_token

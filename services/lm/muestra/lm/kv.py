"""KV storage of one batch: the past keys and values a step reads, and how rows are copied.

`ConcatKV` serves graphs in optimum's layout, which take the past and return past+new as the
present. The present of one step is kept as is and bound as the next step's past, so a decode
step copies nothing here; only `select` (Filter) and `concatenate` (joining batches) copy.

A shared-buffer storage (one preallocated [rows, heads, capacity, head_dim] buffer bound as both
past and present, as GroupQueryAttention graphs allow) would implement the same methods.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import onnxruntime as ort

ToDevice = Callable[[np.ndarray], ort.OrtValue]


class ConcatKV:
    """Left-padded past keys and values, one OrtValue [rows, kv_heads, past, head_dim] per layer and kind."""

    storage = "concat"

    def __init__(self, values: list[ort.OrtValue]) -> None:
        self.values = values
        shape = values[0].shape()
        self.rows, self.past_length = int(shape[0]), int(shape[2])
        self._bytes_per_tensor = values[0].tensor_size_in_bytes()

    @classmethod
    def from_numpy(cls, arrays: Sequence[np.ndarray], to_device: ToDevice) -> ConcatKV:
        return cls([to_device(a) for a in arrays])

    @property
    def nbytes(self) -> int:
        return self._bytes_per_tensor * len(self.values)

    def host_arrays(self) -> list[np.ndarray]:
        """The tensors as numpy arrays (views on CPU, copies from a GPU)."""
        return [v.numpy() for v in self.values]

    def after_step(self, presents: list[ort.OrtValue]) -> ConcatKV:
        """The storage after a step: the graph's presents become the past."""
        return ConcatKV(presents)

    def select(self, rows: Sequence[int], keep_last: int, to_device: ToDevice) -> ConcatKV:
        """Rows in a new order (repeats allowed), keeping only the last `keep_last` positions."""
        index = np.asarray(rows, dtype=np.int64)
        start = self.past_length - keep_last
        return ConcatKV.from_numpy([a[index, :, start:, :] for a in self.host_arrays()], to_device)

    @staticmethod
    def concatenate(parts: Sequence[ConcatKV], past_length: int, to_device: ToDevice) -> ConcatKV:
        """Stack the rows of `parts`, each left-padded (or left-trimmed) to `past_length` positions."""
        hosts = [p.host_arrays() for p in parts]
        rows = sum(p.rows for p in parts)
        joined = []
        for tensor in range(len(hosts[0])):
            first = hosts[0][tensor]
            out = np.zeros((rows, first.shape[1], past_length, first.shape[3]), first.dtype)
            row = 0
            for part, arrays in zip(parts, hosts, strict=True):
                keep = min(part.past_length, past_length)
                if keep:
                    source = arrays[tensor][:, :, part.past_length - keep :]
                    out[row : row + part.rows, :, past_length - keep :, :] = source
                row += part.rows
            joined.append(out)
        return ConcatKV.from_numpy(joined, to_device)

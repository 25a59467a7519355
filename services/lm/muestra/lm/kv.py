"""KV storage of one batch: where each row's keys and values sit, and the masks a step needs.

Two layouts, chosen by the graph:

- `ConcatKV` (optimum's layout): the graph takes the past and returns past+new as the present.
  Rows are left-padded. A step's presents are kept as they are and bound as the next past, so a
  step copies nothing here, though the graph itself copies the past into each new present.
- `SharedKV` (GroupQueryAttention graphs, onnxruntime-genai's layout): one preallocated buffer
  [rows, kv_heads, capacity, head_dim] per layer and kind is bound as both past and present, and
  the graph writes the new positions in place. Rows are right-padded: row i holds positions
  [0, lengths[i]) and the graph reads each row's length from the attention mask.

Only Filter (`select`), joining batches (`concatenate`), a shared buffer's growth and a left-padded
batch's rollback of rejected draft tokens copy KV; a shared buffer's rollback is its rows' lengths.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import onnxruntime as ort

ToDevice = Callable[[np.ndarray], ort.OrtValue]


def _ceil_to(value: int, step: int) -> int:
    return -(-value // step) * step


def _stacked(parts: Sequence[list[np.ndarray]], rows: int, width: int, left_padded: bool) -> list[np.ndarray]:
    """Per tensor, the parts' [rows, kv_heads, positions, head_dim] arrays stacked into one `width` wide.

    A left-padded part keeps its last `width` positions, at the right end; a right-padded one its first.
    """
    joined = []
    for tensor in range(len(parts[0])):
        first = parts[0][tensor]
        out = np.zeros((rows, first.shape[1], width, first.shape[3]), first.dtype)
        row = 0
        for arrays in parts:
            part = arrays[tensor]
            keep = min(part.shape[2], width)
            if left_padded:
                out[row : row + len(part), :, width - keep :] = part[:, :, part.shape[2] - keep :]
            else:
                out[row : row + len(part), :, :keep] = part[:, :, :keep]
            row += len(part)
        joined.append(out)
    return joined


class ConcatKV:
    """Left-padded past keys and values, one OrtValue [rows, kv_heads, past, head_dim] per tensor."""

    storage = "concat"
    shares_buffer = False

    def __init__(self, values: list[ort.OrtValue]) -> None:
        self.values = values
        shape = values[0].shape()
        self.rows, self.width = int(shape[0]), int(shape[2])
        self.nbytes = values[0].tensor_size_in_bytes() * len(values)

    @staticmethod
    def bytes_for(lengths: Sequence[int], bytes_per_token: int, limit: int) -> int:
        """KV bytes of a batch of rows holding these lengths."""
        return len(lengths) * max(lengths, default=0) * bytes_per_token

    # Prompts are padded on this side in a batched prefill.
    left_padded = True

    @classmethod
    def from_rows(cls, pasts: Sequence[list[np.ndarray]], to_device: ToDevice, limit: int, hold: int = 0) -> ConcatKV:
        """Rows from per-row tensors [kv_heads, length, head_dim] (length may be 0), left-padded.

        `hold` is how many positions the rows will hold after the coming step (a shared buffer's room).
        """
        width = max(p[0].shape[1] for p in pasts)
        if len(pasts) == 1 and all(a.flags.c_contiguous for a in pasts[0]):
            # One row needs no padding (a prefix-cache hit runs alone): its arrays are used as they are.
            return cls([to_device(a[None]) for a in pasts[0]])
        joined = _stacked([[a[None] for a in past] for past in pasts], len(pasts), width, left_padded=True)
        return cls([to_device(a) for a in joined])

    def feeds(self, lengths: np.ndarray, new: int) -> tuple[np.ndarray, np.ndarray]:
        """Attention mask and position ids of a step that appends `new` positions; rows then hold `lengths`."""
        width = self.width + new
        mask = (np.arange(width)[None, :] >= (width - lengths)[:, None]).astype(np.int64)
        # Padding gets position 0, which the mask hides.
        positions = np.maximum(np.arange(new)[None, :] + (lengths - new)[:, None], 0).astype(np.int64)
        return mask, positions

    def logit_positions(self, lengths: np.ndarray, new: int) -> None:
        """Which position of a step's logits is each row's last token (None: the last one)."""
        return None

    def ready(self, max_length: int, to_device: ToDevice, limit: int) -> ConcatKV:
        return self

    def after_step(self, presents: list[ort.OrtValue]) -> ConcatKV:
        return ConcatKV(presents)

    def host_arrays(self) -> list[np.ndarray]:
        """The tensors as numpy arrays (views on CPU, copies from a GPU)."""
        return [v.numpy() for v in self.values]

    def row_arrays(self, row: int, length: int) -> list[np.ndarray]:
        """Row `row`'s KV of its `length` positions, one [kv_heads, length, head_dim] array per tensor."""
        return [a[row, :, self.width - length :] for a in self.host_arrays()]

    def rollback(self, lengths: np.ndarray, drop: np.ndarray, to_device: ToDevice) -> ConcatKV:
        """Rows holding `lengths` without their last `drop` positions, realigned to the right end (one copy)."""
        kept = lengths - drop
        width = int(kept.max())
        out = []
        for a in self.host_arrays():
            buffer = np.zeros((a.shape[0], a.shape[1], width, a.shape[3]), a.dtype)
            for row in range(a.shape[0]):
                end = self.width - int(drop[row])
                buffer[row, :, width - int(kept[row]) :] = a[row, :, end - int(kept[row]) : end]
            out.append(buffer)
        return ConcatKV([to_device(a) for a in out])

    def select(self, rows: Sequence[int], lengths: np.ndarray, to_device: ToDevice, limit: int) -> ConcatKV:
        """Rows in a new order (repeats allowed), dropping left padding that no kept row needs."""
        index = np.asarray(rows, dtype=np.int64)
        start = self.width - int(lengths.max())
        return ConcatKV([to_device(a[index, :, start:, :]) for a in self.host_arrays()])

    @staticmethod
    def concatenate(parts: Sequence[ConcatKV], lengths: np.ndarray, to_device: ToDevice, limit: int) -> ConcatKV:
        """The rows of `parts` stacked, each left-padded (or left-trimmed) to the longest row."""
        joined = _stacked([p.host_arrays() for p in parts], len(lengths), int(lengths.max()), left_padded=True)
        return ConcatKV([to_device(a) for a in joined])


class SharedKV:
    """Right-padded buffers [rows, kv_heads, capacity, head_dim], bound as both past and present."""

    storage = "shared"
    shares_buffer = True
    # Capacity grows in blocks of this many positions (each growth copies the buffers once).
    BLOCK = 256

    def __init__(self, values: list[ort.OrtValue]) -> None:
        self.values = values
        shape = values[0].shape()
        self.rows, self.capacity = int(shape[0]), int(shape[2])
        self.nbytes = values[0].tensor_size_in_bytes() * len(values)

    @classmethod
    def capacity_for(cls, length: int, limit: int) -> int:
        return min(_ceil_to(max(length, 1), cls.BLOCK), max(limit, length))

    @classmethod
    def bytes_for(cls, lengths: Sequence[int], bytes_per_token: int, limit: int) -> int:
        return len(lengths) * cls.capacity_for(max(lengths, default=0), limit) * bytes_per_token

    left_padded = False

    @classmethod
    def from_rows(cls, pasts: Sequence[list[np.ndarray]], to_device: ToDevice, limit: int, hold: int = 0) -> SharedKV:
        """Rows from per-row tensors [kv_heads, length, head_dim] (length may be 0), right-padded."""
        capacity = cls.capacity_for(max(hold, *(p[0].shape[1] for p in pasts)), limit)
        joined = _stacked([[a[None] for a in past] for past in pasts], len(pasts), capacity, left_padded=False)
        return cls([to_device(a) for a in joined])

    def feeds(self, lengths: np.ndarray, new: int) -> tuple[np.ndarray, np.ndarray]:
        width = int(lengths.max())
        mask = (np.arange(width)[None, :] < lengths[:, None]).astype(np.int64)
        # Rows with fewer than `new` tokens are padded on the right; their padding positions don't matter.
        start = np.maximum(lengths - new, 0)
        positions = (np.arange(new)[None, :] + start[:, None]).astype(np.int64)
        return mask, positions

    def logit_positions(self, lengths: np.ndarray, new: int) -> np.ndarray:
        """A right-padded prompt's last token is at its own length, not at the step's last position."""
        return np.minimum(lengths, new) - 1

    def ready(self, max_length: int, to_device: ToDevice, limit: int) -> SharedKV:
        """This storage, or a copy with room for `max_length` positions per row."""
        if max_length <= self.capacity:
            return self
        capacity = self.capacity_for(max_length, limit)
        grown = []
        for a in self.host_arrays():
            out = np.zeros((a.shape[0], a.shape[1], capacity, a.shape[3]), a.dtype)
            out[:, :, : self.capacity] = a
            grown.append(out)
        return SharedKV([to_device(a) for a in grown])

    def after_step(self, presents: list[ort.OrtValue]) -> SharedKV:
        return self

    def rollback(self, lengths: np.ndarray, drop: np.ndarray, to_device: ToDevice) -> SharedKV:
        """Positions past a row's length are never read, and the next step writes over them: nothing to copy."""
        return self

    def row_view(self, row: int, to_device: ToDevice) -> SharedKV:
        """Row `row` as a batch of one over the same memory (CPU buffers only): a step on it writes in place."""
        return SharedKV([to_device(a[row : row + 1]) for a in self.host_arrays()])

    def host_arrays(self) -> list[np.ndarray]:
        return [v.numpy() for v in self.values]

    def row_arrays(self, row: int, length: int) -> list[np.ndarray]:
        return [a[row, :, :length] for a in self.host_arrays()]

    def select(self, rows: Sequence[int], lengths: np.ndarray, to_device: ToDevice, limit: int) -> SharedKV:
        index = np.asarray(rows, dtype=np.int64)
        capacity = self.capacity_for(int(lengths.max()), limit)
        keep = min(capacity, self.capacity)
        out = []
        for a in self.host_arrays():
            buffer = np.zeros((len(index), a.shape[1], capacity, a.shape[3]), a.dtype)
            buffer[:, :, :keep] = a[index, :, :keep]
            out.append(buffer)
        return SharedKV([to_device(a) for a in out])

    @staticmethod
    def concatenate(parts: Sequence[SharedKV], lengths: np.ndarray, to_device: ToDevice, limit: int) -> SharedKV:
        capacity = SharedKV.capacity_for(int(lengths.max()), limit)
        joined = _stacked([p.host_arrays() for p in parts], len(lengths), capacity, left_padded=False)
        return SharedKV([to_device(a) for a in joined])

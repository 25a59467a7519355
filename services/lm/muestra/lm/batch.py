"""A batch of rows whose KV stays in the service between calls (TGI's CausalLMBatch, on onnxruntime).

Rows are left-padded: row i's tokens fill the last `lengths[i]` positions of the KV, and the
attention mask and position ids are derived from `lengths`, so a row's logits do not depend on
which other rows share its batch.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from muestra.lm.kv import ConcatKV
from muestra.lm.model import OnnxDecoder

# What a row wants from each step: (OutputKind, top_n).
OutputSpec = tuple[int, int]


def attention_mask(lengths: np.ndarray, width: int) -> np.ndarray:
    """1 on each row's last `lengths[i]` of `width` positions, 0 on its left padding."""
    return (np.arange(width)[None, :] >= (width - lengths)[:, None]).astype(np.int64)


def position_ids(lengths: np.ndarray, width: int) -> np.ndarray:
    """Positions of the last `width` tokens of each row (padding gets 0, which the mask hides)."""
    return np.maximum(np.arange(width)[None, :] + (lengths - width)[:, None], 0).astype(np.int64)


@dataclasses.dataclass
class Batch:
    request_ids: list[str]
    # Tokens of each row held in the KV (prompt, cached prefix and generated so far).
    lengths: np.ndarray
    kv: ConcatKV
    outputs: list[OutputSpec]

    @property
    def rows(self) -> int:
        return len(self.request_ids)

    @property
    def nbytes(self) -> int:
        return self.kv.nbytes

    @classmethod
    def from_prefill(
        cls,
        decoder: OnnxDecoder,
        prompts: Sequence[np.ndarray],
        request_ids: Sequence[str],
        outputs: Sequence[OutputSpec],
        pasts: Sequence[list[np.ndarray] | None] | None = None,
    ) -> tuple[Batch, np.ndarray, int]:
        """Run the prompts and keep their KV; returns the batch, last-position logits, forward µs.

        `pasts[i]`, when given, is row i's KV of tokens before its prompt (one [kv_heads, p,
        head_dim] array per past input); such rows run alone and are then joined to the rest.
        """
        pasts = list(pasts) if pasts is not None else [None] * len(prompts)
        fresh = [i for i, p in enumerate(pasts) if p is None]
        groups: list[tuple[list[int], Batch, np.ndarray]] = []
        forward_us = 0
        if fresh:
            batch, logits, us = cls._prefill_padded(decoder, [prompts[i] for i in fresh])
            groups.append((fresh, batch, logits))
            forward_us += us
        for i, past in enumerate(pasts):
            if past is not None:
                batch, logits, us = cls._prefill_after(decoder, prompts[i], past)
                groups.append(([i], batch, logits))
                forward_us += us
        order = [i for rows, _, _ in groups for i in rows]
        logits = np.concatenate([g[2] for g in groups])
        batch = groups[0][1] if len(groups) == 1 else cls.concatenate(decoder, [g[1] for g in groups])
        if order != sorted(order):
            inverse = np.argsort(order)
            batch, logits = batch.filter(decoder, inverse.tolist()), logits[inverse]
        batch.request_ids, batch.outputs = list(request_ids), list(outputs)
        return batch, logits, forward_us

    @classmethod
    def _prefill_padded(cls, decoder: OnnxDecoder, prompts: Sequence[np.ndarray]) -> tuple[Batch, np.ndarray, int]:
        lengths = np.array([len(p) for p in prompts], dtype=np.int64)
        width = int(lengths.max())
        ids = np.zeros((len(prompts), width), dtype=np.int64)
        for row, prompt in enumerate(prompts):
            ids[row, width - len(prompt) :] = prompt
        logits, presents, us = decoder.forward(
            ids, attention_mask(lengths, width), position_ids(lengths, width), decoder.empty_past(len(prompts))
        )
        return cls._new(lengths, ConcatKV(presents), len(prompts)), logits, us

    @classmethod
    def _prefill_after(
        cls, decoder: OnnxDecoder, prompt: np.ndarray, past: list[np.ndarray]
    ) -> tuple[Batch, np.ndarray, int]:
        lengths = np.array([past[0].shape[1] + len(prompt)], dtype=np.int64)
        kv = ConcatKV.from_numpy([a[None] for a in past], decoder.to_device)
        logits, presents, us = decoder.forward(
            np.asarray(prompt, dtype=np.int64)[None, :],
            attention_mask(lengths, int(lengths[0])),
            position_ids(lengths, len(prompt)),
            kv.values,
        )
        return cls._new(lengths, kv.after_step(presents), 1), logits, us

    @classmethod
    def _new(cls, lengths: np.ndarray, kv: ConcatKV, rows: int) -> Batch:
        return cls(request_ids=[""] * rows, lengths=lengths, kv=kv, outputs=[(0, 0)] * rows)

    def step(self, decoder: OnnxDecoder, next_ids: np.ndarray) -> tuple[np.ndarray, int]:
        """Append one token per row and run it; the batch now holds their KV. Returns logits, µs."""
        lengths = self.lengths + 1
        width = self.kv.past_length + 1
        logits, presents, us = decoder.forward(
            np.asarray(next_ids, dtype=np.int64)[:, None],
            attention_mask(lengths, width),
            (lengths - 1)[:, None],
            self.kv.values,
        )
        self.kv, self.lengths = self.kv.after_step(presents), lengths
        return logits, us

    def filter(self, decoder: OnnxDecoder, rows: Sequence[int]) -> Batch:
        """The rows at these indices, in this order (repeats copy a row); unneeded padding is dropped."""
        lengths = self.lengths[np.asarray(rows, dtype=np.int64)]
        keep = int(lengths.max())
        if list(rows) == list(range(self.rows)) and keep == self.kv.past_length:
            return self
        kv = self.kv.select(rows, keep, decoder.to_device)
        return Batch(
            request_ids=[self.request_ids[r] for r in rows],
            lengths=lengths,
            kv=kv,
            outputs=[self.outputs[r] for r in rows],
        )

    @classmethod
    def concatenate(cls, decoder: OnnxDecoder, batches: Sequence[Batch]) -> Batch:
        """One batch holding the rows of `batches` in order, left-padded to the longest row."""
        lengths = np.concatenate([b.lengths for b in batches])
        kv = ConcatKV.concatenate([b.kv for b in batches], int(lengths.max()), decoder.to_device)
        return cls(
            request_ids=[r for b in batches for r in b.request_ids],
            lengths=lengths,
            kv=kv,
            outputs=[o for b in batches for o in b.outputs],
        )

    @staticmethod
    def padded_bytes(lengths: Sequence[int], bytes_per_token: int) -> int:
        """KV bytes of a batch of rows with these lengths, left-padded to the longest."""
        return len(lengths) * max(lengths, default=0) * bytes_per_token

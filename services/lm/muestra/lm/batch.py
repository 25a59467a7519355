"""A batch of rows whose KV stays in the service between calls (TGI's CausalLMBatch, on onnxruntime).

Each row holds `lengths[i]` tokens of KV. Where they sit (left- or right-padded) is the KV
storage's business (kv.py); the attention mask and position ids come from `lengths`, so a row's
logits do not depend on which other rows share its batch.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from muestra.lm.kv import ConcatKV, SharedKV
from muestra.lm.model import OnnxDecoder

# What a row wants from each step: (OutputKind, top_n).
OutputSpec = tuple[int, int]
NO_IDS = np.zeros(0, dtype=np.int64)
KV = ConcatKV | SharedKV
# The ids of a batch's rows grow in steps of this many positions.
TOKENS_BLOCK = 256


@dataclasses.dataclass(frozen=True)
class RowCache:
    """What the prefix cache does with a row's KV once the row leaves its batch (PrefillRow.prefix)."""

    block_size: int
    # Leading full blocks of the row known to be in the shared tier (read from it, or written already).
    stored_blocks: int
    # Whether the row's blocks are written to the shared tier when it leaves (PrefixBlocks.write_on_leave).
    write: bool
    # Tokens of its prompt (cached past included): a row that leaves holding no more was fed nothing after it.
    prompt_tokens: int = 0


class OwnedPast(list):
    """A row's past KV (one [kv_heads, p, head_dim] view per past input) that comes with the one-row buffer that
    holds it, which the row's prefill takes over and writes on in place: nobody else reads past p or writes it."""

    def __init__(self, arrays: list[np.ndarray], storage: KV) -> None:
        super().__init__(arrays)
        self.storage = storage


def _token_matrix(rows: Sequence[np.ndarray]) -> np.ndarray:
    """Each row's ids left-aligned in one int32 matrix (its width a multiple of TOKENS_BLOCK)."""
    width = -(-max((len(r) for r in rows), default=0) // TOKENS_BLOCK) * TOKENS_BLOCK
    tokens = np.zeros((len(rows), max(width, TOKENS_BLOCK)), dtype=np.int32)
    for i, ids in enumerate(rows):
        tokens[i, : len(ids)] = ids
    return tokens


def _forward(
    decoder: OnnxDecoder, kv: KV, ids: np.ndarray, lengths: np.ndarray, every_position: bool = False
) -> tuple[np.ndarray, KV, int]:
    """Run `ids` (new positions of every row) so that rows then hold `lengths`; logits (of each row's last
    position, or of every new one), KV after, µs."""
    new = ids.shape[1]
    kv = kv.ready(int(lengths.max()), decoder.to_device, decoder.context_length)
    mask, positions = kv.feeds(lengths, new)
    logits, presents, us = decoder.forward(
        ids,
        mask,
        positions,
        kv.values,
        share=kv.shares_buffer,
        last=kv.logit_positions(lengths, new),
        every_position=every_position,
    )
    return logits, kv.after_step(presents), us


def _runs(ids: np.ndarray) -> list[slice]:
    """Sorted ids as slices of consecutive ids: padding rows past a tokenizer's vocabulary are one."""
    breaks = np.flatnonzero(np.diff(ids) != 1) + 1
    return [slice(int(run[0]), int(run[-1]) + 1) for run in np.split(ids, breaks)]


@dataclasses.dataclass
class Batch:
    request_ids: list[str]
    # Tokens of each row held in the KV (prompt, cached prefix and generated so far).
    lengths: np.ndarray
    kv: KV
    outputs: list[OutputSpec]
    # Per row, the ids it never picks (PrefillRow.suppressed_token_ids; NO_IDS: none).
    suppressed: list[np.ndarray] = dataclasses.field(default_factory=list)
    # The ids whose KV each row holds: row i's are tokens[i, :lengths[i]] (what lies past a row's length means
    # nothing). A row that leaves its batch is cached under them.
    tokens: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros((0, TOKENS_BLOCK), np.int32))
    # Per row, what the prefix cache does with it when it leaves (None: nothing).
    cache: list[RowCache | None] = dataclasses.field(default_factory=list)
    # (the list it was built from, row index, id) of every suppressed logit, built on first use.
    _suppressed_at: tuple | None = dataclasses.field(default=None, repr=False)

    @property
    def rows(self) -> int:
        return len(self.request_ids)

    def row_kv(self, row: int, length: int) -> list[np.ndarray]:
        """Row `row`'s KV of its first `length` positions, one [kv_heads, length, head_dim] view per tensor."""
        return self.kv.row_arrays(row, length)

    def rolled_back_copy(self, decoder: OnnxDecoder, drop: np.ndarray) -> Batch:
        """A copy without each row's last drop[i] tokens (the original stays until the step has succeeded)."""
        if not np.asarray(drop).any():
            return self
        # Its ids are its own too: the step writes the new ones where the original's rejected drafts are.
        copy = dataclasses.replace(self, tokens=self.tokens.copy(), _suppressed_at=None)
        copy.rollback(decoder, drop)
        return copy

    def row_ids(self, row: int) -> np.ndarray:
        """The ids whose KV row `row` holds (a view)."""
        return self.tokens[row, : int(self.lengths[row])]

    def _record(self, ids: np.ndarray, counts: np.ndarray | None = None) -> None:
        """Note that each row now also holds the first counts[i] (default: all) of ids[i] after its current
        length; call it before `lengths` grows."""
        width = int((self.lengths + ids.shape[1]).max(initial=0))
        if width > self.tokens.shape[1]:
            grown = np.zeros((self.rows, -(-width // TOKENS_BLOCK) * TOKENS_BLOCK), np.int32)
            grown[:, : self.tokens.shape[1]] = self.tokens
            self.tokens = grown
        columns = self.lengths[:, None] + np.arange(ids.shape[1])[None, :]
        keep = np.ones(ids.shape, bool) if counts is None else np.arange(ids.shape[1])[None, :] < counts[:, None]
        rows = np.broadcast_to(np.arange(self.rows)[:, None], ids.shape)
        self.tokens[rows[keep], columns[keep]] = ids[keep]

    @property
    def nbytes(self) -> int:
        return self.kv.nbytes

    def suppress(self, logits: np.ndarray, unless: Sequence[bool] | None = None) -> None:
        """Set every row's suppressed ids to -inf in its logits ([rows, vocab], changed in place); rows
        where `unless` is true (a step's allowed-token mask decides for them) are left alone."""
        if self._suppressed_at is None or self._suppressed_at[0] is not self.suppressed:
            # Rows sharing one array (the engine hands equal sets out as one object) are set together.
            groups: dict[int, tuple[np.ndarray, list[int]]] = {}
            for row, ids in enumerate(self.suppressed):
                if ids.size:
                    groups.setdefault(id(ids), (ids, []))[1].append(row)
            self._suppressed_at = (self.suppressed, [(np.asarray(rows), _runs(ids)) for ids, rows in groups.values()])
        skip = np.asarray(unless, dtype=bool) if unless is not None and any(unless) else None
        for rows, runs in self._suppressed_at[1]:
            if skip is not None:
                rows = rows[~skip[rows]]
            if rows.size == self.rows:
                for run in runs:
                    logits[:, run] = -np.inf
            elif rows.size:
                for run in runs:
                    logits[rows, run] = -np.inf

    def suppress_row(self, logits: np.ndarray, row: int) -> None:
        """Set row `row`'s suppressed ids to -inf in `logits` ([positions, vocab] of that row, in place)."""
        ids = self.suppressed[row] if self.suppressed else NO_IDS
        if ids.size:
            for run in _runs(ids):
                logits[:, run] = -np.inf

    @classmethod
    def from_prefill(
        cls,
        decoder: OnnxDecoder,
        prompts: Sequence[np.ndarray],
        request_ids: Sequence[str],
        outputs: Sequence[OutputSpec],
        pasts: Sequence[list[np.ndarray] | None] | None = None,
        suppressed: Sequence[np.ndarray] | None = None,
        histories: Sequence[np.ndarray] | None = None,
        cache: Sequence[RowCache | None] | None = None,
        hold: int = 0,
    ) -> tuple[Batch, np.ndarray, int]:
        """Run the prompts and keep their KV; returns the batch, each row's last logits (not suppressed), µs.

        `pasts[i]`, when given, is row i's KV of tokens before its prompt (one [kv_heads, p,
        head_dim] array per past input); such rows run alone and are then joined to the rest.
        `histories[i]` is row i's past ids followed by its prompt (default: the prompt; a row with a past
        needs it). `hold` is how many positions a lone row will grow to (a chunked prefill's whole prompt).
        """
        pasts = list(pasts) if pasts is not None else [None] * len(prompts)
        fresh = [i for i, p in enumerate(pasts) if p is None]
        # A right-padded prompt's last logits sit mid-sequence, which graphs emitting only the
        # last position's logits cannot give: such rows run one by one. Otherwise rows share a
        # forward only with prompts of the same length: padding changes a row's KV and logits in
        # the last bits (the attention's reductions run over the padded width), so a prompt's KV
        # would depend on its neighbours for the rest of its life (bench/batch_invariance.py).
        together = decoder.storage_cls.left_padded or decoder.logits_all
        if together:
            same_length: dict[int, list[int]] = {}
            for i in fresh:
                same_length.setdefault(len(prompts[i]), []).append(i)
            groups = list(same_length.values())
        else:
            groups = [[i] for i in fresh]
        groups += [[i] for i, p in enumerate(pasts) if p is not None]
        parts, logits, forward_us = [], [], 0
        for rows in groups:
            part, part_logits, us = cls._prefill_rows(
                decoder, [prompts[i] for i in rows], [pasts[i] for i in rows], hold
            )
            parts.append(part)
            logits.append(part_logits)
            forward_us += us
        order = [i for rows in groups for i in rows]
        batch = parts[0] if len(parts) == 1 else cls.concatenate(decoder, parts)
        logits = np.concatenate(logits)
        if order != sorted(order):
            inverse = np.argsort(order)
            batch, logits = batch.filter(decoder, inverse.tolist()), logits[inverse]
        batch.request_ids, batch.outputs = list(request_ids), list(outputs)
        batch.suppressed = list(suppressed) if suppressed is not None else [NO_IDS] * len(prompts)
        batch.tokens = _token_matrix(histories if histories is not None else prompts)
        batch.cache = list(cache) if cache is not None else [None] * len(prompts)
        return batch, logits, forward_us

    @classmethod
    def _prefill_rows(
        cls,
        decoder: OnnxDecoder,
        prompts: Sequence[np.ndarray],
        pasts: Sequence[list[np.ndarray] | None],
        hold: int = 0,
    ) -> tuple[Batch, np.ndarray, int]:
        storage = decoder.storage_cls
        pasts = [p if p is not None else decoder.empty_row_past() for p in pasts]
        lengths = np.array([len(p) + past[0].shape[1] for p, past in zip(prompts, pasts, strict=True)], np.int64)
        width = max(len(p) for p in prompts)
        ids = np.zeros((len(prompts), width), dtype=np.int64)
        for row, prompt in enumerate(prompts):
            if storage.left_padded:
                ids[row, width - len(prompt) :] = prompt
            else:
                ids[row, : len(prompt)] = prompt
        hold = max(hold, int(lengths.max()))
        if len(pasts) == 1 and isinstance(pasts[0], OwnedPast):  # no copy: the row goes on in the buffer it came in
            kv = pasts[0].storage.ready(hold, decoder.to_device, decoder.context_length)
        else:
            kv = storage.from_rows(pasts, decoder.to_device, decoder.context_length, hold=hold)
        logits, kv, us = _forward(decoder, kv, ids, lengths)
        rows = len(prompts)
        # Their ids are set by from_prefill, which knows the rows' pasts.
        tokens = np.zeros((rows, -(-int(lengths.max()) // TOKENS_BLOCK) * TOKENS_BLOCK), np.int32)
        batch = cls([""] * rows, lengths, kv, [(0, 0)] * rows, [NO_IDS] * rows, tokens, [None] * rows)
        return batch, logits, us

    def step(self, decoder: OnnxDecoder, next_ids: np.ndarray) -> tuple[np.ndarray, int]:
        """Append next_ids ([rows], or [rows, tokens] for several per row) and run them; the batch now holds
        their KV. Returns the logits after each row's last token, and µs."""
        ids = np.asarray(next_ids, dtype=np.int64)
        ids = ids[:, None] if ids.ndim == 1 else ids
        if ids.shape[1] > 1 and self.rows > 1 and not decoder.storage_cls.left_padded:
            return self._step_rows_alone(decoder, ids)
        lengths = self.lengths + ids.shape[1]
        logits, self.kv, us = _forward(decoder, self.kv, ids, lengths)
        self._record(ids)
        self.lengths = lengths
        return logits, us

    def _step_rows_alone(self, decoder: OnnxDecoder, ids: np.ndarray) -> tuple[np.ndarray, int]:
        """Several tokens per row on a shared buffer: onnxruntime's GroupQueryAttention takes more than one new
        token after a past only for a batch of one, so each row runs alone (its KV copied out and back)."""
        parts = [self.filter(decoder, [row]) for row in range(self.rows)]
        logits, forward_us = [], 0
        for row, part in enumerate(parts):
            row_logits, us = part.step(decoder, ids[row : row + 1])
            logits.append(row_logits)
            forward_us += us
        joined = Batch.concatenate(decoder, parts)
        self.kv, self.lengths, self.tokens = joined.kv, joined.lengths, joined.tokens
        return np.concatenate(logits), forward_us

    def verify(
        self, decoder: OnnxDecoder, next_ids: np.ndarray, drafts: Sequence[np.ndarray]
    ) -> tuple[list[np.ndarray], int]:
        """Append each row's next id and its draft ids (none for some rows) and run them: per row, its logits
        after the next id and after each draft (float32 [1 + drafts, vocab]), and µs. The batch then holds every
        fed id; `rollback` drops the rejected ones. Needs decoder.multi_position_logits."""
        counts = np.array([len(d) for d in drafts], dtype=np.int64)
        width = 1 + int(counts.max())
        ids = np.empty((self.rows, width), dtype=np.int64)
        ids[:, 0] = next_ids
        for row, draft in enumerate(drafts):
            ids[row, 1 : 1 + len(draft)] = draft
            ids[row, 1 + len(draft) :] = ids[row, len(draft)]  # padding, dropped right after the step
        if self.rows == 1 or decoder.storage_cls.left_padded:
            lengths = self.lengths + width
            logits, self.kv, us = _forward(decoder, self.kv, ids, lengths, every_position=True)
            self._record(ids)
            self.lengths = lengths
            self.rollback(decoder, width - 1 - counts)
            return [logits[row, : 1 + counts[row]] for row in range(self.rows)], us
        return self._verify_rows_alone(decoder, ids, counts)

    def _verify_rows_alone(self, decoder: OnnxDecoder, ids: np.ndarray, counts: np.ndarray):
        """A shared buffer (GroupQueryAttention): one step feeds every row its next id, then each row with drafts
        runs them alone (the kernel takes several new tokens after a past only for a batch of one), on a view of
        its own rows of the buffers on CPU, or on a copy elsewhere."""
        first, forward_us = self.step(decoder, ids[:, 0])
        out = [first[row : row + 1] for row in range(self.rows)]
        drafted = np.flatnonzero(counts)
        self.kv = self.kv.ready(int((self.lengths + counts).max()), decoder.to_device, decoder.context_length)
        if decoder.device != "cpu":
            parts = [self.filter(decoder, [row]) for row in range(self.rows)]
        for row in drafted.tolist():
            k = int(counts[row])
            length = self.lengths[row : row + 1] + k
            if decoder.device == "cpu":
                kv = self.kv.row_view(row, decoder.to_device)
            else:
                kv = parts[row].kv
            logits, kv, us = _forward(decoder, kv, ids[row : row + 1, 1 : 1 + k], length, every_position=True)
            if decoder.device != "cpu":
                parts[row].kv, parts[row].lengths = kv, length
            out[row] = np.concatenate([out[row], logits[0]])
            forward_us += us
        if decoder.device != "cpu":
            self.kv = Batch.concatenate(decoder, parts).kv
        self._record(ids[:, 1:], counts)
        self.lengths = self.lengths + counts
        return out, forward_us

    def rollback(self, decoder: OnnxDecoder, drop: np.ndarray) -> None:
        """Forget each row's last drop[i] tokens (rejected drafts): its logits are then a never-drafted row's."""
        drop = np.asarray(drop, dtype=np.int64)
        if not drop.any():
            return
        self.kv = self.kv.rollback(self.lengths, drop, decoder.to_device)
        self.lengths = self.lengths - drop

    def filter(self, decoder: OnnxDecoder, rows: Sequence[int]) -> Batch:
        """The rows at these indices, in this order (repeats copy a row); unneeded padding is dropped."""
        lengths = self.lengths[np.asarray(rows, dtype=np.int64)]
        kept_bytes = self.kv.bytes_for(lengths.tolist(), decoder.kv_bytes_per_token, decoder.context_length)
        if list(rows) == list(range(self.rows)) and kept_bytes == self.kv.nbytes:
            return self
        index = np.asarray(rows, dtype=np.int64)
        return Batch(
            request_ids=[self.request_ids[r] for r in rows],
            lengths=lengths,
            kv=self.kv.select(rows, lengths, decoder.to_device, decoder.context_length),
            outputs=[self.outputs[r] for r in rows],
            suppressed=[self.suppressed[r] for r in rows],
            tokens=_token_matrix([self.row_ids(r) for r in index.tolist()]),
            cache=[self.cache[r] for r in rows],
        )

    @classmethod
    def concatenate(cls, decoder: OnnxDecoder, batches: Sequence[Batch]) -> Batch:
        """One batch holding the rows of `batches` in order."""
        lengths = np.concatenate([b.lengths for b in batches])
        kv = decoder.storage_cls.concatenate(
            [b.kv for b in batches], lengths, decoder.to_device, decoder.context_length
        )
        return cls(
            request_ids=[r for b in batches for r in b.request_ids],
            lengths=lengths,
            kv=kv,
            outputs=[o for b in batches for o in b.outputs],
            suppressed=[ids for b in batches for ids in b.suppressed],
            tokens=_token_matrix([b.row_ids(r) for b in batches for r in range(b.rows)]),
            cache=[c for b in batches for c in b.cache],
        )

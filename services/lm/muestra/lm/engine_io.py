"""What the engine's calls take and give back: a prefill's rows, a decode's batches, a step's result, the load."""

from __future__ import annotations

import dataclasses

import numpy as np

from muestra.lm.batch import NO_IDS, Batch, OutputSpec, RowCache
from muestra.lm.sampling import SampledRow


@dataclasses.dataclass
class PrefillInput:
    request_id: str
    input_ids: np.ndarray
    output: OutputSpec
    # The row's allowed-token bitmask for this step (b"": every token).
    allowed: bytes = b""
    # KV of tokens before input_ids (one [kv_heads, p, head_dim] array per past input), or None.
    past: list[np.ndarray] | None = None
    # Ids the row never picks, for its whole life (int64, ascending; NO_IDS: none).
    suppressed: np.ndarray = dataclasses.field(default_factory=lambda: NO_IDS)
    # The ids of `past` followed by input_ids (None: input_ids alone, the row has no past).
    history: np.ndarray | None = None
    # What the prefix cache does with the row when it leaves its batch (None: nothing).
    cache: RowCache | None = None
    # Tokens of its past that the engine found itself at its prefill (adoption.adopt_past), or 0.
    adopted: int = 0


@dataclasses.dataclass
class DecodeInput:
    batch_id: str
    next_ids: np.ndarray
    # One spec per row, or None to keep each row's previous spec.
    outputs: list[OutputSpec] | None
    # One allowed-token bitmask per row for this step (b"": every token), or None: none.
    allowed: list[bytes] | None = None
    # Per row, the draft ids verified after its next id (int64, maybe empty), or None: no drafts.
    drafts: list[np.ndarray] | None = None
    # Per row, how many tokens to drop from the end of its KV before the step (rejected drafts), or None.
    rollback: np.ndarray | None = None
    # Per row, the chain that picks its tokens in this call (a sampled row), or None: its argmax. None: no row.
    samplers: list[SampledRow | None] | None = None


@dataclasses.dataclass
class StepResult:
    batch_id: str
    logits: np.ndarray
    specs: list[OutputSpec]
    forward_us: int
    # Per row, the allowed-token bitmask applied to this step's logits (b"": none).
    allowed: list[bytes] | None = None
    # With greedy steps or sampled rows: int64 [rows, steps run], each row's pick after each step (its argmax, or
    # a sampled row's chain's token). A row whose chain failed has no pick in the last column (sampler_errors).
    greedy_ids: np.ndarray | None = None
    # With drafts, per row: a LOGITS row's logits after each of its drafts ([drafts, vocab], after its row of
    # `logits`), or an ARGMAX row's count of accepted drafts (`logits` is then after the last one); else None.
    draft_logits: list[np.ndarray | None] | None = None
    accepted: list[int | None] | None = None
    # With drafts: how many each row had.
    drafted: list[int] | None = None
    # With sampled rows: each row's SampledRow (None for the others), and why a row's chain failed (else None).
    sampled: list[SampledRow | None] | None = None
    sampler_errors: list[str | None] | None = None

    @property
    def steps_run(self) -> int:
        return self.greedy_ids.shape[1] if self.greedy_ids is not None else 1


@dataclasses.dataclass
class ChunkedPrefill:
    """A one-row prefill in progress (Engine.begin_prefill, prefill_chunk)."""

    row: PrefillInput
    lease: str
    chunk_tokens: int
    # The row's length once prefilled, and the KV bytes reserved for it until its batch is stored.
    length: int
    reserved: int
    # Tokens of row.input_ids run so far, the batch they made, and the forwards' time.
    done: int = 0
    batch: Batch | None = None
    forward_us: int = 0
    chunks: int = 0
    batch_id: str = ""


@dataclasses.dataclass
class Load:
    batches: int
    rows: int
    kv_bytes: int
    kv_budget_bytes: int

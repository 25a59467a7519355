"""A replica's batch as the gateway sees it: which rows run, which join at the next step, and which a Filter keeps.

The lm's batch and `RunningBatch.rows` are in the same order, row for row. Between two steps, finished
rows leave and beam-search rows are reordered by one Filter call (`filter_plan` gives its indices;
repeats are allowed), and batches prefilled since the last step join the running one in the next Decode
(Decode concatenates them, in order). A request with n > 1 completions is prefilled once, and a Filter
repeats its row n times.
"""

from __future__ import annotations

import dataclasses

from muestra.gateway.engine.constraints.engine import fill_masks
from muestra.gateway.engine.generation.request import BeamGroup, BeamRow, GenerationRequest, Sequence
from muestra.gateway.engine.generation.speculation import RowSpeculation
from muestra.gateway.engine.sampling import ModelInfo, SearchRequest, new_rows
from muestra.runtime.errors import InvalidArgument
from muestra.v1 import lm_pb2

Row = Sequence | BeamRow


@dataclasses.dataclass
class Joining:
    """A batch prefilled since the last step; its rows are set once its first tokens are taken."""

    batch_id: str
    rows: list[Row] = dataclasses.field(default_factory=list)


class RunningBatch:
    """The running batch of one replica, and the batches joining it at the next Decode."""

    def __init__(self) -> None:
        self.batch_id = ""
        self.rows: list[Row] = []
        self.joining: list[Joining] = []

    def all_rows(self) -> list[Row]:
        """The running rows and those joining them at the next step, in the order the next Decode gives them."""
        return [*self.rows, *(row for joining in self.joining for row in joining.rows)]

    def __len__(self) -> int:
        return len(self.rows) + sum(len(joining.rows) for joining in self.joining)

    def requests(self) -> list[GenerationRequest]:
        return requests(self.all_rows())

    def decode_batches(self, masked: bool, tokens: int, in_lm: set[int] | None = None) -> list[lm_pb2.DecodeBatch]:
        """The next Decode's batches; the joining rows join the running ones (Decode consumes the batches it
        is given, so they are joined or lost with that call either way). The rows in `in_lm` (by id) go with
        their samplers: the lm picks their tokens (step_policy.picked_in_lm)."""
        batches = []
        if self.batch_id:
            batches.append(decode_batch(self.batch_id, self.rows, masked, tokens, in_lm))
        for joining in self.joining:
            batches.append(decode_batch(joining.batch_id, joining.rows, masked, tokens, in_lm))
            self.rows.extend(joining.rows)
        self.joining = []
        return batches

    def drop(self) -> list[str]:
        """Forget every row (their batches are lost or to be freed); the ids of the batches they were in."""
        batch_ids = [b for b in (self.batch_id, *(joining.batch_id for joining in self.joining)) if b]
        self.batch_id, self.rows, self.joining = "", [], []
        return batch_ids


def request_rows(request: GenerationRequest, model_info: ModelInfo, mask_in_lm: bool) -> list[Row]:
    """A request's rows before its prefill: one per completion (n > 1 repeat the prefilled row), or the first
    beam of its search."""
    chain = request.chain
    if chain.is_search:
        search = SearchRequest(chain, request.prompt_ids, model_info, request.max_tokens, request.seed)
        request.open_sequences = request.n
        return [BeamRow(BeamGroup(request, search))]
    sampling = new_rows(
        chain, request.prompt_ids, request.seed, request.n, request.logprobs, request.top_logprobs,
        request.constraint, mask_in_lm,
    )  # fmt: skip
    request.open_sequences = len(sampling)
    if request.constraint is not None:
        fill_masks([s.constraint for s in sampling])
        if sampling[0].constraint.error:
            raise InvalidArgument("constraint", f"allows no text at all ({sampling[0].constraint.error})")
    rows = [Sequence(request, i, s) for i, s in enumerate(sampling)]
    if request.speculation is not None:
        for row in rows:
            row.speculation = RowSpeculation.start(request.speculation)
    return rows


def requests(rows: list[Row]) -> list[GenerationRequest]:
    """The requests the rows belong to, each once, in order."""
    return list({id(row.request): row.request for row in rows}.values())


def groups(rows: list[Row]) -> dict[BeamGroup, list[int]]:
    """Each beam group in the batch with the positions of its rows, in order."""
    found: dict[BeamGroup, list[int]] = {}
    for i, row in enumerate(rows):
        if isinstance(row, BeamRow):
            found.setdefault(row.group, []).append(i)
    return found


def filter_plan(rows: list[Row]) -> tuple[list[int], list[Row], list[Sequence]]:
    """Which rows of the batch the next step keeps, in order (a Filter's indices, beams reordered by their last
    search step), the rows that are then the batch, and the completions of cancelled requests that leave."""
    keep: list[int] = []
    kept: list[Row] = []
    cancelled: list[Sequence] = []
    positions_of = groups(rows)
    for i, row in enumerate(rows):
        if isinstance(row, Sequence):
            if not row.finished:
                keep.append(i)
                kept.append(row)
            elif row.request.cancelled:
                cancelled.append(row)
            continue
        group = row.group
        positions = positions_of[group]
        if positions[0] != i:
            continue  # the group was handled at its first row
        if group.finished:
            if group.request.cancelled:
                cancelled.extend(group.sequences)
            continue
        step, group.pending = group.pending, None
        for source, token in zip(step.source_rows, step.next_tokens, strict=True):
            keep.append(positions[source])
            kept.append(BeamRow(group, int(token)))
    return keep, kept, cancelled


def allowed_tokens(row: Row) -> bytes:
    """The row's allowed-token mask for its next step, when the lm is to apply one."""
    if not isinstance(row, Sequence) or row.finished or not row.sampling.mask_in_lm:
        return b""
    constraint = row.sampling.constraint
    return constraint.mask_bytes() if constraint is not None and not constraint.error else b""


def decode_batch(
    batch_id: str, rows: list[Row], masked: bool, tokens: int, in_lm: set[int] | None = None
) -> lm_pb2.DecodeBatch:
    """The step for these rows: each feeds `tokens` tokens (its pending one, then queued ones); the rows in
    `in_lm` (by id) go with their samplers."""
    batch = lm_pb2.DecodeBatch(batch_id=batch_id)
    sampled = [id(row) in in_lm for row in rows] if in_lm else []
    if any(sampled):
        for row, in_lm in zip(rows, sampled, strict=True):
            batch.samplers.append(row.sampling.lm_sampler() if in_lm else lm_pb2.RowSampler())
    for row in rows:
        if not isinstance(row, Sequence):
            batch.next_ids.append(row.pending_token)
            continue
        feed = [row.pending_token, *row.queued]
        batch.next_ids.extend(feed[:tokens])
        rest = feed[tokens:]
        row.pending_token, row.queued, row.in_flight = (rest[0] if rest else None), rest[1:], bool(rest)
    sequences = [row for row in rows if isinstance(row, Sequence)]
    if any(row.drafts for row in sequences):
        for row in rows:
            drafts = row.drafts if isinstance(row, Sequence) else []
            batch.draft_lengths.append(len(drafts))
            batch.draft_ids.extend(drafts)
    if any(row.rollback for row in sequences):
        for row in rows:
            batch.rollback.append(row.rollback if isinstance(row, Sequence) else 0)
            if isinstance(row, Sequence):
                row.rollback = 0
    if masked:
        for row in rows:
            kind = row.sampling.output_kind if isinstance(row, Sequence) else lm_pb2.LOGITS
            if isinstance(row, Sequence) and row.in_flight:  # its next token is already known
                batch.outputs.add(kind=lm_pb2.ARGMAX)
            else:
                batch.outputs.add(kind=kind, allowed_tokens=allowed_tokens(row))
    return batch

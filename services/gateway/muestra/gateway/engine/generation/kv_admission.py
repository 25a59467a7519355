"""Admission by KV memory: a request joins a replica's batch only when the lm's KV budget holds that
batch until every row could reach its end.

The bytes are the lm's own accounting, padding included (`ConcatKV.bytes_for` and `SharedKV.bytes_for`
in services/lm/muestra/lm/kv.py; change both sides together): a concat batch takes rows x its longest
row, a shared batch rows x the capacity of its longest row (grown 256 positions at a time, capped at the
context length), times the bytes of one position of one row.

A row's end is its prompt plus its max_tokens, capped at the context length, plus the steps a greedy
burst may run past it while a neighbour still needs them (the lm feeds every row of a burst). Rows only
grow toward their ends and leave the batch when they finish, and batches prefilled apart take no more
than the same rows joined, so a batch admitted this way never meets the lm's RESOURCE_EXHAUSTED. What
it does not see: other gateways using the same lm, and the prefill logits of a graph that returns every
position's (ours return the last one's).

The queue stays first come, first served: a request that does not fit yet waits at its head until rows
leave (those behind it wait too, so a long request is never passed over for ever); one that could not
fit even alone is refused at once with RESOURCE_EXHAUSTED.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

from muestra.gateway import metrics
from muestra.gateway.engine.generation.request import BeamRow, GenerationRequest
from muestra.runtime.errors import ResourceExhausted

if TYPE_CHECKING:
    from muestra.gateway.engine.clients.backends import LmReplica


def row_end(prompt_tokens: int, max_tokens: int, context_length: int, overshoot: int = 0) -> int:
    """The most positions a row's KV may hold: prompt and max_tokens (one to spare: the last token is never
    fed), plus `overshoot` positions a greedy burst may add after its end, capped at the context length."""
    return min(prompt_tokens + max_tokens + overshoot, context_length)


def request_ends(request: GenerationRequest, context_length: int, overshoot: int) -> list[int]:
    """The ends of all the rows a request will take: n completions, or every beam."""
    return [row_end(len(request.prompt_ids), request.max_tokens, context_length, overshoot)] * request.rows


def batch_ends(rows: Iterable, context_length: int, overshoot: int) -> list[int]:
    """The ends of a batch's rows: each completion still running, and every beam of a search (a search
    prefills one row and widens to its beams later)."""
    ends: list[int] = []
    searches: set[int] = set()
    for row in rows:
        if isinstance(row, BeamRow):
            if id(row.group) in searches:
                continue
            searches.add(id(row.group))
            ends += request_ends(row.request, context_length, overshoot)
        else:
            ends.append(row_end(len(row.request.prompt_ids), row.request.max_tokens, context_length, overshoot))
    return ends


class KvAdmission:
    """One replica's admission by KV, for its scheduler (the layout and budget of its last Describe)."""

    def __init__(self, model_name: str, replica: LmReplica, greedy_burst: int) -> None:
        self.replica = replica
        self.greedy_burst = greedy_burst
        self.labels = (model_name, replica.address)

    def _overshoot(self) -> int:
        return max(0, min(self.greedy_burst, self.replica.max_greedy_steps) - 1)

    def reserved_bytes(self, rows: Iterable, prefilling: Sequence[GenerationRequest] = ()) -> int:
        """Bytes the batch `rows` and the requests being prefilled may take before their last row ends."""
        kv = self.replica.kv
        if kv is None:
            return 0
        overshoot = self._overshoot()
        ends = batch_ends(rows, kv.context_length, overshoot)
        for request in prefilling:
            ends += request_ends(request, kv.context_length, overshoot)
        return kv.batch_bytes(ends)

    def alone_error(self, request: GenerationRequest) -> ResourceExhausted | None:
        """The error for a request whose rows alone need more than the budget (None if they fit)."""
        kv = self.replica.kv
        if kv is None:
            return None
        ends = request_ends(request, kv.context_length, self._overshoot())
        needed = kv.batch_bytes(ends)
        if needed <= kv.budget_bytes:
            return None
        return ResourceExhausted(
            f"kv_budget_bytes: this request needs {needed} bytes of KV even alone ({request.rows} row(s) of up to "
            f"{ends[0]} positions at {kv.bytes_per_token} bytes), more than the budget of {kv.budget_bytes} bytes "
            f"of lm replica {self.replica.address}; ask for fewer max_tokens, completions or beams"
        )

    def fits(self, request: GenerationRequest, rows: list, prefilling: Sequence[GenerationRequest] = ()) -> bool:
        """Whether the batch `rows`, the requests being prefilled and this request's rows stay within the budget
        until every row's end. An empty replica always takes it: a request too big alone is refused
        (alone_error), never kept waiting."""
        kv = self.replica.kv
        if kv is None or not (rows or prefilling):
            return True
        overshoot = self._overshoot()
        ends = batch_ends(rows, kv.context_length, overshoot)
        for other in (*prefilling, request):
            ends += request_ends(other, kv.context_length, overshoot)
        return kv.batch_bytes(ends) <= kv.budget_bytes

    def admits(
        self, waiting: Sequence[GenerationRequest], rows: list, prefilling: Sequence[GenerationRequest] = ()
    ) -> bool:
        """fits() for the head of the queue. When it has to wait, so does everyone behind it: each request is
        counted once in muestra_kv_admission_waits_total."""
        if self.fits(waiting[0], rows, prefilling):
            return True
        held = [request for request in waiting if not request.waited_for_kv]
        for request in held:
            request.waited_for_kv = True
        metrics.KV_ADMISSION_WAITS.labels(*self.labels).inc(len(held))
        return False

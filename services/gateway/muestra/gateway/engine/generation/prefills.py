"""A replica scheduler's prefills: admission of waiting requests (rows and KV free, first come, first served), their
Prefill calls beside the step loop, and their joining the running batch with their first tokens."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time

from muestra.gateway import metrics
from muestra.gateway.engine.clients.lm import LmFailed, logits_matrix
from muestra.gateway.engine.generation.batch import (
    Joining,
    Row,
    allowed_tokens,
    request_rows,
)
from muestra.gateway.engine.generation.detokenizer import TokenizerFailed
from muestra.gateway.engine.generation.failover import deadline_error
from muestra.gateway.engine.generation.request import GenerationRequest, Sequence
from muestra.runtime.errors import (
    MuestraError,
)
from muestra.runtime.logs import request_id_scope
from muestra.v1 import lm_pb2

log = logging.getLogger("muestra.gateway.scheduler")

# Prefills in flight at once on one replica (the lm runs their chunks in turn, between decode steps).
MAX_PREFILLS = 8
# A prefill that nobody waits for any more is cancelled on the lm when its prompt is longer than this; a shorter
# one (a fraction of a second) runs to its end and its batch is freed.
CANCELLED_PREFILL_TOKENS = 512


@dataclasses.dataclass
class Prefilling:
    """A request whose Prefill is in flight, with the rows it will bring."""

    request: GenerationRequest
    rows: list[Row]
    task: asyncio.Task


class PrefillTurns:
    """Mixed into ReplicaScheduler: the prefill side of its loop."""

    def _admit(self) -> None:
        """Start the prefills of waiting requests while rows and KV are free (first come, first served)."""
        used = len(self.batch) + sum(p.request.rows for p in self.prefilling)
        while self.waiting and len(self.prefilling) < MAX_PREFILLS and used + self.waiting[0].rows <= self.max_rows:
            if not self.kv.admits(self.waiting, self.batch.all_rows(), [p.request for p in self.prefilling]):
                break  # it waits at the head until rows leave; those behind it wait too
            request = self.waiting.popleft()
            if request.cancelled:
                request.out.put_nowait(None)
                continue
            if request.deadline is not None and time.monotonic() > request.deadline:
                request.fail(deadline_error(request, "while it waited for a place in the batch"))
                continue
            request.admitted = time.monotonic()
            metrics.QUEUE_TIME.labels(self.model.name).observe(request.admitted - request.arrival)
            try:
                rows = request_rows(request, self.model_info, self.mask_in_lm)
            except MuestraError as exc:
                request.fail(exc)
                continue
            task = asyncio.get_running_loop().create_task(self._prefill(request, rows))
            task.add_done_callback(lambda _: self.wake.set())
            self.prefilling.append(Prefilling(request, rows, task))
            used += request.rows

    async def _prefill(self, request: GenerationRequest, rows: list[Row]) -> lm_pb2.PrefillResponse:
        """The request's prefix lookup and Prefill, beside the step loop: a batch of its own, held by the lm."""
        with request_id_scope(request.request_id):
            kind = rows[0].sampling.output_kind if isinstance(rows[0], Sequence) else lm_pb2.LOGITS
            prefix_cache = self.model.prefix_cache if request.prefix_cache else None
            prefix = None
            if prefix_cache is not None:
                with self.progress.waiting_for("Redis prefix lookup"):
                    prefix = await prefix_cache.prefix_blocks(request.prompt_ids, request.chat)
            request.attempts += 1
            row = lm_pb2.PrefillRow(
                request_id=request.request_id,
                input_ids=request.prompt_ids,
                output=lm_pb2.OutputSpec(kind=kind, allowed_tokens=allowed_tokens(rows[0])),
                prefix=prefix,
                suppressed_token_ids=request.suppressed_token_ids,
            )
            call = asyncio.ensure_future(self.lm.prefill(lm_pb2.PrefillRequest(rows=[row])))
            try:
                return await asyncio.shield(call)
            except asyncio.CancelledError:
                # Nobody waits for it any more (a cancel, a deadline). A short prompt's Prefill runs to its end and
                # its batch is freed then: had the call been cancelled as the lm sent its reply, the lm would hold
                # that batch (and its KV) until the lease's idle limit. A long one is cancelled, and the lm stops
                # it at its next chunk (only a cancel that meets the last chunk's reply leaves its batch behind).
                if len(request.prompt_ids) > CANCELLED_PREFILL_TOKENS:
                    call.cancel()
                call.add_done_callback(self._free_made)
                raise

    def _free_made(self, call: asyncio.Future) -> None:
        if call.cancelled() or call.exception() is not None:
            return
        batch_id = call.result().batch_id
        task = asyncio.get_running_loop().create_task(self._clear_quietly([batch_id]))
        self.background.add(task)
        task.add_done_callback(self.background.discard)

    async def _clear_quietly(self, batch_ids: list[str]) -> None:
        try:
            await self.lm.clear(batch_ids)
        except LmFailed as exc:  # a replica that is gone freed it with everything else
            log.warning("freeing the batch of a cancelled prefill failed (%s)", exc)

    async def _prefill_or_wake(self) -> None:
        """Wait until a prefill is done or the loop is woken (a new request, a cancel) since its last admission."""
        if self.wake.is_set() or any(p.task.done() for p in self.prefilling):
            return
        woken = asyncio.ensure_future(self.wake.wait())
        try:
            await asyncio.wait([woken, *(p.task for p in self.prefilling)], return_when=asyncio.FIRST_COMPLETED)
        finally:
            woken.cancel()

    async def _join_prefilled(self) -> None:
        """Requests whose prefill is done take their first tokens and join the batch at the next step (a short
        prompt admitted after a long one need not wait for it); a failed prefill fails its request (or, when the
        replica failed, everything here)."""
        for prefilling in [p for p in self.prefilling if p.task.done()]:
            self.prefilling.remove(prefilling)
            request = prefilling.request
            if prefilling.task.cancelled():  # by _expire
                if request.cancelled:
                    request.out.put_nowait(None)
                else:
                    request.fail(deadline_error(request, "during its prefill"))
                continue
            try:
                reply = prefilling.task.result()
            except LmFailed as exc:
                self._move_or_fail(request, exc)
                raise
            except MuestraError as exc:
                request.fail(exc)
                continue
            try:
                with request_id_scope(request.request_id):
                    await self._join(request, prefilling.rows, reply)
            except LmFailed as exc:  # its batch is gone with the replica: it moves if it streamed nothing
                self._move_or_fail(request, exc)
                raise
            except TokenizerFailed as exc:
                request.fail(exc)
                raise
            except MuestraError as exc:
                request.fail(exc)
            self.progress.moved()

    async def _join(self, request: GenerationRequest, rows: list[Row], reply: lm_pb2.PrefillResponse) -> None:
        """A prefilled request's batch joins the running one at the next step, once its first tokens are taken."""
        if request.deadline is not None and time.monotonic() > request.deadline:
            # Its own deadline passed during the prefill: that request fails alone, and its batch goes.
            await self.lm.clear([reply.batch_id])
            request.fail(deadline_error(request, "during its prefill"))
            return
        request.cached_tokens = reply.output.rows[0].cached_tokens
        prefix_cache = self.model.prefix_cache if request.prefix_cache else None
        if prefix_cache is not None:
            prefix_cache.record_hit(request.cached_tokens, reply.output.rows[0].cache_tier)
        logits = logits_matrix(reply.output)
        argmax = reply.output.rows[0].argmax
        joining = Joining(reply.batch_id)
        self.batch.joining.append(joining)  # from now on, a failure handler sees (and frees) this batch
        try:
            if isinstance(rows[0], Sequence) and len(rows) > 1:
                # n > 1: the completions share this prefill; Filter repeats its row.
                joining.batch_id = await self.lm.filter(joining.batch_id, [0] * len(rows))
            joining.rows = rows
            index = [0] * len(rows) if logits is not None else [-1] * len(rows)
            await self._accept(rows, logits, index, [argmax] * len(rows))
            metrics.PREFILL_TIME.labels(self.model.name).observe(time.monotonic() - request.admitted)
            await self.detokenizer.step(rows)
            joining.batch_id, joining.rows = await self._reshaped(joining.batch_id, rows)
        except LmFailed:
            # The caller moves or fails this request; the replica's failure handler must not see it again.
            self.batch.joining.remove(joining)
            raise
        if not joining.rows:
            self.batch.joining.remove(joining)

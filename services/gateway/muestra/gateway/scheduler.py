"""Continuous batching on one lm replica.

Between two decode steps, finished and cancelled rows leave the batch (Filter) and waiting
requests are prefilled and join it (Decode concatenates the new batches with the running
one). One Decode call per step serves every row; detokenization of step t overlaps the
lm's work on step t+1.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time

import grpc
import numpy as np

from muestra.gateway.models import LmReplica, TextModel
from muestra.gateway.request import GenerationRequest, Sequence
from muestra.runtime.errors import MuestraError, ResourceExhausted
from muestra.v1 import gateway_pb2, lm_pb2, tokenizer_pb2

log = logging.getLogger("muestra.gateway.scheduler")


def grpc_error_to_muestra(exc: grpc.aio.AioRpcError) -> MuestraError:
    error = MuestraError(exc.details() or exc.code().name)
    error.code = exc.code()
    return error


def logits_matrix(output: lm_pb2.BatchOutput) -> np.ndarray | None:
    tensor = output.logits
    if not tensor.data:
        return None
    return np.frombuffer(tensor.data, dtype=np.float32).reshape(tuple(tensor.shape))


class ReplicaScheduler:
    def __init__(self, model: TextModel, replica: LmReplica, sampler, max_rows: int, max_queue: int) -> None:
        self.model = model
        self.replica = replica
        self.sampler = sampler
        self.max_rows = max_rows
        self.max_queue = max_queue
        self.waiting: collections.deque[GenerationRequest] = collections.deque()
        self.rows: list[Sequence] = []
        self.batch_id = ""
        self.wake = asyncio.Event()
        self.task: asyncio.Task | None = None
        self.steps = 0

    # -- called by the Generate handlers ------------------------------------------------------

    def load(self) -> int:
        return len(self.rows) + sum(r.n for r in self.waiting)

    def submit(self, request: GenerationRequest) -> None:
        if len(self.waiting) >= self.max_queue:
            raise ResourceExhausted(f"queue is full ({self.max_queue} requests waiting on {self.replica.address})")
        request.replica = self.replica.address
        self.waiting.append(request)
        self.wake.set()
        if self.task is None or self.task.done():
            self.task = asyncio.get_running_loop().create_task(self._run(), name=f"scheduler {self.replica.address}")

    def poke(self) -> None:
        """A request was cancelled: let the loop notice it."""
        self.wake.set()

    # -- the loop -----------------------------------------------------------------------------

    async def _run(self) -> None:
        detok_task: asyncio.Task | None = None
        while True:
            if not self.rows and not self.waiting:
                self.wake.clear()
                await self.wake.wait()
            try:
                if detok_task is not None:
                    await detok_task
                    detok_task = None
                self._expire_deadlines()
                await self._drop_finished_rows()
                new_batches = await self._admit()
                if not self.rows:
                    continue
                stepped = await self._decode(new_batches)
                detok_task = asyncio.get_running_loop().create_task(self._detokenize(stepped))
            except Exception as exc:  # the lm or tokenizer failed: fail what is in flight, keep serving
                log.exception("step failed on %s", self.replica.address)
                self._fail_running(exc)

    def _expire_deadlines(self) -> None:
        now = time.monotonic()
        for row in self.rows:
            if row.request.deadline is not None and now > row.request.deadline and not row.finished:
                row.finish(gateway_pb2.CANCELLED, "deadline exceeded")
        for request in list(self.waiting):
            if request.cancelled or (request.deadline is not None and now > request.deadline):
                self.waiting.remove(request)
                request.cancelled = True
                request.out.put_nowait(None)

    async def _drop_finished_rows(self) -> None:
        finished = [row for row in self.rows if row.finished]
        if not finished:
            return
        for row in finished:
            if row.request.cancelled and not row.done_sent:
                row.emit_done()
        keep = [i for i, row in enumerate(self.rows) if not row.finished]
        if not keep:
            await self.replica.stub.Clear(lm_pb2.ClearRequest(batch_ids=[self.batch_id]))
            self.rows, self.batch_id = [], ""
            return
        reply = await self.replica.stub.Filter(lm_pb2.FilterRequest(batch_id=self.batch_id, rows=keep))
        self.rows = [self.rows[i] for i in keep]
        self.batch_id = reply.batch_id

    async def _admit(self) -> list[tuple[str, list[Sequence]]]:
        """Prefill waiting requests while rows are free; their first tokens are sampled here."""
        new_batches = []
        while (
            self.waiting and len(self.rows) + sum(len(r) for _, r in new_batches) + self.waiting[0].n <= self.max_rows
        ):
            request = self.waiting.popleft()
            if request.cancelled:
                request.out.put_nowait(None)
                continue
            request.admitted = time.monotonic()
            try:
                batch_id, rows = await self._prefill(request)
            except grpc.aio.AioRpcError as exc:
                request.fail(grpc_error_to_muestra(exc))
                continue
            if rows:
                new_batches.append((batch_id, rows))
        return new_batches

    async def _prefill(self, request: GenerationRequest) -> tuple[str, list[Sequence]]:
        kind = lm_pb2.LOGITS if self.sampler.needs_logits(request) else lm_pb2.ARGMAX
        reply = await self.replica.stub.Prefill(
            lm_pb2.PrefillRequest(
                rows=[
                    lm_pb2.PrefillRow(
                        request_id=request.request_id,
                        input_ids=request.prompt_ids,
                        output=lm_pb2.OutputSpec(kind=kind),
                    )
                ]
            )
        )
        request.cached_tokens = reply.output.rows[0].cached_tokens
        rows = [Sequence(request, i, request.prompt_ids) for i in range(request.n)]
        request.open_sequences = len(rows)
        batch_id = reply.batch_id
        logits = logits_matrix(reply.output)
        argmax = [reply.output.rows[0].argmax]
        if request.n > 1:
            filtered = await self.replica.stub.Filter(lm_pb2.FilterRequest(batch_id=batch_id, rows=[0] * request.n))
            batch_id = filtered.batch_id
            if logits is not None:
                logits = np.repeat(logits, request.n, axis=0)
            argmax = argmax * request.n
        self._accept(rows, logits, argmax)
        await self._detokenize(rows)
        live = [row for row in rows if not row.finished]
        if len(live) < len(rows):  # finished on the first token (EOS, max_tokens=1, a stop)
            keep = [i for i, row in enumerate(rows) if not row.finished]
            if not keep:
                await self.replica.stub.Clear(lm_pb2.ClearRequest(batch_ids=[batch_id]))
                return "", []
            batch_id = (await self.replica.stub.Filter(lm_pb2.FilterRequest(batch_id=batch_id, rows=keep))).batch_id
        return batch_id, live

    async def _decode(self, new_batches: list[tuple[str, list[Sequence]]]) -> list[Sequence]:
        batches = []
        if self.batch_id:
            batches.append(lm_pb2.DecodeBatch(batch_id=self.batch_id, next_ids=[r.pending_token for r in self.rows]))
        for batch_id, rows in new_batches:
            batches.append(lm_pb2.DecodeBatch(batch_id=batch_id, next_ids=[r.pending_token for r in rows]))
            self.rows.extend(rows)
        reply = await self.replica.stub.Decode(lm_pb2.DecodeRequest(batches=batches))
        self.batch_id = reply.batch_id
        self.steps += 1
        self._accept(self.rows, logits_matrix(reply.output), [r.argmax for r in reply.output.rows], reply.output)
        return list(self.rows)

    def _accept(
        self, rows: list[Sequence], logits, argmax: list[int], output: lm_pb2.BatchOutput | None = None
    ) -> None:
        """Pick each row's next token and apply the finish rules that need no text."""
        if logits is not None and output is not None:
            # Only rows that asked for LOGITS have a row in the matrix; map them.
            index = [r.logits_row for r in output.rows]
        else:
            index = list(range(len(rows))) if logits is not None else [-1] * len(rows)
        picks = self.sampler.next_tokens(rows, logits, index, argmax)
        now = time.monotonic()
        for row, (token, logprob) in zip(rows, picks, strict=True):
            request = row.request
            row.generated.append(token)
            row.first_token_at = row.first_token_at or now
            row.unsent_ids.append(token)
            if logprob is not None:
                row.unsent_logprobs.append(logprob)
            if not request.ignore_eos and token in self.model.eos_token_ids:
                row.finish(gateway_pb2.STOP, f"eos:{token}")
            elif token in request.stop_token_ids:
                row.finish(gateway_pb2.STOP, f"token:{token}")
            else:
                row.detok.add([token])
                row.pending_token = token
            if not row.finished and (
                len(row.generated) >= request.max_tokens
                or len(request.prompt_ids) + len(row.generated) >= self.model.context_length
            ):
                row.finish(gateway_pb2.LENGTH)

    async def _detokenize(self, rows: list[Sequence]) -> None:
        """One DetokenizeStep for every row with new ids; stream the text, apply stop strings."""
        active = [row for row in rows if not row.done_sent and (row.detok.pending() or row.finished)]
        if not active:
            return
        reply = await self.model.tokenizer.DetokenizeStep(
            tokenizer_pb2.DetokenizeStepRequest(
                model=self.model.tokenizer_model,
                streams=[row.detok.stream(final=row.finished) for row in active],
                skip_special_tokens=True,
            )
        )
        for row, delta in zip(active, reply.deltas, strict=True):
            text = row.stops.feed(row.detok.apply(delta))
            if row.stops.matched is not None:
                row.finish(gateway_pb2.STOP, row.stops.matched)
            elif row.finished:
                text += row.stops.flush()
            if row.request.cancelled:
                row.emit_done()
                continue
            row.emit_text(text)
            if row.finished:
                row.emit_done()

    def _fail_running(self, exc: Exception) -> None:
        message = exc.details() if isinstance(exc, grpc.aio.AioRpcError) else str(exc)
        for row in self.rows:
            row.emit_done(error=f"lm replica {self.replica.address} failed: {message}")
        self.rows, self.batch_id = [], ""

"""Continuous batching on one lm replica.

Between two decode steps, finished and cancelled rows leave the batch and beam-search rows
are reordered (one Filter call, repeats allowed), and waiting requests are prefilled and join
it (Decode concatenates the new batches with the running one). One Decode call per step
serves every row; the detokenization of step t overlaps the lm's work on step t+1.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time

import grpc
import numpy as np

from muestra.gateway import metrics
from muestra.gateway.models import LmReplica, TextModel
from muestra.gateway.request import BeamGroup, BeamRow, GenerationRequest, Sequence
from muestra.gateway.sampling import ModelInfo, SearchRequest, new_rows, sample_next_tokens
from muestra.gateway.step_stream import StepStream
from muestra.runtime.errors import MuestraError, ResourceExhausted
from muestra.v1 import gateway_pb2, lm_pb2, tokenizer_pb2

log = logging.getLogger("muestra.gateway.scheduler")
Row = Sequence | BeamRow


def grpc_error_to_muestra(exc: grpc.aio.AioRpcError) -> MuestraError:
    """A backend's status, passed on to the client with its code and message."""
    error = MuestraError(exc.details() or exc.code().name)
    error.code = exc.code()
    return error


def logits_matrix(output: lm_pb2.BatchOutput) -> np.ndarray | None:
    tensor = output.logits
    if not tensor.data:
        return None
    return np.frombuffer(tensor.data, dtype=np.float32).reshape(tuple(tensor.shape))


def _groups(rows: list[Row]) -> dict[BeamGroup, list[int]]:
    """Each beam group in the batch with the positions of its rows, in order."""
    groups: dict[BeamGroup, list[int]] = {}
    for i, row in enumerate(rows):
        if isinstance(row, BeamRow):
            groups.setdefault(row.group, []).append(i)
    return groups


class ReplicaScheduler:
    def __init__(self, model: TextModel, replica: LmReplica, max_rows: int, max_queue: int) -> None:
        self.model = model
        self.replica = replica
        self.max_rows = max_rows
        self.max_queue = max_queue
        self.model_info = ModelInfo(model.vocab_size, model.eos_token_ids, model.context_length)
        self.waiting: collections.deque[GenerationRequest] = collections.deque()
        self.rows: list[Row] = []
        self.batch_id = ""
        self.wake = asyncio.Event()
        self.task: asyncio.Task | None = None
        self.steps = 0
        # DetokenizeStep runs every step: on one open stream, not a call each time.
        self.detokenize_stream = StepStream(model.tokenizer.DetokenizeSteps, f"tokenizer of {model.name!r}")
        # ... and so do Decode, Filter and Clear (a draining lm keeps serving them there). They change
        # the lm's batches, so a broken step is not retried. Only the loop below uses it, one step at a time.
        self.batch_stream = StepStream(replica.stub.BatchSteps, f"lm {replica.address}", retry=False)
        # Set by the Router: whether requests may be sent here, and where to send them if not.
        self.healthy = True
        self.router = None

    # -- called by the Generate handlers ------------------------------------------------------

    def load(self) -> int:
        return len(self.rows) + sum(r.rows for r in self.waiting)

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
                if detok_task is not None:
                    await detok_task
                    detok_task = None
                    continue
                self.wake.clear()
                await self.wake.wait()
            try:
                self._expire()
                self.batch_id, self.rows = await self._reshape(self.batch_id, self.rows)
                new_batches = await self._admit()
                if not self.rows and not new_batches:
                    continue
                # The lm works on step t+1 while the tokenizer turns step t into text.
                reply = await self._decode(new_batches)
                if detok_task is not None:
                    await detok_task
                    detok_task = None
                stepped = await self._accept_step(reply)
                metrics.RUNNING.labels(self.model.name, self.replica.address).set(len(self.rows))
                metrics.WAITING.labels(self.model.name, self.replica.address).set(len(self.waiting))
                detok_task = asyncio.get_running_loop().create_task(self._detokenize(stepped))
            except Exception as exc:  # the lm or tokenizer failed: end what is in flight, keep serving
                log.exception("step failed on %s", self.replica.address)
                if detok_task is not None:
                    detok_task.cancel()
                    detok_task = None
                self._fail_running(exc)

    def _expire(self) -> None:
        now = time.monotonic()
        for row in self.rows:
            deadline = row.request.deadline
            if deadline is not None and now > deadline and isinstance(row, Sequence) and not row.finished:
                row.finish(gateway_pb2.CANCELLED, "deadline exceeded")
        for request in list(self.waiting):
            if request.cancelled or (request.deadline is not None and now > request.deadline):
                self.waiting.remove(request)
                request.cancelled = True
                request.out.put_nowait(None)

    async def _reshape(self, batch_id: str, rows: list[Row]) -> tuple[str, list[Row]]:
        """Drop finished rows and reorder beams, with one Filter call when anything changed."""
        keep: list[int] = []
        kept: list[Row] = []
        groups = _groups(rows)
        for i, row in enumerate(rows):
            if isinstance(row, Sequence):
                if row.finished:
                    if row.request.cancelled:
                        row.emit_done()
                    continue
                keep.append(i)
                kept.append(row)
                continue
            group = row.group
            positions = groups.get(group)
            if positions is None or positions[0] != i:
                continue  # the group was handled at its first row
            if group.finished:
                if group.request.cancelled:
                    for sequence in group.sequences:
                        sequence.emit_done()
                continue
            step = group.pending
            group.pending = None
            for source, token in zip(step.source_rows, step.next_tokens, strict=True):
                keep.append(positions[source])
                kept.append(BeamRow(group, int(token)))
        if keep == list(range(len(rows))):
            return batch_id, kept
        if not keep:
            try:
                await self._lm_step(clear=lm_pb2.ClearRequest(batch_ids=[batch_id]))
            except grpc.aio.AioRpcError as exc:
                # Every row is done, so nothing is lost: an lm that is gone or stopping frees the batch with it.
                log.warning("lm %s: freeing a finished batch failed (%s)", self.replica.address, exc.code().name)
            return "", []
        reply = (await self._lm_step(filter=lm_pb2.FilterRequest(batch_id=batch_id, rows=keep))).filter
        return reply.batch_id, kept

    async def _admit(self) -> list[tuple[str, list[Row]]]:
        """Prefill waiting requests while rows are free; their first tokens are picked here."""
        new_batches = []
        used = len(self.rows)
        while self.waiting and used + self.waiting[0].rows <= self.max_rows:
            request = self.waiting.popleft()
            if request.cancelled:
                request.out.put_nowait(None)
                continue
            request.admitted = time.monotonic()
            try:
                batch_id, rows = await self._prefill(request)
            except grpc.aio.AioRpcError as exc:
                if exc.code() == grpc.StatusCode.UNAVAILABLE and self.router is not None and not request.started:
                    # The replica is gone and nothing was streamed yet: another replica takes it.
                    log.warning("lm %s unavailable; rerouting %s", self.replica.address, request.request_id)
                    self.router.reroute(request, self)
                    continue
                request.fail(grpc_error_to_muestra(exc))
                continue
            if rows:
                new_batches.append((batch_id, rows))
                used += len(rows)
        return new_batches

    async def _prefill(self, request: GenerationRequest) -> tuple[str, list[Row]]:
        chain = request.chain
        if chain.is_search:
            group = BeamGroup(
                request, SearchRequest(chain, request.prompt_ids, self.model_info, request.max_tokens, request.seed)
            )
            rows: list[Row] = [BeamRow(group)]
            request.open_sequences = request.n
            kind = lm_pb2.LOGITS
        else:
            sampling = new_rows(
                chain, request.prompt_ids, request.seed, request.n, request.logprobs, request.top_logprobs
            )
            rows = [Sequence(request, i, s) for i, s in enumerate(sampling)]
            request.open_sequences = len(rows)
            kind = sampling[0].output_kind
        prefix_cache = self.model.prefix_cache if request.prefix_cache else None
        prefix = await prefix_cache.prefix_blocks(request.prompt_ids) if prefix_cache is not None else None
        reply = await self.replica.stub.Prefill(
            lm_pb2.PrefillRequest(
                rows=[
                    lm_pb2.PrefillRow(
                        request_id=request.request_id,
                        input_ids=request.prompt_ids,
                        output=lm_pb2.OutputSpec(kind=kind),
                        prefix=prefix,
                    )
                ]
            )
        )
        request.cached_tokens = reply.output.rows[0].cached_tokens
        if prefix_cache is not None:
            prefix_cache.record_hit(request.cached_tokens)
        batch_id = reply.batch_id
        logits = logits_matrix(reply.output)
        argmax = reply.output.rows[0].argmax
        if isinstance(rows[0], Sequence) and len(rows) > 1:
            # n > 1: the completions share this prefill; Filter repeats its row.
            repeat = lm_pb2.FilterRequest(batch_id=batch_id, rows=[0] * len(rows))
            batch_id = (await self._lm_step(filter=repeat)).filter.batch_id
        index = [0] * len(rows) if logits is not None else [-1] * len(rows)
        await self._accept(rows, logits, index, [argmax] * len(rows))
        await self._detokenize(rows)
        return await self._reshape(batch_id, rows)

    async def _lm_step(self, **step) -> lm_pb2.BatchStepResponse:
        """One Decode, Filter or Clear over the replica's BatchSteps stream."""
        return await self.batch_stream.step(lm_pb2.BatchStepRequest(**step))

    async def _decode(self, new_batches: list[tuple[str, list[Row]]]) -> lm_pb2.DecodeResponse:
        batches = []
        if self.batch_id:
            batches.append(lm_pb2.DecodeBatch(batch_id=self.batch_id, next_ids=[r.pending_token for r in self.rows]))
        for batch_id, rows in new_batches:
            batches.append(lm_pb2.DecodeBatch(batch_id=batch_id, next_ids=[r.pending_token for r in rows]))
            self.rows.extend(rows)
        reply = (await self._lm_step(decode=lm_pb2.DecodeRequest(batches=batches))).decode
        self.batch_id = reply.batch_id
        self.steps += 1
        return reply

    async def _accept_step(self, reply: lm_pb2.DecodeResponse) -> list[Row]:
        output = reply.output
        await self._accept(
            self.rows, logits_matrix(output), [r.logits_row for r in output.rows], [r.argmax for r in output.rows]
        )
        return [row for row in self.rows if isinstance(row, Sequence)]

    async def _accept(self, rows: list[Row], logits, index: list[int], argmax: list[int]) -> None:
        """Pick every row's next token (samplers, or the beam search) and apply the finish rules."""
        positions = [i for i, row in enumerate(rows) if isinstance(row, Sequence)]
        if positions:
            result = sample_next_tokens(
                [rows[i].sampling for i in positions],
                logits,
                [index[i] for i in positions],
                [argmax[i] for i in positions],
            )
            now = time.monotonic()
            for k, i in enumerate(positions):
                self._take(rows[i], result, k, now)
        for group, where in _groups(rows).items():
            group.pending = group.search.step(logits[[index[p] for p in where]])
            if group.search.done:
                await self._finish_beams(group)

    def _take(self, row: Sequence, result, k: int, now: float) -> None:
        request = row.request
        if row.finished:  # a stop string matched while this step ran; the row leaves next step
            return
        if result.errors[k] is not None:
            row.finish(gateway_pb2.ERROR)
            row.error = result.errors[k]
            return
        token = int(result.token_ids[k])
        row.generated.append(token)
        if row.first_token_at is None:
            row.first_token_at = now
            metrics.TIME_TO_FIRST_TOKEN.labels(self.model.name).observe(now - request.arrival)
        else:
            metrics.INTER_TOKEN_LATENCY.labels(self.model.name).observe(now - row.last_token_at)
        row.last_token_at = now
        row.unsent_ids.append(token)
        if request.logprobs:
            top_ids = result.top_ids[k] if result.top_ids[k] is not None else ()
            top_logprobs = result.top_logprobs[k] if result.top_ids[k] is not None else ()
            top = [
                gateway_pb2.TopLogprob(token_id=int(t), logprob=float(lp))
                for t, lp in zip(top_ids, top_logprobs, strict=True)
            ]
            row.unsent_logprobs.append(
                gateway_pb2.TokenLogprob(token_id=token, logprob=float(result.logprobs[k]), top=top)
            )
        if not request.ignore_eos and token in self.model.eos_token_ids:
            row.finish(gateway_pb2.STOP, f"eos:{token}")
        elif token in request.stop_token_ids:
            row.finish(gateway_pb2.STOP, f"token:{token}")
        else:
            if token < self.model.tokenizer_vocab_size:
                row.detok.append(token)
            row.pending_token = token
        if not row.finished and (
            len(row.generated) >= request.max_tokens
            or len(request.prompt_ids) + len(row.generated) >= self.model.context_length
        ):
            row.finish(gateway_pb2.LENGTH)

    async def _finish_beams(self, group: BeamGroup) -> None:
        """A finished search: decode its best hypotheses and stream them as the n completions."""
        hypotheses = group.search.results()[: group.request.n]
        reply = await self.model.tokenizer.Decode(
            tokenizer_pb2.DecodeTokensRequest(
                model=self.model.tokenizer_model,
                sequences=[
                    tokenizer_pb2.TokenIds(ids=[i for i in h.token_ids if i < self.model.tokenizer_vocab_size])
                    for h in hypotheses
                ],
                skip_special_tokens=True,
            )
        )
        now = time.monotonic()
        for sequence, hypothesis, text in zip(group.sequences, hypotheses, reply.texts, strict=False):
            sequence.generated = list(hypothesis.token_ids)
            sequence.unsent_ids = list(hypothesis.token_ids)
            sequence.first_token_at = sequence.first_token_at or now
            ends_with_eos = bool(hypothesis.token_ids) and hypothesis.token_ids[-1] in self.model.eos_token_ids
            out = sequence.stops.feed(text)
            if sequence.stops.matched is not None:
                sequence.finish(gateway_pb2.STOP, sequence.stops.matched)
            else:
                out += sequence.stops.flush()
                sequence.finish(gateway_pb2.STOP if ends_with_eos else gateway_pb2.LENGTH)
            sequence.emit_text(out)
            sequence.emit_done()
        for sequence in group.sequences[len(hypotheses) :]:
            sequence.emit_done(error="beam search produced fewer hypotheses than n")

    async def _detokenize(self, rows: list[Row]) -> None:
        """One DetokenizeStep for every row with new ids; stream the text, apply stop strings."""
        active = [
            row
            for row in rows
            if isinstance(row, Sequence) and not row.done_sent and (row.detok.pending or row.finished or row.unsent_ids)
        ]
        if not active:
            return
        reply = await self.detokenize_stream.step(
            tokenizer_pb2.DetokenizeStepRequest(
                model=self.model.tokenizer_model,
                streams=[row.detok.next_stream(final=row.finished) for row in active],
                skip_special_tokens=True,
            )
        )
        await self._name_logprob_tokens(active)
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

    async def _name_logprob_tokens(self, rows: list[Sequence]) -> None:
        """Fill in the text of each token listed with logprobs (one Decode call for all of them)."""
        entries = [entry for row in rows for entry in row.unsent_logprobs if not entry.token]
        if not entries:
            return
        every = {e.token_id for e in entries} | {t.token_id for e in entries for t in e.top}
        ids = sorted(i for i in every if i < self.model.tokenizer_vocab_size)
        reply = await self.model.tokenizer.Decode(
            tokenizer_pb2.DecodeTokensRequest(
                model=self.model.tokenizer_model, sequences=[tokenizer_pb2.TokenIds(ids=[i]) for i in ids]
            )
        )
        text = dict(zip(ids, reply.texts, strict=True))
        for entry in entries:
            entry.token = text.get(entry.token_id, "")
            for alternative in entry.top:
                alternative.token = text.get(alternative.token_id, "")

    def _fail_running(self, exc: Exception) -> None:
        message = exc.details() if isinstance(exc, grpc.aio.AioRpcError) else str(exc)
        for row in self.rows:
            sequences = row.group.sequences if isinstance(row, BeamRow) else [row]
            for sequence in sequences:
                sequence.emit_done(error=f"lm replica {self.replica.address} failed: {message}")
        self.rows, self.batch_id = [], ""

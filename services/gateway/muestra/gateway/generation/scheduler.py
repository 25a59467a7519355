"""Continuous batching on one lm replica.

Between two decode steps, finished and cancelled rows leave the batch and beam-search rows
are reordered (one Filter call, repeats allowed), and waiting requests are prefilled and join
it (Decode concatenates the new batches with the running one). One Decode call per step
serves every row; the detokenization of step t overlaps the lm's work on step t+1.

When every row is greedy (the lm's argmax, no constraint, no stop strings) and nobody waits, one
Decode runs several steps (DecodeRequest.greedy_steps): the lm feeds each argmax back itself, and
the gateway takes the tokens in a burst, as vLLM's multi-step scheduling does. A burst is at most
--greedy-burst steps and about --greedy-burst-ms long, so a request that arrives meanwhile waits
no longer than that for its prefill.

Every await on the lm or the tokenizer has a deadline. When the lm replica fails (or misses a
deadline) its requests that have not streamed anything move to another replica, once, and the
others end with UNAVAILABLE naming the replica; when the tokenizer fails, the requests waiting on
it end with UNAVAILABLE. Either way the loop goes on serving.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
import uuid

import grpc
import numpy as np

from muestra.gateway import metrics
from muestra.gateway.backends import LmReplica, TextModel
from muestra.gateway.constraints.engine import fill_masks
from muestra.gateway.generation.detokenizer import Detokenizer, TokenizerFailed
from muestra.gateway.generation.kv_admission import KvAdmission
from muestra.gateway.generation.progress import Progress
from muestra.gateway.generation.request import BeamGroup, BeamRow, GenerationRequest, Sequence
from muestra.gateway.generation.step_stream import StepStream
from muestra.gateway.sampling import ModelInfo, SearchRequest, new_rows, sample_next_tokens
from muestra.runtime.errors import InvalidArgument, MuestraError, ResourceExhausted, Unavailable
from muestra.runtime.logs import request_id_scope, request_id_var
from muestra.runtime.step_streams import LEASE_HEADER
from muestra.v1 import gateway_pb2, lm_pb2

log = logging.getLogger("muestra.gateway.generation.scheduler")
Row = Sequence | BeamRow

# Statuses of a Prefill that concern the request, not the replica: that request fails alone.
_REQUEST_STATUSES = (
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
    grpc.StatusCode.FAILED_PRECONDITION,
    grpc.StatusCode.OUT_OF_RANGE,
    grpc.StatusCode.INTERNAL,
)
# A request that has streamed nothing moves to another replica at most this many times.
MAX_REROUTES = 1
# Forced tokens a row may take ahead of the lm, and most tokens one row feeds in one step (the lm's
# default --max-tokens-per-row is 32).
MAX_QUEUED = 16
MAX_TOKENS_PER_STEP = 16
# Most stop ids one Decode lists (the lm's limit); with more, a burst runs its full length.
MAX_STOP_IDS = 1024
# Weight of the newest step in the running estimate of a replica's time per step.
STEP_TIME_WEIGHT = 0.2


def grpc_error_to_muestra(exc: grpc.aio.AioRpcError) -> MuestraError:
    """A backend's status, passed on to the client with its code and message."""
    error = MuestraError(exc.details() or exc.code().name)
    error.code = exc.code()
    return error


class LmFailed(Unavailable):
    """The lm replica failed a call, or did not answer within the deadline: its batch is lost."""

    def __init__(self, address: str, exc: grpc.aio.AioRpcError) -> None:
        super().__init__(f"lm replica {address} failed: {exc.code().name} {exc.details() or ''}".rstrip())
        self.address = address


def logits_matrix(output: lm_pb2.BatchOutput) -> np.ndarray | None:
    tensor = output.logits
    if not tensor.data:
        return None
    return np.frombuffer(tensor.data, dtype=np.float32).reshape(tuple(tensor.shape))


def _allowed_tokens(row: Row) -> bytes:
    """The row's allowed-token mask for its next step, when the lm is to apply one."""
    if not isinstance(row, Sequence) or row.finished or not row.sampling.mask_in_lm:
        return b""
    constraint = row.sampling.constraint
    return constraint.mask_bytes() if constraint is not None and not constraint.error else b""


def _tokens_per_row(rows: list[Row]) -> int:
    """How many tokens every row can feed in one step: more than one only for a lone row with tokens queued
    (onnxruntime's fused attention takes several new tokens after a past only for a batch of one)."""
    if len(rows) != 1 or not isinstance(rows[0], Sequence):
        return 1
    return min(1 + len(rows[0].queued), MAX_TOKENS_PER_STEP)


def _bursts(row: Row) -> bool:
    """Whether the lm may pick this row's next tokens itself, several steps in a row: a greedy row that
    ships no logits, has no constraint, feeds one token, and has no stop strings (text, not ids, would end it
    somewhere inside the burst, and the tokens after that point would still count as generated)."""
    return (
        isinstance(row, Sequence)
        and not row.in_flight
        and not row.queued
        and row.sampling.constraint is None
        and row.sampling.output_kind == lm_pb2.ARGMAX
        and not row.request.stop
    )


def _stop_ids(rows: list[Sequence], eos: tuple[int, ...]) -> list[int]:
    """Ids after which rows end (EOS unless ignored, stop_token_ids): the lm ends a burst once all rows met one."""
    ids: set[int] = set()
    for request in _requests(rows):
        ids |= request.stop_token_ids
        if not request.ignore_eos:
            ids.update(eos)
    return sorted(ids) if len(ids) <= MAX_STOP_IDS else []


def _decode_batch(batch_id: str, rows: list[Row], masked: bool, tokens: int) -> lm_pb2.DecodeBatch:
    """The step for these rows: each feeds `tokens` tokens (its pending one, then queued ones)."""
    batch = lm_pb2.DecodeBatch(batch_id=batch_id)
    for row in rows:
        if not isinstance(row, Sequence):
            batch.next_ids.append(row.pending_token)
            continue
        feed = [row.pending_token, *row.queued]
        batch.next_ids.extend(feed[:tokens])
        rest = feed[tokens:]
        row.pending_token, row.queued, row.in_flight = (rest[0] if rest else None), rest[1:], bool(rest)
    if masked:
        for row in rows:
            kind = row.sampling.output_kind if isinstance(row, Sequence) else lm_pb2.LOGITS
            if isinstance(row, Sequence) and row.in_flight:  # its next token is already known
                batch.outputs.add(kind=lm_pb2.ARGMAX)
            else:
                batch.outputs.add(kind=kind, allowed_tokens=_allowed_tokens(row))
    return batch


def _next_masks(rows: list[Sequence]) -> None:
    """Compute the next allowed tokens of the constrained rows still running; a dead end ends its row."""
    running = [row for row in rows if row.sampling.constraint is not None and not row.finished]
    fill_masks([row.sampling.constraint for row in running])
    for row in running:
        if row.sampling.constraint.error:
            row.finish(gateway_pb2.ERROR)
            row.error = row.sampling.constraint.error


def _groups(rows: list[Row]) -> dict[BeamGroup, list[int]]:
    """Each beam group in the batch with the positions of its rows, in order."""
    groups: dict[BeamGroup, list[int]] = {}
    for i, row in enumerate(rows):
        if isinstance(row, BeamRow):
            groups.setdefault(row.group, []).append(i)
    return groups


def _requests(rows: list[Row]) -> list[GenerationRequest]:
    """The requests the rows belong to, each once, in order."""
    return list({id(row.request): row.request for row in rows}.values())


class ReplicaScheduler:
    def __init__(self, model: TextModel, replica: LmReplica, config) -> None:
        self.model = model
        self.replica = replica
        self.name = f"lm {replica.address}"
        self.max_rows = config.max_batch_rows
        self.max_queue = config.max_queue
        self.lm_timeout_s = config.lm_timeout_s
        self.mask_in_lm = config.constraint_mask == "lm"
        self.model_info = ModelInfo(model.vocab_size, model.eos_token_ids, model.context_length)
        self.waiting: collections.deque[GenerationRequest] = collections.deque()
        self.rows: list[Row] = []
        self.batch_id = ""
        # Batches prefilled since the last step, with their rows: the next Decode joins them to the running one.
        self.joining: list[tuple[str, list[Row]]] = []
        # The request being prefilled (out of `waiting`, not yet in `joining`).
        self.admitting: GenerationRequest | None = None
        self.wake = asyncio.Event()
        self.task: asyncio.Task | None = None
        self.steps = 0
        self.greedy_burst = config.greedy_burst
        self.greedy_burst_s = config.greedy_burst_ms / 1000
        self.kv = KvAdmission(model.name, replica, config.greedy_burst)  # admission by the lm's KV budget
        # Running estimate of one decode step's time here (None until a step was timed).
        self.step_s: float | None = None
        self.progress = Progress()
        self.detokenizer = Detokenizer(model, self.progress, config.tokenizer_timeout_s)
        # Decode, Filter and Clear go over one open stream (a draining lm keeps serving them there).
        # They change the lm's batches, so a broken step is not retried.
        # The lm leases the batches this scheduler creates to it: nobody else can step or clear them, and
        # they are freed if this stream breaks (or if they idle past the lm's batch_idle_s).
        self.lease = f"gateway-{uuid.uuid4().hex}"
        self.lease_metadata = ((LEASE_HEADER, self.lease),)
        self.batch_stream = StepStream(
            lambda: replica.stub.BatchSteps(metadata=self.lease_metadata),
            self.name, retry=False, timeout_s=self.lm_timeout_s,
        )  # fmt: skip
        # Set by the Router: whether requests may be sent here, and where to send them if not.
        self.healthy = True
        self.router = None
        # Read when /metrics is scraped, so they never go stale between steps.
        labels = (model.name, replica.address)
        metrics.RUNNING.labels(*labels).set_function(self.running_requests)
        metrics.WAITING.labels(*labels).set_function(lambda: len(self.waiting))
        metrics.ROWS_RUNNING.labels(*labels).set_function(
            lambda: len(self.rows) + sum(len(rows) for _, rows in self.joining)
        )
        metrics.KV_RESERVED.labels(*labels).set_function(lambda: self.kv.reserved_bytes(self._batch_rows()))

    # -- called by the Generate handlers and the router -----------------------------------------

    def load(self) -> int:
        return len(self.rows) + sum(len(rows) for _, rows in self.joining) + sum(r.rows for r in self.waiting)

    def running_requests(self) -> int:
        """Requests with rows here (running or joining) or being prefilled."""
        requests = {id(row.request) for row in self.rows}
        requests.update(id(row.request) for _, rows in list(self.joining) for row in rows)
        if self.admitting is not None:
            requests.add(id(self.admitting))
        return len(requests)

    def _batch_rows(self) -> list[Row]:
        """The running rows and those joining them at the next step."""
        return [*self.rows, *(row for _, rows in self.joining for row in rows)]

    def has_work(self) -> bool:
        return bool(self.rows or self.joining or self.waiting)

    def submit(self, request: GenerationRequest) -> None:
        if len(self.waiting) >= self.max_queue:
            raise ResourceExhausted(f"queue is full ({self.max_queue} requests waiting on {self.replica.address})")
        if (too_big := self.kv.alone_error(request)) is not None:
            return request.fail(too_big)
        request.replica = self.replica.address
        self.waiting.append(request)
        self.wake.set()
        if self.task is None or self.task.done():
            self.task = asyncio.get_running_loop().create_task(self._run(), name=f"scheduler {self.replica.address}")
            self.task.add_done_callback(self._loop_ended)

    def poke(self) -> None:
        """A request was cancelled: let the loop notice it."""
        self.wake.set()

    # -- the loop -----------------------------------------------------------------------------

    async def _run(self) -> None:
        # This task serves every request sent here, not the one that started it: its log lines and
        # calls carry a request's id only while it works for that request (admission), and the step
        # streams' messages name their requests themselves.
        request_id_var.set("-")
        detokenizing: asyncio.Task | None = None
        while True:
            try:
                if not self.rows and not self.waiting:
                    if detokenizing is not None:
                        task, detokenizing = detokenizing, None
                        await task
                        continue
                    self.progress.moved()
                    self.wake.clear()
                    await self.wake.wait()
                self._expire()
                await self._reshape()
                await self._admit()
                if not self.rows and not self.joining:
                    continue
                # The lm works on step t+1 while the tokenizer turns step t into text.
                step_started = time.monotonic()
                reply = await self._decode()
                if detokenizing is not None:
                    task, detokenizing = detokenizing, None
                    await task
                stepped = await self._accept_step(reply)
                metrics.STEP_TIME.labels(self.model.name, self.replica.address).observe(time.monotonic() - step_started)
                detokenizing = asyncio.get_running_loop().create_task(self.detokenizer.step(stepped))
            except LmFailed as exc:
                detokenizing = await _stop(detokenizing)
                self._lm_failed(exc)
            except TokenizerFailed as exc:
                detokenizing = await _stop(detokenizing)
                await self._end_all(exc)
            except Exception:  # a bug: end what is in flight, keep serving
                log.exception("step failed on %s", self.replica.address)
                detokenizing = await _stop(detokenizing)
                await self._end_all(MuestraError(f"internal error in the gateway's scheduler for {self.name}"))
            finally:
                self.progress.moved()

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

    async def _reshape(self) -> None:
        """Drop finished rows and reorder beams in the running batch."""
        self.batch_id, self.rows = await self._reshaped(self.batch_id, self.rows)

    async def _reshaped(self, batch_id: str, rows: list[Row]) -> tuple[str, list[Row]]:
        """`rows` without finished rows and with beams reordered, with one Filter call when anything changed."""
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
                await self._lm_step("Clear", clear=lm_pb2.ClearRequest(batch_ids=[batch_id]))
            except LmFailed as exc:
                # Every row is done, so nothing is lost: an lm that is gone or stopping frees the batch with it.
                log.warning("freeing a finished batch failed (%s)", exc)
            return "", []
        reply = await self._lm_step("Filter", filter=lm_pb2.FilterRequest(batch_id=batch_id, rows=keep))
        return reply.filter.batch_id, kept

    async def _admit(self) -> None:
        """Prefill waiting requests while rows are free; their first tokens are picked here."""
        used = len(self.rows)
        while self.waiting and used + self.waiting[0].rows <= self.max_rows:
            if not self.kv.admits(self.waiting, self._batch_rows()):
                break  # it waits at the head until rows leave; those behind it wait too
            request = self.waiting.popleft()
            if request.cancelled:
                request.out.put_nowait(None)
                continue
            request.admitted = time.monotonic()
            metrics.QUEUE_TIME.labels(self.model.name).observe(request.admitted - request.arrival)
            self.admitting = request
            try:
                with request_id_scope(request.request_id):
                    used += await self._prefill(request)
            except LmFailed as exc:
                self._move_or_fail(request, exc)
                raise
            except TokenizerFailed as exc:
                request.fail(exc)
                raise
            except MuestraError as exc:
                request.fail(exc)
            finally:
                self.admitting = None
            self.progress.moved()

    async def _prefill(self, request: GenerationRequest) -> int:
        """Prefill one request into a batch of its own (in self.joining); the rows it still occupies."""
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
                chain, request.prompt_ids, request.seed, request.n, request.logprobs, request.top_logprobs,
                request.constraint, self.mask_in_lm,
            )  # fmt: skip
            rows = [Sequence(request, i, s) for i, s in enumerate(sampling)]
            request.open_sequences = len(rows)
            if request.constraint is not None:
                fill_masks([s.constraint for s in sampling])
                if sampling[0].constraint.error:
                    raise InvalidArgument("constraint", f"allows no text at all ({sampling[0].constraint.error})")
            kind = sampling[0].output_kind
        prefix_cache = self.model.prefix_cache if request.prefix_cache else None
        prefix = None
        if prefix_cache is not None:
            with self.progress.waiting_for("Redis prefix lookup"):
                prefix = await prefix_cache.prefix_blocks(request.prompt_ids)
        request.attempts += 1
        prefill = lm_pb2.PrefillRequest(
            rows=[
                lm_pb2.PrefillRow(
                    request_id=request.request_id,
                    input_ids=request.prompt_ids,
                    output=lm_pb2.OutputSpec(kind=kind, allowed_tokens=_allowed_tokens(rows[0])),
                    prefix=prefix,
                )
            ]
        )
        # The lm frees a lease's batches when its step stream breaks: have one open before holding any.
        self.batch_stream.open()
        with self.progress.waiting_for(f"{self.name} Prefill"):
            try:
                reply = await self.replica.stub.Prefill(
                    prefill, timeout=self._prefill_timeout(request), metadata=self.lease_metadata
                )
            except grpc.aio.AioRpcError as exc:
                if exc.code() in _REQUEST_STATUSES:
                    raise grpc_error_to_muestra(exc) from exc
                raise LmFailed(self.replica.address, exc) from exc
        request.cached_tokens = reply.output.rows[0].cached_tokens
        if prefix_cache is not None:
            prefix_cache.record_hit(request.cached_tokens)
        batch_id = reply.batch_id
        logits = logits_matrix(reply.output)
        argmax = reply.output.rows[0].argmax
        joining = [batch_id, []]
        self.joining.append(joining)  # from now on, a failure handler sees (and frees) this batch
        if isinstance(rows[0], Sequence) and len(rows) > 1:
            # n > 1: the completions share this prefill; Filter repeats its row.
            repeat = lm_pb2.FilterRequest(batch_id=batch_id, rows=[0] * len(rows))
            joining[0] = batch_id = (await self._lm_step("Filter", filter=repeat)).filter.batch_id
        joining[1] = rows
        index = [0] * len(rows) if logits is not None else [-1] * len(rows)
        await self._accept(rows, logits, index, [argmax] * len(rows))
        metrics.PREFILL_TIME.labels(self.model.name).observe(time.monotonic() - request.admitted)
        await self.detokenizer.step(rows)
        joining[0], joining[1] = batch_id, rows = await self._reshaped(batch_id, rows)
        if not rows:
            self.joining.remove(joining)
        return len(rows)

    def _prefill_timeout(self, request: GenerationRequest) -> float:
        """The lm's deadline, or the request's own when it comes first."""
        if request.deadline is None:
            return self.lm_timeout_s
        return max(0.001, min(self.lm_timeout_s, request.deadline - time.monotonic()))

    async def _lm_step(self, what: str, **step) -> lm_pb2.BatchStepResponse:
        """One Decode, Filter or Clear over the replica's BatchSteps stream; LmFailed if it fails."""
        with self.progress.waiting_for(f"{self.name} BatchSteps {what}"):
            try:
                return await self.batch_stream.step(lm_pb2.BatchStepRequest(**step))
            except grpc.aio.AioRpcError as exc:
                raise LmFailed(self.replica.address, exc) from exc

    async def _decode(self) -> lm_pb2.DecodeResponse:
        batches = []
        # Rows with constraints send their kinds (which change on forced tokens) and, when the lm applies
        # them, their masks with every step; so does every row of their batches.
        every = self._batch_rows()
        masked = any(isinstance(r, Sequence) and r.sampling.constraint is not None for r in every)
        tokens = _tokens_per_row(every)
        steps = self._burst(every)
        if self.batch_id:
            batches.append(_decode_batch(self.batch_id, self.rows, masked, tokens))
        for batch_id, rows in self.joining:
            batches.append(_decode_batch(batch_id, rows, masked, tokens))
            self.rows.extend(rows)
        # Joined or lost with this call either way: Decode consumes the batches it is given.
        self.joining = []
        request = lm_pb2.DecodeRequest(batches=batches, tokens_per_row=tokens if tokens > 1 else 0)
        if steps > 1:
            request.greedy_steps = steps
            request.stop_token_ids.extend(_stop_ids(every, self.model.eos_token_ids))
        reply = (await self._lm_step("Decode", decode=request)).decode
        self.batch_id = reply.batch_id
        self.steps += 1
        ran = len(reply.output.rows[0].greedy_ids) if steps > 1 and reply.output.rows else 1
        metrics.DECODE_BURST.labels(self.model.name, self.replica.address).observe(ran)
        if reply.timing.total_us and ran:
            step_s = reply.timing.total_us / 1e6 / ran
            self.step_s = step_s if self.step_s is None else self.step_s + STEP_TIME_WEIGHT * (step_s - self.step_s)
        return reply

    def _burst(self, rows: list[Row]) -> int:
        """Greedy steps for the next Decode: 1 unless every row may burst and nobody waits to join."""
        burst = min(self.greedy_burst, self.replica.max_greedy_steps)
        # A request that could join now (one that arrived during admission) should not wait for a burst.
        joinable = bool(self.waiting) and len(rows) + self.waiting[0].rows <= self.max_rows
        joinable = joinable and self.kv.fits(self.waiting[0], rows)
        if burst <= 1 or joinable or self.step_s is None or not all(_bursts(row) for row in rows):
            return 1
        if self.step_s > 0:
            burst = min(burst, int(self.greedy_burst_s / self.step_s))
        # No row may pass the context length (its KV holds its prompt and all but its pending token), and
        # steps past the longest remaining max_tokens would only be dropped.
        room = min(self.model.context_length - len(row.request.prompt_ids) - len(row.generated) for row in rows)
        wanted = max(row.request.max_tokens - len(row.generated) for row in rows)
        return max(1, min(burst, room, wanted))

    async def _accept_step(self, reply: lm_pb2.DecodeResponse) -> list[Row]:
        output = reply.output
        if output.rows and output.rows[0].greedy_ids:
            self._accept_burst(output)
            return list(self.rows)
        await self._accept(
            self.rows, logits_matrix(output), [r.logits_row for r in output.rows], [r.argmax for r in output.rows]
        )
        return [row for row in self.rows if isinstance(row, Sequence)]

    async def _accept(self, rows: list[Row], logits, index: list[int], argmax: list[int]) -> None:
        """Pick every row's next token (samplers, or the beam search) and apply the finish rules."""
        positions = [i for i, row in enumerate(rows) if isinstance(row, Sequence) and not row.in_flight]
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
            _next_masks([rows[i] for i in positions])
            self._fast_forward([rows[i] for i in positions], now)
        for group, where in _groups(rows).items():
            group.pending = group.search.step(logits[[index[p] for p in where]])
            if group.search.done:
                await self._finish_beams(group)

    def _accept_burst(self, output: lm_pb2.BatchOutput) -> None:
        """Take each row's tokens of a greedy burst, in order, until the row finishes (the lm ran them all:
        tokens after a row's end are dropped, and the row leaves the batch next step)."""
        now = time.monotonic()
        for row, out in zip(self.rows, output.rows, strict=True):
            for token in out.greedy_ids:
                if row.finished:
                    break
                row.pending_token = None  # the lm fed every token of the burst but the last
                row.sampling.context.append(token)
                self._take_token(row, token, now)

    def _take(self, row: Sequence, result, k: int, now: float) -> None:
        if row.finished:  # a stop string matched while this step ran; the row leaves next step
            return
        if result.errors[k] is not None:
            row.finish(gateway_pb2.ERROR)
            row.error = result.errors[k]
            return
        self._take_token(row, int(result.token_ids[k]), now, result, k)

    def _fast_forward(self, rows: list[Sequence], now: float) -> None:
        """Take every token a row's grammar forces (the only one it allows) right away, without sampling; they
        are fed to the lm later, several in one step when the batch allows (_tokens_per_row)."""
        for row in rows:
            while not row.finished and row.sampling.forced_token is not None and len(row.queued) < MAX_QUEUED:
                token = row.sampling.forced_token
                row.sampling.context.append(token)
                self._take_token(row, token, now)
                _next_masks([row])

    def _take_token(self, row: Sequence, token: int, now: float, result=None, k: int = 0) -> None:
        """Append a chosen token to a row: stream it, advance its constraint, and apply the finish rules."""
        request = row.request
        row.generated.append(token)
        if row.first_token_at is None:
            row.first_token_at = now
            metrics.TIME_TO_FIRST_TOKEN.labels(self.model.name).observe(now - request.arrival)
        else:
            metrics.INTER_TOKEN_LATENCY.labels(self.model.name).observe(now - row.last_token_at)
        row.last_token_at = now
        row.unsent_ids.append(token)
        if request.logprobs and result is not None:
            top_ids = result.top_ids[k] if result.top_ids[k] is not None else ()
            top_logprobs = result.top_logprobs[k] if result.top_ids[k] is not None else ()
            top = [
                gateway_pb2.TopLogprob(token_id=int(t), logprob=float(lp))
                for t, lp in zip(top_ids, top_logprobs, strict=True)
            ]
            row.unsent_logprobs.append(
                gateway_pb2.TokenLogprob(token_id=token, logprob=float(result.logprobs[k]), top=top)
            )
        constraint = row.sampling.constraint
        if constraint is not None and not constraint.consume(token):
            row.finish(gateway_pb2.ERROR)
            row.error = constraint.error
            return
        if not request.ignore_eos and token in self.model.eos_token_ids:
            row.finish(gateway_pb2.STOP, f"eos:{token}")
        elif token in request.stop_token_ids:
            row.finish(gateway_pb2.STOP, f"token:{token}")
        else:
            if token < self.model.tokenizer_vocab_size:
                row.detok.append(token)
            if row.pending_token is None:
                row.pending_token = token
            else:
                row.queued.append(token)
            if constraint is not None and constraint.complete:
                row.finish(gateway_pb2.STOP, "constraint")
        if not row.finished and (
            len(row.generated) >= request.max_tokens
            or len(request.prompt_ids) + len(row.generated) >= self.model.context_length
        ):
            row.finish(gateway_pb2.LENGTH)

    async def _finish_beams(self, group: BeamGroup) -> None:
        """A finished search: decode its best hypotheses and stream them as the n completions."""
        hypotheses = group.search.results()[: group.request.n]
        texts = await self.detokenizer.decode([list(h.token_ids) for h in hypotheses])
        now = time.monotonic()
        for sequence, hypothesis, text in zip(group.sequences, hypotheses, texts, strict=False):
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

    # -- failures -----------------------------------------------------------------------------

    def _loop_ended(self, task: asyncio.Task) -> None:
        """The loop only ends by a bug (or with the gateway): nobody may be left waiting on it."""
        if task.cancelled():
            return
        exc = task.exception()
        log.error("the scheduler of %s stopped", self.name, exc_info=exc)
        error = MuestraError(f"internal error in the gateway's scheduler for {self.name}")
        for request in [*self._in_flight(), *self.waiting]:
            request.fail(error)
        self.rows, self.batch_id, self.joining = [], "", []
        self.waiting.clear()
        self.batch_stream.close()

    def _in_flight(self) -> list[GenerationRequest]:
        return _requests([*self.rows, *(row for _, rows in self.joining for row in rows)])

    def _lm_failed(self, exc: LmFailed) -> None:
        """The replica's batches are gone: move what has streamed nothing, fail the rest, leave the rotation."""
        requests = self._in_flight()
        log.warning("%s; %d request(s) in flight there", exc, len(requests))
        self.rows, self.batch_id, self.joining = [], "", []
        self.batch_stream.close()
        for request in requests:
            self._move_or_fail(request, exc)
        if self.router is not None:
            self.router.mark_unhealthy(self)

    def _move_or_fail(self, request: GenerationRequest, exc: LmFailed) -> None:
        if request.cancelled:
            request.out.put_nowait(None)
            return
        if not request.started and request.attempts <= MAX_REROUTES and self.router is not None:
            log.info("request %s streamed nothing yet: moving it off %s", request.request_id, self.replica.address)
            self.router.reroute(request, self)
            return
        request.fail(Unavailable(f"{exc}; retry with seed {request.seed} for the same text"))

    def shut_down(self) -> None:
        """The gateway's grace period is ending: fail what is in flight or waiting, each with its seed."""
        admitting = [self.admitting] if self.admitting is not None else []
        for request in [*admitting, *self._in_flight(), *self.waiting]:
            request.fail(Unavailable(f"the gateway is shutting down; retry with seed {request.seed} for the same text"))
        self.waiting.clear()
        self.wake.set()

    async def _end_all(self, exc: MuestraError) -> None:
        """End every request in flight or waiting with `exc`, and free their batches on the lm."""
        requests = self._in_flight()
        log.warning("%s; ending %d request(s) in flight and %d waiting", exc, len(requests), len(self.waiting))
        for request in requests:
            request.fail(exc)
        while self.waiting:
            self.waiting.popleft().fail(exc)
        batch_ids = [b for b in (self.batch_id, *(b for b, _ in self.joining)) if b]
        self.rows, self.batch_id, self.joining = [], "", []
        if batch_ids:
            try:
                await self._lm_step("Clear", clear=lm_pb2.ClearRequest(batch_ids=batch_ids))
            except LmFailed as failed:
                log.warning("freeing the batches of failed requests: %s", failed)


async def _stop(task: asyncio.Task | None) -> None:
    """Cancel a detokenization task and wait for it (its own failure was already seen or is moot)."""
    if task is not None:
        task.cancel()
        await asyncio.wait({task})
        if not task.cancelled():
            task.exception()  # retrieved: what it raised is handled by the caller's failure path
    return None

"""Continuous batching on one lm replica: its queue, admission, the step loop, and failover.

Between two decode steps, finished and cancelled rows leave the batch and beam-search rows are
reordered (batch.py), waiting requests start their prefills, and those whose prefill is done take their
first tokens and join the batch. A prefill runs beside the steps (the lm runs a long prompt in chunks
with the running rows' steps between them), so a long prompt stalls no running stream. One Decode call per step
serves every row (clients/lm.py; how many tokens and steps it runs: step_policy.py); the rows take
their tokens and the finish rules apply (outputs.py); the detokenization of step t overlaps the
lm's work on step t+1 (detokenizer.py).

Every await on the lm or the tokenizer has a deadline. When the lm replica fails (or misses a
deadline) its requests that have not streamed anything move to another replica, once, and the
others end with UNAVAILABLE naming the replica; when the tokenizer fails, the requests waiting on
it end with UNAVAILABLE. Either way the loop goes on serving.

The loop is here; the prefill side (admission, Prefill calls, joining) is prefills.py, the failures failover.py.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from collections.abc import Callable

from muestra.gateway import metrics
from muestra.gateway.engine.clients.backends import LmReplica, TextModel
from muestra.gateway.engine.clients.lm import LmClient, LmFailed, logits_matrix
from muestra.gateway.engine.clients.progress import Progress
from muestra.gateway.engine.generation.batch import (
    Row,
    RunningBatch,
    filter_plan,
)
from muestra.gateway.engine.generation.detokenizer import Detokenizer, TokenizerFailed
from muestra.gateway.engine.generation.failover import Failover, deadline_error
from muestra.gateway.engine.generation.kv_admission import KvAdmission
from muestra.gateway.engine.generation.outputs import OutputProcessor
from muestra.gateway.engine.generation.prefills import Prefilling, PrefillTurns
from muestra.gateway.engine.generation.request import GenerationRequest, Sequence
from muestra.gateway.engine.generation.speculation import SpeculationPolicy
from muestra.gateway.engine.generation.step_policy import (
    StepPolicy,
    picked_in_lm,
    row_invariant,
    stop_ids,
    tokens_per_row,
)
from muestra.gateway.engine.sampling import ModelInfo
from muestra.runtime.errors import (
    MuestraError,
    ResourceExhausted,
)
from muestra.runtime.logs import request_id_var
from muestra.v1 import gateway_pb2, lm_pb2

log = logging.getLogger("muestra.gateway.scheduler")


class ReplicaScheduler(PrefillTurns, Failover):
    def __init__(
        self,
        model: TextModel,
        replica: LmReplica,
        config,
        reroute: Callable[[GenerationRequest, ReplicaScheduler], None] | None = None,
        out_of_rotation: Callable[[ReplicaScheduler], None] | None = None,
        finished: Callable[[ReplicaScheduler, GenerationRequest, list[int]], None] | None = None,
    ) -> None:
        self.model = model
        self.replica = replica
        self.name = f"lm {replica.address}"
        self.max_rows = config.max_batch_rows
        self.max_queue = config.max_queue
        self.mask_in_lm = config.constraint_mask == "lm"
        self.model_info = ModelInfo(model.vocab_size, model.eos_token_ids, model.context_length)
        self.waiting: collections.deque[GenerationRequest] = collections.deque()
        self.batch = RunningBatch()
        # Requests being prefilled (out of `waiting`, not yet joining), in order of admission.
        self.prefilling: list[Prefilling] = []
        # Clear calls for the batches of prefills that nobody waits for any more (references kept while they run).
        self.background: set[asyncio.Task] = set()
        self.wake = asyncio.Event()
        self.task: asyncio.Task | None = None
        self.steps = 0
        self.kv = KvAdmission(model.name, replica, config.greedy_burst)  # admission by the lm's KV budget
        self.policy = StepPolicy(config.greedy_burst, config.greedy_burst_ms, model.context_length)
        self.speculation = SpeculationPolicy(model.name, model.vocab_size)
        # The last Decode's lm steps and drafting rows, for the speculation policy's timing of the whole step.
        self.last_step = (1, 1, 0)
        # Whether the Decode in flight runs a burst (its rows' tokens come in RowOutput.greedy_ids).
        self.bursting = False
        # The rows (by id) whose tokens the lm picked in the last Decode (step_policy.picked_in_lm).
        self.in_lm: set[int] = set()
        self.progress = Progress()
        self.lm = LmClient(replica, self.progress, config.lm_timeout_s)
        self.outputs = OutputProcessor(model)
        self.detokenizer = Detokenizer(model, self.progress, config.tokenizer_timeout_s)
        # Set by the Router: whether requests may be sent here; where a request goes that could not start
        # here, and what takes this replica out of the rotation when it fails.
        self.healthy = True
        # Health checks in a row that timed out (routing.py: a busy replica stays in the rotation).
        self.slow_checks = 0
        self.reroute = reroute
        self.out_of_rotation = out_of_rotation
        # Told the ids whose KV a finished request's row leaves on the lm (where its conversation stands).
        self.finished = finished
        # Read when /metrics is scraped, so they never go stale between steps.
        labels = (model.name, replica.address)
        metrics.RUNNING.labels(*labels).set_function(self.running_requests)
        metrics.WAITING.labels(*labels).set_function(lambda: len(self.waiting))
        metrics.ROWS_RUNNING.labels(*labels).set_function(self.rows_running)
        metrics.KV_RESERVED.labels(*labels).set_function(
            lambda: self.kv.reserved_bytes(self.batch.all_rows(), [p.request for p in self.prefilling])
        )

    @property
    def step_s(self) -> float | None:
        """The running estimate of one decode step's time here (None until a step was timed)."""
        return self.policy.step_s

    # -- called by the Generate handlers and the router -----------------------------------------

    def load(self) -> int:
        return len(self.batch) + sum(p.request.rows for p in self.prefilling) + sum(r.rows for r in self.waiting)

    def rows_running(self) -> int:
        """Rows in the running batch and joining it."""
        return len(self.batch)

    def running_requests(self) -> int:
        """Requests with rows here (running or joining) or being prefilled."""
        running = {id(request) for request in self.batch.requests()}
        running.update(id(p.request) for p in self.prefilling)
        return len(running)

    def has_work(self) -> bool:
        return bool(self.batch.rows or self.batch.joining or self.waiting or self.prefilling)

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
        # Its prefill starts now, not when the step in flight (a greedy burst, say) comes back: the lm ends a burst
        # at its next step for a prefill that waits.
        self._admit()

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
                if not self.batch.rows and not self.waiting and not self.prefilling:
                    if detokenizing is not None:
                        task, detokenizing = detokenizing, None
                        await task
                        continue
                    self.progress.moved()
                    self.wake.clear()
                    await self.wake.wait()
                self._expire()
                self.batch.batch_id, self.batch.rows = await self._reshaped(self.batch.batch_id, self.batch.rows)
                self.wake.clear()  # what arrives from now on wakes _prefill_or_wake
                self._admit()
                await self._join_prefilled()
                if not self.batch.rows and not self.batch.joining:
                    if self.prefilling:
                        await self._prefill_or_wake()
                    continue
                # The lm works on step t+1 while the tokenizer turns step t into text.
                step_started = time.monotonic()
                reply = await self._decode()
                if detokenizing is not None:
                    task, detokenizing = detokenizing, None
                    await task
                stepped = await self._accept_step(reply)
                elapsed = time.monotonic() - step_started
                metrics.STEP_TIME.labels(self.model.name, self.replica.address).observe(elapsed)
                self.speculation.timed(elapsed, *self.last_step)
                detokenizing = asyncio.get_running_loop().create_task(self.detokenizer.step(stepped))
            except LmFailed as exc:
                detokenizing = await _stop(detokenizing)
                await self._lm_failed(exc)
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
        for row in self.batch.rows:
            deadline = row.request.deadline
            if deadline is not None and now > deadline and isinstance(row, Sequence) and not row.finished:
                row.finish(gateway_pb2.CANCELLED, "deadline exceeded")
        for request in list(self.waiting):
            if request.cancelled:
                self.waiting.remove(request)
                request.out.put_nowait(None)
            elif request.deadline is not None and now > request.deadline:
                self.waiting.remove(request)
                request.fail(deadline_error(request, "while it waited for a place in the batch"))
        for prefilling in self.prefilling:
            # A long prompt's prefill stops at its next chunk once nobody waits for it.
            request = prefilling.request
            if request.cancelled or (request.deadline is not None and now > request.deadline):
                prefilling.task.cancel()

    async def _reshaped(self, batch_id: str, rows: list[Row]) -> tuple[str, list[Row]]:
        """`rows` without finished rows and with beams reordered, with one Filter call when anything changed."""
        keep, kept, cancelled = filter_plan(rows)
        for sequence in cancelled:
            sequence.emit_done()
        if self.finished is not None:
            for row in _leaving(rows, keep):
                # The lm holds the prompt and every generated token but the last (never fed).
                self.finished(self, row.request, [*row.request.prompt_ids, *row.generated[:-1]])
        if keep == list(range(len(rows))):
            return batch_id, kept
        if not keep:
            try:
                await self.lm.clear([batch_id])
            except LmFailed as exc:
                # Every row is done, so nothing is lost: an lm that is gone or stopping frees the batch with it.
                log.warning("freeing a finished batch failed (%s)", exc)
            return "", []
        return await self.lm.filter(batch_id, keep), kept

    async def _decode(self) -> lm_pb2.DecodeResponse:
        # Rows with constraints send their kinds (which change on forced tokens) and, when the lm applies
        # them, their masks with every step; so does every row of their batches.
        every = self.batch.all_rows()
        masked = any(isinstance(r, Sequence) and r.sampling.constraint is not None for r in every)
        tokens = tokens_per_row(every)
        # A request that could join now (one that arrived during admission, or one being prefilled) should not
        # wait for a burst.
        pending = [p.request for p in self.prefilling]
        joinable = bool(self.waiting) and len(every) + self.waiting[0].rows <= self.max_rows
        joinable = bool(pending) or (joinable and self.kv.fits(self.waiting[0], every, pending))
        drafted = 0
        if tokens == 1:  # several tokens per row are a lone row's forced ones, never drafted
            drafted = await self.speculation.draft(every, self.replica.max_draft_tokens, self.model.context_length)
        # Rows with drafts take several tokens in one step already: no greedy burst then.
        runnable = self.replica.samplers
        steps = 1 if drafted else self.policy.burst(every, self.replica.max_greedy_steps, joinable, runnable)
        if steps > 1 and self.speculation.quiet is not None:
            steps = min(steps, self.speculation.quiet)  # the burst ends where a draft could begin
        # The lm picks the tokens of the sampled rows whose chains it runs, in a burst or in a step of its own
        # (those rows then ship no logits); not in a step with drafts or masks, or one that feeds queued tokens.
        in_lm = picked_in_lm(every, runnable) if not drafted and not masked and tokens == 1 else set()
        self.in_lm = in_lm
        request = lm_pb2.DecodeRequest(
            batches=self.batch.decode_batches(masked, tokens, in_lm),
            tokens_per_row=tokens if tokens > 1 else 0,
            row_invariant=row_invariant(every),
        )
        if steps > 1:
            request.greedy_steps = steps
            request.stop_token_ids.extend(stop_ids(every, self.model.eos_token_ids))
        reply = await self.lm.decode(request)
        self.batch.batch_id = reply.batch_id
        self.steps += 1
        self.bursting = steps > 1
        ran = max((len(out.greedy_ids) for out in reply.output.rows), default=1) if steps > 1 else 1
        metrics.DECODE_BURST.labels(self.model.name, self.replica.address).observe(ran)
        if not drafted:
            self.policy.timed(reply.timing.total_us, ran)
        self.last_step = (ran, len(self.batch.rows), drafted)
        return reply

    async def _accept_step(self, reply: lm_pb2.DecodeResponse) -> list[Row]:
        output = reply.output
        if self.bursting:
            self.outputs.accept_burst(self.batch.rows, output.rows)
            return list(self.batch.rows)
        picked = [i for i, row in enumerate(self.batch.rows) if id(row) in self.in_lm]
        if picked:  # the lm picked these rows' tokens: take them as a one-step burst's
            self.outputs.accept_burst([self.batch.rows[i] for i in picked], [output.rows[i] for i in picked])
        logits = logits_matrix(output)
        await self._accept(
            self.batch.rows, logits, [r.logits_row for r in output.rows], [r.argmax for r in output.rows], picked
        )
        for kept in self.outputs.accept_verified(self.batch.rows, output.rows, logits):
            self.speculation.verified(kept)
        return [row for row in self.batch.rows if isinstance(row, Sequence)]

    async def _accept(self, rows: list[Row], logits, index: list[int], argmax: list[int], taken=()) -> None:
        for group in self.outputs.accept(rows, logits, index, argmax, taken):
            hypotheses = group.search.results()[: group.request.n]
            texts = await self.detokenizer.decode([list(h.token_ids) for h in hypotheses])
            self.outputs.finish_beams(group, hypotheses, texts)


def _leaving(rows: list[Row], keep: list[int]) -> list[Sequence]:
    """The first completion of each request whose row leaves the batch now (its KV then stays in the lm's hot
    tier), once it generated something."""
    kept = set(keep)
    return [
        row
        for i, row in enumerate(rows)
        if i not in kept and isinstance(row, Sequence) and row.index == 0 and row.generated
    ]


async def _stop(task: asyncio.Task | None) -> None:
    """Cancel a detokenization task and wait for it (its own failure was already seen or is moot)."""
    if task is not None:
        task.cancel()
        await asyncio.wait({task})
        if not task.cancelled():
            task.exception()  # retrieved: what it raised is handled by the caller's failure path
    return None

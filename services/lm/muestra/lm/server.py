"""The gRPC surface of the lm service: muestra.v1.LanguageModel over the engine."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from concurrent.futures import ThreadPoolExecutor

import grpc
import numpy as np

from muestra.lm import metrics
from muestra.lm.batch import RowCache
from muestra.lm.config import LmConfig
from muestra.lm.engine import Engine
from muestra.lm.engine_io import DecodeInput, Load, PrefillInput, StepResult
from muestra.lm.model import OnnxDecoder
from muestra.lm.outputs import batch_output
from muestra.lm.prefix_cache import MIN_SUFFIX, PrefixCache, PrefixPlan
from muestra.lm.sampling import LmSamplers, SampledRow
from muestra.plugin import ModelInfo
from muestra.runtime import ServiceSpec
from muestra.runtime.errors import InvalidArgument, check_limit
from muestra.runtime.logs import joined_request_ids, request_id_scope, valid_request_id
from muestra.runtime.step_streams import LEASE_HEADER, until_drained
from muestra.v1 import common_pb2, lm_pb2, lm_pb2_grpc

log = logging.getLogger("muestra.lm")

# How often the service looks for batches idle beyond batch_idle_s.
SWEEP_S = 5.0
# Most stop_token_ids a Decode may list.
MAX_STOP_IDS = 1024
_DTYPES = {"float32": common_pb2.FLOAT32, "float16": common_pb2.FLOAT16}


def lease_of(context) -> str:
    """The caller's lease (metadata x-muestra-lease), or '' for calls made without one."""
    for key, value in (context.invocation_metadata() or ()) if context is not None else ():
        if key == LEASE_HEADER:
            if not valid_request_id(value):
                raise InvalidArgument(LEASE_HEADER, "must be 1-64 characters of [A-Za-z0-9._:/+=-]")
            return value
    return ""


def _ids(values) -> np.ndarray:
    return np.fromiter(values, dtype=np.int64, count=len(values))


def _drafts(i: int, batch: lm_pb2.DecodeBatch) -> list[np.ndarray] | None:
    """A DecodeBatch's draft ids split per row by its draft_lengths, or None when it has none."""
    if not batch.draft_lengths and not batch.draft_ids:
        return None
    total = sum(batch.draft_lengths)
    if total != len(batch.draft_ids):
        raise InvalidArgument(
            f"batches[{i}].draft_ids", f"got {len(batch.draft_ids)} ids; draft_lengths add up to {total}"
        )
    ids = _ids(batch.draft_ids)
    ends = np.cumsum(np.fromiter(batch.draft_lengths, dtype=np.int64, count=len(batch.draft_lengths)))
    return np.split(ids, ends[:-1]) if len(ends) else []


def _count_drafts(result: StepResult) -> None:
    """Draft tokens a verification step scored, and how many of the ARGMAX rows' drafts it accepted."""
    metrics.DRAFT_TOKENS.inc(sum(result.drafted or ()))
    metrics.ACCEPTED_DRAFT_TOKENS.inc(sum(a for a in result.accepted if a is not None))


def _sampled_states(result: StepResult, output: lm_pb2.BatchOutput) -> None:
    """Each sampled row's generator and sampler state after its picks, or why its chain failed."""
    errors = result.sampler_errors or [None] * len(output.rows)
    for row, error, out in zip(result.sampled, errors, output.rows, strict=True):
        if row is None:
            continue
        if error:
            out.sampler_error = error
            del out.greedy_ids[-1]  # the step where it failed picked nothing for it
            continue
        try:
            out.rng_json, out.state_json = row.state()
        except (TypeError, ValueError) as exc:  # a plugin kept state that JSON cannot carry
            out.sampler_error = f"sampler chain failed: its state cannot go back to the gateway as JSON ({exc})"


def _load(load: Load) -> lm_pb2.ServiceLoad:
    return lm_pb2.ServiceLoad(
        batches=load.batches, rows=load.rows, kv_bytes=load.kv_bytes, kv_budget_bytes=load.kv_budget_bytes
    )


class LanguageModelServicer(lm_pb2_grpc.LanguageModelServicer):
    def __init__(
        self,
        engine: Engine,
        prefix_cache: PrefixCache | None = None,
        batch_idle_s: float = 0.0,
        prefill_chunk_tokens: int = 0,
    ) -> None:
        self.engine = engine
        # A one-row prompt longer than this is prefilled in chunks of it (0: in one forward).
        self.prefill_chunk_tokens = prefill_chunk_tokens
        # Held by the prefill whose forward (or chunk) is queued or running on the model thread: decode steps
        # never queue behind more than one.
        self._chunk_turn = asyncio.Lock()
        # The prefill jobs that asked for a turn and have not begun on the model thread: while one waits, a greedy
        # burst there ends at its next step. A job leaves the set when it begins, or when its turn ends without
        # it having begun (never submitted, or cancelled in the queue).
        self._prefills_waiting: set[_PrefillTurn] = set()
        engine.prefill_waiting = lambda: bool(self._prefills_waiting)
        self.batch_idle_s = batch_idle_s
        # Open BatchSteps streams per lease: a lease's batches go when its last stream breaks.
        self._streams: dict[str, int] = {}
        self.prefix_cache = prefix_cache
        if prefix_cache is not None:
            engine.on_row_left = prefix_cache.write_left
        # One thread: forwards are serialized and the batch table has a single writer.
        self.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="lm-model")
        # Calls submitted to that thread and not yet finished (only the event loop changes this).
        self._model_calls = 0
        # Set once the server stops: the model thread takes no more work (a stream that ends now frees nothing).
        self.closing = False
        metrics.KV_BYTES.set_function(lambda: self.engine.load().kv_bytes)
        metrics.KV_USAGE.set_function(lambda: self.engine.load().kv_bytes / max(1, engine.kv_budget_bytes))
        metrics.ROWS.set_function(lambda: self.engine.load().rows)
        metrics.BATCHES.set_function(lambda: self.engine.load().batches)
        metrics.KV_BUDGET.set(engine.kv_budget_bytes)

    async def _on_model_thread(self, fn, *args):
        self._model_calls += 1
        try:
            return await asyncio.get_running_loop().run_in_executor(self.executor, fn, *args)
        finally:
            self._model_calls -= 1

    async def _decode_step(self, fn, *args):
        """A decode step runs right on the event loop when the model thread is idle.

        Handing a step to the model thread and its result back costs 0.5-0.8 ms on a busy 2-core
        machine, several percent of a small model's step. Nothing else can touch the engine meanwhile:
        the model thread has no work, and only this loop gives it any. Health checks and other calls
        wait for the step (tens of ms); prefills, which can take seconds, always go to the model thread.
        """
        if self._model_calls == 0:
            return fn(*args)
        return await self._on_model_thread(fn, *args)

    def _step_output(self, step, *args) -> tuple[StepResult, lm_pb2.BatchOutput]:
        result = step(*args)
        output = batch_output(
            result.logits, result.specs, result.allowed, result.greedy_ids, result.draft_logits, result.accepted
        )
        if result.accepted is not None:
            _count_drafts(result)
        if result.sampled is not None:
            _sampled_states(result, output)
        return result, output

    async def Describe(self, request, context) -> lm_pb2.DescribeModelResponse:
        info = self.engine.info
        return lm_pb2.DescribeModelResponse(
            model=info.name,
            fingerprint=info.fingerprint,
            context_length=info.context_length,
            vocab_size=info.vocab_size,
            eos_token_ids=info.eos_token_ids,
            providers=info.providers,
            kv=lm_pb2.KvLayout(
                num_layers=info.num_layers,
                num_kv_heads=info.num_kv_heads,
                head_dim=info.head_dim,
                dtype=_DTYPES[info.kv_dtype.name],
                storage=info.storage,
            ),
            load=_load(self.engine.load()),
            max_batch_rows=self.engine.limits.max_batch_rows,
            generation_config_json=info.generation_config_json,
            max_greedy_steps=self.engine.limits.max_greedy_steps,
            max_draft_tokens=self.engine.limits.max_draft_tokens,
            samplers=self.engine.samplers.sources() if self.engine.samplers is not None else [],
            row_invariant=self.engine.decoder.row_invariant,
        )

    async def Prefill(self, request, context) -> lm_pb2.PrefillResponse:
        started = time.perf_counter()
        limits = self.engine.limits
        check_limit("rows", len(request.rows), 1, limits.max_batch_rows)
        rows = [
            PrefillInput(
                request_id=row.request_id,
                input_ids=_ids(row.input_ids),
                output=limits.check_output(f"rows[{i}].output", row.output.kind, row.output.top_n),
                allowed=limits.check_allowed(f"rows[{i}].output.allowed_tokens", row.output.allowed_tokens),
                suppressed=limits.check_suppressed(f"rows[{i}].suppressed_token_ids", row.suppressed_token_ids),
            )
            for i, row in enumerate(request.rows)
        ]
        lease = lease_of(context)
        plans = await self._load_prefixes(request.rows, rows)
        chunk = self.prefill_chunk_tokens
        if len(rows) == 1 and 0 < chunk < rows[0].input_ids.size:
            result, output, kv, lengths = await self._chunked_prefill(rows[0], lease)
        else:
            # One prefill's forward at a time waits for the model thread (decode steps go first), as chunks do.
            async with self._prefill_turn() as turn:
                # A caller that leaves mid-prefill (its deadline, a cancel) never learns the new batch's id: the
                # batch is freed as soon as the model thread has made it, instead of idling until batch_idle_s.
                job = turn.submit(self._prefill, rows, lease)
                try:
                    result, output, kv, lengths = await asyncio.shield(job)
                except asyncio.CancelledError:
                    job.add_done_callback(lambda done: self._free_abandoned(done, lease))
                    raise
        # A caller that left as the prefill ended (its deadline passed, it cancelled) gets no reply, and would
        # never free the batch: the call's end says so, and the batch goes then.
        context.add_done_callback(lambda done: self._free_unanswered(done, result.batch_id, lease))
        metrics.PREFILL_SECONDS.observe(result.forward_us / 1e6)
        metrics.PREFILL_TOKENS.observe(sum(row.input_ids.size for row in rows))
        writes = []
        for i, (row, plan) in enumerate(zip(output.rows, plans, strict=True)):
            if plan is not None:
                if rows[i].adopted > plan.cached_tokens:  # found at its turn, in the hot tier or a live row
                    plan.cached_tokens, plan.tier = rows[i].adopted, "hot"
                row.cached_tokens = plan.cached_tokens
                row.cache_tier = plan.tier
                self.prefix_cache.record(plan, plan.cached_tokens + rows[i].input_ids.size)
                if plan.writes:
                    writes.append((plan, kv, i, int(lengths[i])))
        if writes:
            # The blocks are written once the response is out: the first token never waits for Redis.
            context.add_done_callback(lambda _: self.prefix_cache.write_later(writes))
        return lm_pb2.PrefillResponse(batch_id=result.batch_id, output=output, timing=self._timing(result, started))

    async def _chunked_prefill(self, row: PrefillInput, lease: str):
        """A long prompt in chunks of prefill_chunk_tokens, each its own turn on the model thread: a decode step
        that arrives meanwhile runs after the chunk in progress, so running rows never wait for more than one.
        Chunks of concurrent prefills take turns (one at a time is queued), in their order of arrival."""
        job = None
        step: asyncio.Future | None = None
        try:
            async with self._prefill_turn() as turn:
                begun = turn.submit(self.engine.begin_prefill, row, lease, self.prefill_chunk_tokens)
                try:
                    job = await asyncio.shield(begun)
                except asyncio.CancelledError:
                    # Its reservation is made on the model thread: it is freed there once made.
                    begun.add_done_callback(self._abandon_begun)
                    raise
            while True:
                async with self._prefill_turn() as turn:
                    step = turn.submit(self._prefill_chunk, job)
                    done = await asyncio.shield(step)
                    step = None
                if done is not None:
                    return done
        except asyncio.CancelledError:
            # The caller left (its deadline, a cancel): free the reservation or the batch once no chunk runs.
            if job is not None:
                metrics.ABANDONED.labels("prefill cancelled").inc()
                if step is None:
                    asyncio.get_running_loop().create_task(self._abandon(job))
                else:
                    step.add_done_callback(lambda _: asyncio.get_running_loop().create_task(self._abandon(job)))
            raise
        except Exception:
            if job is not None:  # a chunk failed: its reservation (or its batch) goes with the call
                await self._abandon(job)
            raise

    @contextlib.asynccontextmanager
    async def _prefill_turn(self):
        """A prefill job's turn on the model thread: after the prefill job queued before it (decode steps are
        not held), and ending the greedy burst that runs there at its next step."""
        turn = _PrefillTurn(self)
        self._prefills_waiting.add(turn)
        try:
            async with self._chunk_turn:
                yield turn
        finally:
            self._prefills_waiting.discard(turn)

    def _prefill_chunk(self, job):
        """One chunk on the model thread; after the last, what _prefill returns."""
        result = self.engine.prefill_chunk(job)
        metrics.PREFILL_CHUNKS.inc()
        if result is None:
            return None
        output = batch_output(result.logits, result.specs, result.allowed)
        batch = self.engine.batches[result.batch_id]
        return result, output, batch.kv, batch.lengths.copy()

    def _abandon_begun(self, begun: asyncio.Future) -> None:
        if not begun.cancelled() and begun.exception() is None:
            metrics.ABANDONED.labels("prefill cancelled").inc()
            asyncio.get_running_loop().create_task(self._abandon(begun.result()))

    async def _abandon(self, job) -> None:
        if not self.closing:
            await self._on_model_thread(self.engine.abandon_prefill, job)

    async def _load_prefixes(self, pb_rows, rows: list[PrefillInput]) -> list[PrefixPlan | None]:
        """Each row's cached prefix: from the hot tier when it holds at least what the shared tier would give
        (no read), else the shared tier's blocks (read off the model thread); the row's prompt is cut to the
        rest, and it is told what the cache does with it once it leaves."""
        cache = self.prefix_cache
        if cache is None:
            return [None] * len(rows)
        loop = asyncio.get_running_loop()
        pending = []
        for i, (pb_row, row) in enumerate(zip(pb_rows, rows, strict=True)):
            if not pb_row.HasField("prefix"):
                pending.append(None)
                continue
            self.engine.limits.check_ids(f"rows[{i}].input_ids", row.input_ids)
            prefix = pb_row.prefix
            checked = cache.check(
                f"rows[{i}].prefix", row.input_ids, prefix.block_size, prefix.block_hashes,
                prefix.cached_blocks, prefix.write, prefix.write_on_leave,
            )  # fmt: skip
            hot = self.engine.hot
            limit = row.input_ids.size - MIN_SUFFIX
            resident, length = hot.longest(row.input_ids, limit) if hot is not None and limit > 0 else (None, 0)
            shared = min(checked.cached_blocks, checked.usable_blocks) * checked.block_size
            if resident is not None and length >= max(shared, checked.block_size):
                pending.append(cache.from_hot(checked, resident, length))
            else:
                pending.append(loop.run_in_executor(cache.read_pool, cache.load, checked))
        plans = [p if isinstance(p, PrefixPlan) or p is None else await p for p in pending]
        for row, plan in zip(rows, plans, strict=True):
            if plan is None:
                continue
            request = plan.request
            row.cache = RowCache(request.block_size, plan.stored_blocks, request.write_on_leave, row.input_ids.size)
            if plan.cached_tokens:
                row.history = row.input_ids
                row.past = plan.past
                row.input_ids = row.input_ids[plan.cached_tokens :]
        return plans

    def _prefill(self, rows: list[PrefillInput], lease: str):
        """Prefill on the model thread; also the new batch's KV storage, for the cache's writes."""
        result, output = self._step_output(self.engine.prefill, rows, lease)
        batch = self.engine.batches[result.batch_id]
        return result, output, batch.kv, batch.lengths.copy()

    def _free_unanswered(self, context, batch_id: str, lease: str) -> None:
        if context.cancelled():
            self._free_later(batch_id, lease, "prefill unanswered")

    def _free_abandoned(self, prefill: asyncio.Future, lease: str) -> None:
        if not prefill.cancelled() and prefill.exception() is None:
            self._free_later(prefill.result()[0].batch_id, lease, "prefill cancelled")

    def _free_later(self, batch_id: str, lease: str, why: str) -> None:
        """Free a batch whose caller will never Clear it (a service that is closing frees everything anyway)."""
        if not self.closing:
            metrics.ABANDONED.labels(why).inc()
            asyncio.get_running_loop().create_task(self._on_model_thread(self.engine.clear, [batch_id], lease))

    async def Decode(self, request, context) -> lm_pb2.DecodeResponse:
        started = time.perf_counter()
        check_limit("batches", len(request.batches), 1, self.engine.limits.max_batch_rows)
        items = []
        for i, batch in enumerate(request.batches):
            specs = [
                self.engine.limits.check_output(f"batches[{i}].outputs[{j}]", spec.kind, spec.top_n)
                for j, spec in enumerate(batch.outputs)
            ]
            allowed = [
                self.engine.limits.check_allowed(f"batches[{i}].outputs[{j}].allowed_tokens", spec.allowed_tokens)
                for j, spec in enumerate(batch.outputs)
            ]
            items.append(
                DecodeInput(
                    batch.batch_id,
                    _ids(batch.next_ids),
                    specs or None,
                    allowed or None,
                    _drafts(i, batch),
                    _ids(batch.rollback) if batch.rollback else None,
                    self._samplers(i, batch),
                )
            )
        tokens = request.tokens_per_row or 1
        steps = request.greedy_steps or 1
        check_limit("stop_token_ids", len(request.stop_token_ids), 0, MAX_STOP_IDS)
        # Several steps hold the thread they run on for as many forwards: never the event loop's.
        run = self._decode_step if steps == 1 else self._on_model_thread
        result, output = await run(
            self._step_output,
            self.engine.decode,
            items,
            lease_of(context),
            tokens,
            steps,
            list(request.stop_token_ids),
            request.row_invariant,
        )
        steps_run = result.steps_run
        metrics.DECODE_STEP_SECONDS.observe(result.forward_us / 1e6 / steps_run)
        metrics.BATCH_ROWS.observe(len(output.rows))
        return lm_pb2.DecodeResponse(batch_id=result.batch_id, output=output, timing=self._timing(result, started))

    def _samplers(self, i: int, batch: lm_pb2.DecodeBatch) -> list[SampledRow | None] | None:
        """The batch's sampled rows (DecodeBatch.samplers), parsed and checked here, on the event loop."""
        if not batch.samplers:
            return None
        if self.engine.samplers is None:
            raise InvalidArgument(f"batches[{i}].samplers", "this lm runs no samplers (it was started with none)")
        return [
            self.engine.samplers.row(f"batches[{i}].samplers[{j}]", row) if row.chain_json else None
            for j, row in enumerate(batch.samplers)
        ]

    async def BatchSteps(self, request_iterator, context):
        lease = lease_of(context)
        self._streams[lease] = self._streams.get(lease, 0) + 1
        try:
            async for request in until_drained(request_iterator):
                # One stream serves many requests: each step's log lines name the requests of its rows.
                with request_id_scope(joined_request_ids(self.engine.table.request_ids(_batch_ids(request), lease))):
                    reply = await self._batch_step(request, context)
                yield reply
        finally:
            self._streams[lease] -= 1
            if not self._streams[lease]:
                del self._streams[lease]
                # However the last stream ended (a caller that dies can read as one that closed its side:
                # grpc ends the request stream either way), nobody will step or clear this lease's batches.
                if lease:
                    asyncio.get_running_loop().create_task(self._release(lease))

    async def _batch_step(self, request: lm_pb2.BatchStepRequest, context) -> lm_pb2.BatchStepResponse:
        kind = request.WhichOneof("step")
        started = time.perf_counter()
        if kind == "decode":
            reply = lm_pb2.BatchStepResponse(decode=await self.Decode(request.decode, context))
        elif kind == "filter":
            reply = lm_pb2.BatchStepResponse(filter=await self.Filter(request.filter, context))
        elif kind == "clear":
            reply = lm_pb2.BatchStepResponse(clear=await self.Clear(request.clear, context))
        else:
            raise InvalidArgument("step", "give one of decode, filter or clear")
        log.debug("BatchSteps %s %.1fms", kind, (time.perf_counter() - started) * 1000)
        return reply

    async def _release(self, lease: str) -> None:
        if lease in self._streams or self.closing:  # a new stream under this lease opened meanwhile, or stopping
            return
        batches, rows = await self._on_model_thread(self.engine.release, lease)
        if batches:
            metrics.ABANDONED.labels("stream ended").inc(batches)
            log.warning("freed %d batch(es) (%d rows) of lease %s: its step stream ended", batches, rows, lease)

    async def expire_idle_batches(self) -> None:
        """Every SWEEP_S, free batches unused for batch_idle_s (their caller left without a Clear)."""
        while True:
            await asyncio.sleep(min(SWEEP_S, self.batch_idle_s))
            batches, rows = await self._on_model_thread(self.engine.expire, self.batch_idle_s)
            if batches:
                metrics.ABANDONED.labels("idle").inc(batches)
                log.warning(
                    "freed %d batch(es) (%d rows) unused for %.0f s: their caller left without clearing them",
                    batches, rows, self.batch_idle_s,
                )  # fmt: skip

    async def Filter(self, request, context) -> lm_pb2.FilterResponse:
        batch_id, num_rows = await self._on_model_thread(
            self.engine.filter, request.batch_id, list(request.rows), lease_of(context)
        )
        return lm_pb2.FilterResponse(batch_id=batch_id, num_rows=num_rows)

    async def Clear(self, request, context) -> lm_pb2.ClearResponse:
        load = await self._on_model_thread(self.engine.clear, list(request.batch_ids), lease_of(context))
        return lm_pb2.ClearResponse(load=_load(load))

    @staticmethod
    def _timing(result: StepResult, started: float) -> lm_pb2.Timing:
        return lm_pb2.Timing(forward_us=result.forward_us, total_us=int((time.perf_counter() - started) * 1e6))


def load_engine(config: LmConfig) -> Engine:
    """Open the model folder (raises ModelFolderError when it cannot be served)."""
    decoder = OnnxDecoder(
        config.model,
        providers=config.providers,
        intra_op_threads=config.intra_op_threads,
        intra_op_spinning=config.intra_op_spinning,
        row_invariant=config.row_invariant,
        context_length=config.context_length,
        name=config.model_name,
    )
    info = decoder.info
    log.info(
        "model %s: %d layers, %d kv heads x %d, %s KV (%s), vocab %d, context %d, fingerprint %s",
        info.name, info.num_layers, info.num_kv_heads, info.head_dim, info.kv_dtype.name,
        info.storage, info.vocab_size, info.context_length, info.fingerprint[:16],
    )  # fmt: skip
    engine = Engine(
        decoder, config.max_batch_rows, config.kv_budget_bytes, config.max_top_n, config.max_tokens_per_row,
        config.max_greedy_steps, config.max_draft_tokens,
    )  # fmt: skip
    if config.samplers:
        engine.samplers = LmSamplers.load(ModelInfo(info.vocab_size, tuple(info.eos_token_ids), info.context_length))
    if engine.limits.drafts_refused:
        log.info("drafts off: %s", engine.limits.drafts_refused)
    return engine


def service_spec(
    engine: Engine, prefix_cache: PrefixCache | None = None, batch_idle_s: float = 0.0, prefill_chunk_tokens: int = 0
) -> ServiceSpec:
    servicer = LanguageModelServicer(engine, prefix_cache, batch_idle_s, prefill_chunk_tokens)
    tasks: list[asyncio.Task] = []

    async def register(server: grpc.aio.Server) -> list[str]:
        lm_pb2_grpc.add_LanguageModelServicer_to_server(servicer, server)
        if batch_idle_s > 0:
            tasks.append(asyncio.ensure_future(servicer.expire_idle_batches()))
        return [lm_pb2.DESCRIPTOR.services_by_name["LanguageModel"].full_name]

    async def close() -> None:
        servicer.closing = True
        for task in tasks:
            task.cancel()
        servicer.executor.shutdown(wait=True)
        if prefix_cache is not None:
            prefix_cache.close()

    return ServiceSpec(name="lm", register=register, close=close)


class _PrefillTurn:
    """submit(fn, *args): run fn on the model thread for the turn that _prefill_turn granted (once)."""

    def __init__(self, servicer: LanguageModelServicer) -> None:
        self.servicer = servicer

    def submit(self, fn, *args) -> asyncio.Future:
        def run():
            self.servicer._prefills_waiting.discard(self)  # set operations hold the GIL: safe beside the loop
            return fn(*args)

        return asyncio.ensure_future(self.servicer._on_model_thread(run))


def _batch_ids(request: lm_pb2.BatchStepRequest) -> list[str]:
    kind = request.WhichOneof("step")
    if kind == "decode":
        return [b.batch_id for b in request.decode.batches]
    if kind == "filter":
        return [request.filter.batch_id]
    if kind == "clear":
        return list(request.clear.batch_ids)
    return []

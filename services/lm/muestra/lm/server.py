"""The gRPC surface of the lm service: muestra.v1.LanguageModel over the engine."""

from __future__ import annotations

import asyncio
import logging
import time

import grpc

from muestra.lm import metrics
from muestra.lm.config import LmConfig
from muestra.lm.engine import Engine
from muestra.lm.engine_io import PrefillInput, StepResult
from muestra.lm.model import OnnxDecoder
from muestra.lm.model_thread import ModelThread
from muestra.lm.outputs import batch_output
from muestra.lm.prefix_cache import PrefixCache
from muestra.lm.prefix_plans import load_prefixes, record_prefixes
from muestra.lm.sampling import LmSamplers
from muestra.lm.wire import batch_ids, decode_batches, lease_of, prefill_rows, sampled_states, service_load, step_timing
from muestra.plugin import ModelInfo
from muestra.runtime import ServiceSpec
from muestra.runtime.errors import InvalidArgument, check_limit
from muestra.runtime.logs import joined_request_ids, request_id_scope
from muestra.runtime.step_streams import until_drained
from muestra.v1 import common_pb2, lm_pb2, lm_pb2_grpc

log = logging.getLogger("muestra.lm")

# How often the service looks for batches idle beyond batch_idle_s.
SWEEP_S = 5.0
# Most stop_token_ids a Decode may list.
MAX_STOP_IDS = 1024
_DTYPES = {"float32": common_pb2.FLOAT32, "float16": common_pb2.FLOAT16}


def _count_drafts(result: StepResult) -> None:
    """Draft tokens a verification step scored, and how many of the ARGMAX rows' drafts it accepted."""
    metrics.DRAFT_TOKENS.inc(sum(result.drafted or ()))
    metrics.ACCEPTED_DRAFT_TOKENS.inc(sum(a for a in result.accepted if a is not None))


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
        # Runs every forward: decode steps never queue behind more than one prefill job, and a prefill that waits
        # for it ends the greedy burst running there at its next step.
        self.model_thread = ModelThread()
        engine.prefill_waiting = self.model_thread.prefill_waiting
        self.batch_idle_s = batch_idle_s
        # Open BatchSteps streams per lease: a lease's batches go when its last stream breaks.
        self._streams: dict[str, int] = {}
        self.prefix_cache = prefix_cache
        if prefix_cache is not None:
            engine.on_row_left = prefix_cache.write_left
        # Set once the server stops: the model thread takes no more work (a stream that ends now frees nothing).
        self.closing = False
        metrics.KV_BYTES.set_function(lambda: self.engine.load().kv_bytes)
        metrics.KV_USAGE.set_function(lambda: self.engine.load().kv_bytes / max(1, engine.kv_budget_bytes))
        metrics.ROWS.set_function(lambda: self.engine.load().rows)
        metrics.BATCHES.set_function(lambda: self.engine.load().batches)
        metrics.KV_BUDGET.set(engine.kv_budget_bytes)

    def _step_output(self, step, *args) -> tuple[StepResult, lm_pb2.BatchOutput]:
        result = step(*args)
        output = batch_output(
            result.logits, result.specs, result.allowed, result.greedy_ids, result.draft_logits, result.accepted
        )
        if result.accepted is not None:
            _count_drafts(result)
        if result.sampled is not None:
            sampled_states(result, output)
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
            load=service_load(self.engine.load()),
            max_batch_rows=self.engine.limits.max_batch_rows,
            generation_config_json=info.generation_config_json,
            max_greedy_steps=self.engine.limits.max_greedy_steps,
            max_draft_tokens=self.engine.limits.max_draft_tokens,
            samplers=self.engine.samplers.sources() if self.engine.samplers is not None else [],
            row_invariant=self.engine.decoder.row_invariant,
        )

    async def Prefill(self, request, context) -> lm_pb2.PrefillResponse:
        started = time.perf_counter()
        rows = prefill_rows(request, self.engine.limits)
        lease = lease_of(context)
        plans = [None] * len(rows)
        if self.prefix_cache is not None:
            plans = await load_prefixes(self.prefix_cache, request.rows, rows, self.engine.hot, self.engine.limits)
        chunk = self.prefill_chunk_tokens
        if len(rows) == 1 and 0 < chunk < rows[0].input_ids.size:
            result, output, kv, lengths = await self._chunked_prefill(rows[0], lease)
        else:
            # One prefill's forward at a time waits for the model thread (decode steps go first), as chunks do.
            async with self.model_thread.prefill_turn() as turn:
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
        if self.prefix_cache is not None:
            writes = record_prefixes(self.prefix_cache, plans, rows, output, kv, lengths)
        if writes:
            # The blocks are written once the response is out: the first token never waits for Redis.
            context.add_done_callback(lambda _: self.prefix_cache.write_later(writes))
        return lm_pb2.PrefillResponse(batch_id=result.batch_id, output=output, timing=step_timing(result, started))

    async def _chunked_prefill(self, row: PrefillInput, lease: str):
        """A long prompt in chunks of prefill_chunk_tokens, each its own turn on the model thread: a decode step
        that arrives meanwhile runs after the chunk in progress, so running rows never wait for more than one.
        Chunks of concurrent prefills take turns (one at a time is queued), in their order of arrival."""
        job = None
        step: asyncio.Future | None = None
        try:
            async with self.model_thread.prefill_turn() as turn:
                begun = turn.submit(self.engine.begin_prefill, row, lease, self.prefill_chunk_tokens)
                try:
                    job = await asyncio.shield(begun)
                except asyncio.CancelledError:
                    # Its reservation is made on the model thread: it is freed there once made.
                    begun.add_done_callback(self._abandon_begun)
                    raise
            while True:
                async with self.model_thread.prefill_turn() as turn:
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
            await self.model_thread.run(self.engine.abandon_prefill, job)

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
            asyncio.get_running_loop().create_task(self.model_thread.run(self.engine.clear, [batch_id], lease))

    async def Decode(self, request, context) -> lm_pb2.DecodeResponse:
        started = time.perf_counter()
        items = decode_batches(request, self.engine.limits, self.engine.samplers)
        tokens = request.tokens_per_row or 1
        steps = request.greedy_steps or 1
        check_limit("stop_token_ids", len(request.stop_token_ids), 0, MAX_STOP_IDS)
        # Several steps hold the thread they run on for as many forwards: never the event loop's.
        run = self.model_thread.step if steps == 1 else self.model_thread.run
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
        return lm_pb2.DecodeResponse(batch_id=result.batch_id, output=output, timing=step_timing(result, started))

    async def BatchSteps(self, request_iterator, context):
        lease = lease_of(context)
        self._streams[lease] = self._streams.get(lease, 0) + 1
        try:
            async for request in until_drained(request_iterator):
                # One stream serves many requests: each step's log lines name the requests of its rows.
                with request_id_scope(joined_request_ids(self.engine.table.request_ids(batch_ids(request), lease))):
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
        batches, rows = await self.model_thread.run(self.engine.release, lease)
        if batches:
            metrics.ABANDONED.labels("stream ended").inc(batches)
            log.warning("freed %d batch(es) (%d rows) of lease %s: its step stream ended", batches, rows, lease)

    async def expire_idle_batches(self) -> None:
        """Every SWEEP_S, free batches unused for batch_idle_s (their caller left without a Clear)."""
        while True:
            await asyncio.sleep(min(SWEEP_S, self.batch_idle_s))
            batches, rows = await self.model_thread.run(self.engine.expire, self.batch_idle_s)
            if batches:
                metrics.ABANDONED.labels("idle").inc(batches)
                log.warning(
                    "freed %d batch(es) (%d rows) unused for %.0f s: their caller left without clearing them",
                    batches, rows, self.batch_idle_s,
                )  # fmt: skip

    async def Filter(self, request, context) -> lm_pb2.FilterResponse:
        batch_id, num_rows = await self.model_thread.run(
            self.engine.filter, request.batch_id, list(request.rows), lease_of(context)
        )
        return lm_pb2.FilterResponse(batch_id=batch_id, num_rows=num_rows)

    async def Clear(self, request, context) -> lm_pb2.ClearResponse:
        load = await self.model_thread.run(self.engine.clear, list(request.batch_ids), lease_of(context))
        return lm_pb2.ClearResponse(load=service_load(load))


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
        servicer.model_thread.executor.shutdown(wait=True)
        if prefix_cache is not None:
            prefix_cache.close()

    return ServiceSpec(name="lm", register=register, close=close)

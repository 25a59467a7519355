"""A generation request as the scheduler sees it: its prompt, its n sequences and their output."""

from __future__ import annotations

import asyncio
import dataclasses
import time

import grpc

from muestra.gateway import metrics
from muestra.gateway.engine.generation.stops import StopStringMatcher
from muestra.gateway.engine.sampling import SamplingRow, SearchRequest
from muestra.runtime.detokenize import DetokenizeState
from muestra.runtime.errors import MuestraError
from muestra.v1 import gateway_pb2


@dataclasses.dataclass
class GenerationRequest:
    request_id: str
    prompt_ids: list[int]
    max_tokens: int
    n: int
    seed: int
    chain: object  # the prepared sampler chain (muestra.gateway.engine.sampling)
    stop: list[str] = dataclasses.field(default_factory=list)
    stop_token_ids: frozenset[int] = frozenset()
    ignore_eos: bool = False
    logprobs: bool = False
    top_logprobs: int = 0
    include_stop_str_in_output: bool = False
    deadline: float | None = None  # time.monotonic() after which the request is cancelled
    prefix_cache: bool = True  # False: GenerateRequest.disable_prefix_cache
    constraint: object = None  # a CompiledConstraint (muestra.gateway.engine.constraints), or None
    suppressed_token_ids: tuple[int, ...] = ()  # never picked (special tokens; GenerateRequest.allow_special_tokens)
    special_tokens_in_text: bool = False  # allow_special_tokens: what is sampled is shown, special or not
    speculation: object = None  # the request's proposer and params (proposers.registry.Speculation), or None
    prompt_cache_key: str = ""  # GenerateRequest.prompt_cache_key: a routing hint
    chat: bool = False  # its prompt is a conversation (messages): its turn is cached in Redis when it ends
    # Its tokens must not depend on its batch (--row-invariant): its steps alone run row-invariant too
    # (DecodeRequest.row_invariant).
    row_invariant: bool = False
    # A JSON constraint's rows about to run out of tokens are steered to end valid (constraints.engine.closing_masks;
    # the gateway's --json-endings).
    json_endings: bool = True
    # Filled in by the gateway and the scheduler.
    arrival: float = dataclasses.field(default_factory=time.monotonic)
    admitted: float | None = None
    cancelled: bool = False
    cached_tokens: int = 0
    replica: str = ""
    # What the Generate handler streams: GenerateResponse messages, an exception, or None at the end.
    out: asyncio.Queue = dataclasses.field(default_factory=asyncio.Queue)
    open_sequences: int = 0
    model_name: str = ""
    # lm rows this request occupies (n, or the number of beams).
    rows: int = 1
    emitted: int = 0
    # Replicas that took this request: one whose replica fails before it streams may move once.
    attempts: int = 0
    failed: bool = False
    waited_for_kv: bool = False  # counted in muestra_kv_admission_waits_total

    @property
    def started(self) -> bool:
        """Whether anything was streamed to the client (after which it cannot move replicas)."""
        return self.emitted > 0

    def emit(self, message: gateway_pb2.GenerateResponse) -> None:
        if self.failed:
            return
        self.emitted += 1
        self.out.put_nowait(message)

    def fail(self, exc: BaseException) -> None:
        """End the whole request with an error status; what it has streamed so far stays streamed.

        Nobody reads its stream after that, so its rows leave the batch as a cancelled request's do.
        """
        if self.failed:
            return
        self.failed = True
        self.cancelled = True
        self.out.put_nowait(exc)
        code = exc.code if isinstance(exc, MuestraError) else grpc.StatusCode.INTERNAL
        metrics.REQUESTS_FAILED.labels(self.model_name, code.name.lower()).inc()


class Sequence:
    """One of a request's n completions, and its row of the lm batch."""

    def __init__(self, request: GenerationRequest, index: int, sampling: SamplingRow) -> None:
        self.request = request
        self.index = index
        self.sampling = sampling
        self.generated: list[int] = []
        self.pending_token: int | None = None  # sampled but not yet fed to the lm
        # Tokens taken after pending_token and not yet fed (a constraint's forced tokens, taken at once).
        self.queued: list[int] = []
        # The last step fed only part of this row's tokens: its output is not for choosing a token.
        self.in_flight = False
        self.detok = DetokenizeState.after_prompt(request.prompt_ids)
        self.stops = StopStringMatcher(request.stop, request.include_stop_str_in_output)
        self.unsent_ids: list[int] = []
        self.unsent_logprobs: list[gateway_pb2.TokenLogprob] = []
        self.finish_reason: int = gateway_pb2.FINISH_REASON_UNSPECIFIED
        self.stop_reason = ""
        self.first_token_at: float | None = None
        self.last_token_at = 0.0
        self.done_sent = False
        self.error = ""
        # Speculative decoding: the row's state (generation.speculation.RowSpeculation, or None), the drafts
        # sent with the step in flight, and how many rejected drafts its next Decode drops from its KV.
        self.speculation = None
        self.drafts: list[int] = []
        self.rollback = 0

    @property
    def finished(self) -> bool:
        return self.finish_reason != gateway_pb2.FINISH_REASON_UNSPECIFIED or self.request.cancelled

    def finish(self, reason: int, stop_reason: str = "") -> None:
        if self.finish_reason == gateway_pb2.FINISH_REASON_UNSPECIFIED:
            self.finish_reason = reason
            self.stop_reason = stop_reason

    @property
    def forced_tokens(self) -> int:
        constraint = self.sampling.constraint if self.sampling is not None else None
        return constraint.forced_count if constraint is not None else 0

    def emit_text(self, text: str, hold: int = 0) -> None:
        """Stream text and the ids produced since the last delta, but the last `hold` of them."""
        hold = min(hold, len(self.unsent_ids))
        send = len(self.unsent_ids) - hold
        if not text and not send:
            return
        delta = gateway_pb2.TextDelta(text=text, token_ids=self.unsent_ids[:send], logprobs=self.unsent_logprobs[:send])
        self.unsent_ids, self.unsent_logprobs = self.unsent_ids[send:], self.unsent_logprobs[send:]
        self.request.emit(gateway_pb2.GenerateResponse(index=self.index, delta=delta))

    def emit_done(self, error: str = "") -> None:
        if self.done_sent:
            return
        if self.request.failed:  # the stream already ended with the request's error
            self.done_sent = True
            return
        error = error or self.error
        self.done_sent = True
        request = self.request
        now = time.monotonic()
        reason = self.finish_reason or (gateway_pb2.CANCELLED if request.cancelled else gateway_pb2.ERROR)
        if error:
            reason = gateway_pb2.ERROR
        ttft = (self.first_token_at - request.arrival) if self.first_token_at else 0.0
        decode_time = now - self.first_token_at if self.first_token_at else 0.0
        tokens_per_s = (len(self.generated) - 1) / decode_time if decode_time > 0 and len(self.generated) > 1 else 0.0
        done = gateway_pb2.Completion(
            finish_reason=reason,
            stop_reason=self.stop_reason,
            usage=gateway_pb2.Usage(
                prompt_tokens=len(request.prompt_ids),
                completion_tokens=len(self.generated),
                cached_tokens=request.cached_tokens,
                forced_tokens=self.forced_tokens,
                accepted_draft_tokens=self.speculation.accepted_tokens if self.speculation is not None else 0,
                draft_tokens=self.speculation.draft_tokens if self.speculation is not None else 0,
            ),
            timings=gateway_pb2.Timings(
                queue_ms=((request.admitted or now) - request.arrival) * 1000,
                ttft_ms=ttft * 1000,
                total_ms=(now - request.arrival) * 1000,
                tokens_per_s=tokens_per_s,
            ),
            error=error,
            seed=request.seed,
            replica=request.replica,
        )
        request.emit(gateway_pb2.GenerateResponse(index=self.index, done=done))
        model = request.model_name
        metrics.GENERATION_TOKENS.labels(model).inc(len(self.generated))
        metrics.GENERATION_LENGTH.labels(model).observe(len(self.generated))
        if self.first_token_at:
            metrics.DECODE_TIME.labels(model).observe(decode_time)
        metrics.REQUESTS_FINISHED.labels(model, gateway_pb2.FinishReason.Name(reason).lower()).inc()
        if self.index == 0:
            metrics.PROMPT_TOKENS.labels(model).inc(len(request.prompt_ids))
            metrics.PROMPT_LENGTH.labels(model).observe(len(request.prompt_ids))
            metrics.E2E_LATENCY.labels(model).observe(now - request.arrival)
        request.open_sequences -= 1
        if request.open_sequences <= 0:
            request.out.put_nowait(None)


class BeamGroup:
    """A beam-search request: its search state and its completions (streamed once it is done)."""

    def __init__(self, request: GenerationRequest, search: SearchRequest) -> None:
        self.request = request
        self.search = search
        self.pending = None  # the last SearchStep, until the batch is reordered by it
        self.sequences = [Sequence(request, i, None) for i in range(request.n)]

    @property
    def finished(self) -> bool:
        return self.search.done or self.request.cancelled


class BeamRow:
    """One running beam: a row of the lm batch that belongs to a BeamGroup."""

    def __init__(self, group: BeamGroup, pending_token: int | None = None) -> None:
        self.group = group
        self.request = group.request
        self.pending_token = pending_token

    @property
    def finished(self) -> bool:
        return self.group.finished

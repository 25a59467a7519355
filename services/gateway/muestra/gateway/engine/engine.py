"""The engine: a TextRequest in, the stream of its outputs back; every edge (rpc/server.py, http/) calls this.

It owns what a request meets on its way: the plugin registries, a router of schedulers per text model, a grammar
engine per text model, the watchdog. Its outputs are gateway.v1 GenerateResponse messages, the form the gRPC
edge sends as they are and the HTTP edge turns into JSON.
"""

from __future__ import annotations

import asyncio
import json
import math
import secrets
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

from muestra.gateway.config import GatewayConfig
from muestra.gateway.engine.clients import DiffusionClient, TokenizerClient
from muestra.gateway.engine.clients.backends import ModelRegistry, TextModel
from muestra.gateway.engine.clients.progress import Watchdog
from muestra.gateway.engine.constraints.engine import ConstraintLimits, GrammarEngine
from muestra.gateway.engine.constraints.registry import ConstraintRegistry
from muestra.gateway.engine.generation.request import GenerationRequest
from muestra.gateway.engine.generation.routing import Router
from muestra.gateway.engine.generation.step_policy import ROW_INVARIANT, wants_row_invariance
from muestra.gateway.engine.proposers.registry import OFF, ProposerRegistry
from muestra.gateway.engine.requests import Limits, Step, TextRequest, check_fields
from muestra.gateway.engine.sampling import ModelInfo, SamplerRegistry, prepare_chain
from muestra.gateway.engine.tool_calls import parse_tools_json
from muestra.runtime.deadlines import within
from muestra.runtime.errors import DeadlineExceeded, InvalidArgument
from muestra.runtime.logs import request_id_var
from muestra.v1 import diffusion_pb2, gateway_pb2

# The scheduler ends a request at its deadline (finish reason CANCELLED); past this much more, the
# scheduler itself is held up by another service and the stream ends here instead.
DEADLINE_SLACK_S = 0.5


def suppressed_token_ids(model, request: TextRequest, constraint) -> tuple[int, ...]:
    """The ids the request's rows never pick: the model's special ids, unless it allows them or a constraint's
    grammar decides (llguidance leaves special tokens out unless the grammar names them); its stop ids end
    text, so they stay."""
    if request.allow_special_tokens or constraint is not None:
        return ()
    stops = set(request.stop_token_ids)
    return tuple(i for i in model.special_token_ids if i not in stops)


async def _next_item(generation: GenerationRequest, scheduler: Router):
    if generation.deadline is None:
        return await generation.out.get()
    try:
        return await within(generation.deadline - time.monotonic() + DEADLINE_SLACK_S, generation.out.get())
    except asyncio.TimeoutError:
        waits = scheduler.waits_of(generation.replica)
        raise DeadlineExceeded(
            "the request's deadline (timeout_ms, or its call's) passed while the gateway waited for "
            f"{waits or 'its turn'}; retry with seed {generation.seed} for the same text"
        ) from None


async def stream_generation(
    generation: GenerationRequest, scheduler: Router
) -> AsyncIterator[gateway_pb2.GenerateResponse]:
    """Submit `generation` and yield its messages; closing the iterator early cancels it (gRPC and HTTP)."""
    scheduler.submit(generation)
    finished = False
    try:
        while True:
            item = await _next_item(generation, scheduler)
            if item is None:
                finished = True
                return
            if isinstance(item, BaseException):
                finished = True
                raise item
            yield item
    finally:
        if not finished:
            generation.cancelled = True
            scheduler.poke()


def default_speculation(config: GatewayConfig, proposers: ProposerRegistry) -> Step:
    """What requests that name no proposer get: --speculation with --speculation-params, checked now."""
    params = {}
    if config.speculation_params:
        try:
            params = json.loads(config.speculation_params)
            if not isinstance(params, dict):
                raise ValueError(f"must be a JSON object, got {type(params).__name__}")
        except ValueError as exc:
            raise ValueError(f"--speculation-params: {exc}") from exc
    spec = Step(config.speculation, params)
    try:
        proposers.choose(spec)
    except InvalidArgument as exc:
        raise ValueError(f"--speculation {config.speculation} with --speculation-params: {exc}") from exc
    return spec


def deadline_of(timeout_ms: int, time_remaining: float | None) -> float | None:
    """The monotonic deadline of a request: its own timeout_ms, or its call's time left, whichever ends first."""
    deadline = time.monotonic() + timeout_ms / 1000 if timeout_ms else None
    if time_remaining is not None and math.isfinite(time_remaining):
        deadline = min(deadline or math.inf, time.monotonic() + time_remaining)
    return deadline


class Engine:
    """Text generation behind every edge, with the image and tokenizer calls beside it."""

    def __init__(
        self,
        config: GatewayConfig,
        registry: ModelRegistry,
        samplers: SamplerRegistry,
        constraints: ConstraintRegistry | None = None,
        proposers: ProposerRegistry | None = None,
    ) -> None:
        if config.constraint_mask not in ("lm", "gateway"):
            raise ValueError(f"--constraint-mask must be lm or gateway, got {config.constraint_mask!r}")
        if config.row_invariant not in ROW_INVARIANT:
            raise ValueError(f"--row-invariant must be one of {', '.join(ROW_INVARIANT)}, got {config.row_invariant!r}")
        if not 1 <= config.greedy_burst <= 64:
            raise ValueError(f"--greedy-burst must be between 1 and 64, got {config.greedy_burst}")
        self.config = config
        self.registry = registry
        self.samplers = samplers
        self.constraints = constraints if constraints is not None else ConstraintRegistry.load()
        self.proposers = proposers if proposers is not None else ProposerRegistry.load()
        if config.speculation not in (OFF, *self.proposers.names()):
            known = ", ".join([*self.proposers.names(), OFF])
            raise ValueError(f"--speculation {config.speculation!r} is not a registered proposer ({known})")
        self.proposers.default = default_speculation(config, self.proposers)
        self.proposers.attach(registry, config.lm_timeout_s)  # DraftProposer.attach: draft_model finds its models
        self.limits = Limits(
            config.max_n, config.max_top_logprobs, config.max_stop_strings, config.max_stop_bytes,
            config.max_prompt_bytes,
        )  # fmt: skip
        limits = ConstraintLimits(config.max_constraint_bytes, config.constraint_compile_timeout_s)
        self.grammar_engines = {
            model.name: GrammarEngine(model, limits, config.tokenizer_timeout_s) for model in registry.text.values()
        }
        self.routers: dict[str, Router] = {model.name: Router(model, config) for model in registry.text.values()}
        self.watchdog = Watchdog(self.schedulers, config.watchdog_s)

    def schedulers(self) -> list:
        return [s for router in self.routers.values() for s in router.schedulers.values()]

    def busy(self) -> bool:
        return any(scheduler.has_work() for scheduler in self.schedulers())

    def shut_down(self) -> None:
        """End every text request still running with UNAVAILABLE (and its seed), so streams end cleanly."""
        for scheduler in self.schedulers():
            scheduler.shut_down()

    def tokenizer(self, model: TextModel) -> TokenizerClient:
        return TokenizerClient(model, self.config.tokenizer_timeout_s)

    # -- text ---------------------------------------------------------------------------------

    async def _prompt_ids(self, model: TextModel, request: TextRequest, deadline: float | None) -> list[int]:
        if request.tools_json:
            await asyncio.to_thread(parse_tools_json, request.tools_json, "tools_json")  # compiles each schema
        tokenizer = self.tokenizer(model)
        if request.chat:
            return await tokenizer.chat_ids(request.messages, request.tools_json, deadline)
        add_special = request.add_special_tokens if request.add_special_tokens is not None else True
        return await tokenizer.prompt_ids(request.prompt, add_special, deadline)

    async def prepare(
        self, request: TextRequest, time_remaining: float | None = None
    ) -> tuple[GenerationRequest, Router]:
        """Validate, tokenize and build the scheduler's request; InvalidArgument names the request's field."""
        model = self.registry.text_model(request.model)
        check_fields(request, self.limits)
        model_info = ModelInfo(model.vocab_size, model.eos_token_ids, model.context_length)
        specs = [{"name": step.name, "params": step.params} for step in request.samplers]
        chain = prepare_chain(self.samplers, specs, model.generation_config, model_info)
        n = request.n or 1
        rows = n
        if chain.is_search:
            rows = chain.last.params["num_beams"]
            if n > rows:
                raise InvalidArgument("n", f"beam search returns at most num_beams ({rows}) completions, got {n}")
            if request.logprobs or request.top_logprobs:
                raise InvalidArgument("logprobs", "is not available with beam search")
        if rows > self.config.max_batch_rows:
            raise InvalidArgument("n", f"needs {rows} rows; the gateway's batch holds {self.config.max_batch_rows}")
        speculation = None
        if not chain.is_search:
            asked = request.speculation
            speculation = self.proposers.choose(asked)
            if speculation is not None:
                try:
                    self.proposers.check_target(speculation, model)
                except InvalidArgument:
                    if asked is not None:
                        raise
                    speculation = None  # the gateway's default cannot draft for this model (it is the draft model)
        row_invariant = wants_row_invariance(self.config.row_invariant, request.seed is not None, chain)
        constraint = None
        if request.constraint is not None:
            if chain.is_search:
                raise InvalidArgument("constraint", f"cannot be combined with {chain.last.sampler.name} (samplers)")
            if request.ignore_eos:
                raise InvalidArgument("constraint", "cannot be combined with ignore_eos: a finished text must end")
            step = request.constraint
            constraint = await self.grammar_engines[model.name].compile(self.constraints, step.name, step.params)
        deadline = deadline_of(request.timeout_ms, time_remaining)
        prompt_ids = await self._prompt_ids(model, request, deadline)
        if not prompt_ids:
            raise InvalidArgument("prompt", "encodes to no tokens")
        context_length = model.context_length
        if len(prompt_ids) >= context_length:
            raise InvalidArgument(
                "prompt", f"has {len(prompt_ids)} tokens; the model's context length is {context_length}"
            )
        room = context_length - len(prompt_ids)
        if request.max_tokens > room:
            raise InvalidArgument(
                "max_tokens",
                f"{request.max_tokens} plus the prompt's {len(prompt_ids)} tokens exceeds the context length "
                f"{context_length} (at most {room} here)",
            )
        generation = GenerationRequest(
            request_id=request_id_var.get(),
            prompt_ids=prompt_ids,
            max_tokens=request.max_tokens or room,
            n=n,
            rows=rows,
            seed=request.seed if request.seed is not None else secrets.randbits(63),
            row_invariant=row_invariant,
            json_endings=self.config.json_endings,
            chain=chain,
            stop=list(request.stop),
            stop_token_ids=frozenset(request.stop_token_ids),
            ignore_eos=request.ignore_eos,
            logprobs=request.logprobs or request.top_logprobs > 0,
            top_logprobs=request.top_logprobs,
            include_stop_str_in_output=request.include_stop_str_in_output,
            deadline=deadline,
            model_name=model.name,
            prefix_cache=not request.disable_prefix_cache,
            constraint=constraint,
            suppressed_token_ids=suppressed_token_ids(model, request, constraint),
            special_tokens_in_text=request.allow_special_tokens,
            speculation=speculation,
            prompt_cache_key=request.prompt_cache_key,
            chat=request.chat,
        )
        return generation, self.routers[model.name]

    async def generate(
        self, request: TextRequest, time_remaining: float | None = None
    ) -> AsyncIterator[gateway_pb2.GenerateResponse]:
        """The request's outputs as they come; closing the iterator early cancels it."""
        generation, scheduler = await self.prepare(request, time_remaining)
        async for message in stream_generation(generation, scheduler):
            yield message

    # -- images -------------------------------------------------------------------------------

    def diffusion(self, model) -> DiffusionClient:
        return DiffusionClient(model, self.config.diffusion_timeout_s)

    async def generate_image(
        self, request: diffusion_pb2.ImageRequest, time_remaining: float | None = None
    ) -> AsyncIterator[diffusion_pb2.ImageResponse]:
        """The image model's progress, previews and images; the rest of the request is its service's to check."""
        model = self.registry.image_model(request.model)
        if request.sampler and request.sampler not in model.scheduler_names:
            raise InvalidArgument(
                "sampler", f"unknown scheduler {request.sampler!r}; known: {', '.join(model.schedulers)}"
            )
        async for message in self.diffusion(model).generate(request, time_remaining):
            yield message

    # -- listings and the tokenizer -----------------------------------------------------------

    def models(self) -> list[ModelListing]:
        """Every served model, text ones first, each with its healthy replicas."""
        listing = [
            ModelListing(m.name, "text", m.context_length, m.vocab_size, len(self.routers[m.name].healthy()))
            for m in self.registry.text.values()
        ]
        return listing + [ModelListing(m.name, "image", replicas=1) for m in self.registry.image.values()]

    async def tokenize(
        self, model_name: str, prompt: str | None, messages, add_special_tokens: bool | None, time_remaining=None
    ):
        """(encoding, model) of a prompt, or of a conversation rendered as Generate renders it."""
        model = self.registry.text_model(model_name)
        if prompt is None and messages is None:
            raise InvalidArgument("prompt", "give a prompt or messages")
        deadline = deadline_of(0, time_remaining)
        tokenizer = self.tokenizer(model)
        kind = "prompt" if prompt is not None else "messages"
        if prompt is not None:
            text, add_special = prompt, add_special_tokens if add_special_tokens is not None else True
        else:
            if not messages:
                raise InvalidArgument("messages", "is empty")
            # Generate encodes the rendered conversation without adding special tokens again; so does this.
            text, add_special = await tokenizer.render(messages, deadline), False
        size = len(text.encode("utf-8", errors="surrogatepass"))
        if size > self.config.max_prompt_bytes:
            raise InvalidArgument(kind, f"is {size} bytes; the limit is {self.config.max_prompt_bytes}")
        return await tokenizer.encode(text, add_special, deadline), model

    async def detokenize(self, model_name: str, ids, skip_special_tokens: bool, time_remaining=None) -> str:
        model = self.registry.text_model(model_name)
        return await self.tokenizer(model).decode(ids, skip_special_tokens, deadline_of(0, time_remaining))


@dataclass(frozen=True)
class ModelListing:
    name: str
    kind: str  # "text" or "image"
    context_length: int = 0
    vocab_size: int = 0
    replicas: int = 0

"""The gateway's gRPC surface: Generate, GenerateImage and the listings."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import secrets
import time
from collections.abc import AsyncIterator

import grpc
from google.protobuf import struct_pb2

from muestra.gateway.config import GatewayConfig
from muestra.gateway.engine.backends import ModelRegistry, TextModel
from muestra.gateway.engine.constraints.engine import ConstraintLimits, GrammarEngine
from muestra.gateway.engine.constraints.registry import ConstraintRegistry
from muestra.gateway.engine.generation.progress import Watchdog
from muestra.gateway.engine.generation.request import GenerationRequest
from muestra.gateway.engine.generation.routing import Router
from muestra.gateway.engine.generation.step_policy import ROW_INVARIANT, wants_row_invariance
from muestra.gateway.engine.proposers.registry import OFF, ProposerRegistry
from muestra.gateway.engine.sampling import ModelInfo, SamplerRegistry, prepare_chain
from muestra.gateway.engine.tool_calls import parse_tools_json
from muestra.gateway.rpc.tokenize import TokenizeRPCs
from muestra.runtime.calls import grpc_error_to_muestra
from muestra.runtime.deadlines import within
from muestra.runtime.errors import DeadlineExceeded, InvalidArgument, Unavailable, check_limit
from muestra.runtime.logs import request_id_var
from muestra.v1 import diffusion_pb2, gateway_pb2, gateway_pb2_grpc, tokenizer_pb2

log = logging.getLogger("muestra.gateway")


def _value(value: struct_pb2.Value):
    """A Struct value as Python (unlike json_format, it keeps NaN so validation can name it)."""
    kind = value.WhichOneof("kind")
    if kind == "struct_value":
        return {key: _value(v) for key, v in value.struct_value.fields.items()}
    if kind == "list_value":
        return [_value(v) for v in value.list_value.values]
    if kind == "null_value":
        return None
    return getattr(value, kind) if kind else None


def sampler_specs(request: gateway_pb2.GenerateRequest) -> list[dict]:
    return [
        {"name": spec.name, "params": {key: _value(v) for key, v in spec.params.fields.items()}}
        for spec in request.samplers
    ]


# Longest GenerateRequest.prompt_cache_key, in characters.
MAX_PROMPT_CACHE_KEY = 256
# The scheduler ends a request at its deadline (finish reason CANCELLED); past this much more, the
# scheduler itself is held up by another service and the stream ends here instead.
DEADLINE_SLACK_S = 0.5


def suppressed_token_ids(model, request: gateway_pb2.GenerateRequest, constraint) -> tuple[int, ...]:
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


def default_speculation(config: GatewayConfig, proposers: ProposerRegistry) -> gateway_pb2.SpeculationSpec:
    """What requests that name no proposer get: --speculation with --speculation-params, checked now."""
    spec = gateway_pb2.SpeculationSpec(proposer=config.speculation)
    if config.speculation_params:
        try:
            params = json.loads(config.speculation_params)
            if not isinstance(params, dict):
                raise ValueError(f"must be a JSON object, got {type(params).__name__}")
            spec.params.update(params)
        except ValueError as exc:
            raise ValueError(f"--speculation-params: {exc}") from exc
    try:
        proposers.choose(spec)
    except InvalidArgument as exc:
        raise ValueError(f"--speculation {config.speculation} with --speculation-params: {exc}") from exc
    return spec


def _utf8_len(text: str) -> int:
    return len(text.encode("utf-8", errors="surrogatepass"))


class GatewayServicer(TokenizeRPCs, gateway_pb2_grpc.GatewayServicer):
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
        for entry in self.proposers.list():
            # A proposer that drafts with served models (the built-in draft_model) finds them here.
            if callable(attach := getattr(entry.proposer, "attach", None)):
                attach(registry, config.lm_timeout_s)
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

    # -- text ---------------------------------------------------------------------------------

    def _validate(self, request: gateway_pb2.GenerateRequest) -> None:
        cfg = self.config
        check_limit("n", request.n or 1, 1, cfg.max_n)
        check_limit("top_logprobs", request.top_logprobs, 0, cfg.max_top_logprobs)
        check_limit("stop", len(request.stop), 0, cfg.max_stop_strings)
        for i, stop in enumerate(request.stop):
            if not stop:
                raise InvalidArgument(f"stop[{i}]", "is empty")
            if _utf8_len(stop) > cfg.max_stop_bytes:
                raise InvalidArgument(f"stop[{i}]", f"is {_utf8_len(stop)} bytes; the limit is {cfg.max_stop_bytes}")
        kind = request.WhichOneof("input")
        if kind is None:
            raise InvalidArgument("prompt", "give a prompt or messages")
        if kind == "prompt":
            if not request.prompt:
                raise InvalidArgument("prompt", "is empty")
            size = _utf8_len(request.prompt)
        else:
            if not request.messages.messages:
                raise InvalidArgument("messages", "is empty")
            size = sum(_utf8_len(m.content) for m in request.messages.messages)
        if size > cfg.max_prompt_bytes:
            raise InvalidArgument(kind, f"is {size} bytes; the limit is {cfg.max_prompt_bytes}")

    async def _prompt_ids(
        self, model: TextModel, request: gateway_pb2.GenerateRequest, deadline: float | None
    ) -> list[int]:
        add_special = request.add_special_tokens if request.HasField("add_special_tokens") else True
        timeout = self.config.tokenizer_timeout_s
        # Whether the request's own deadline (timeout_ms, or its call's) bounds the tokenizer call.
        own_deadline = deadline is not None and deadline - time.monotonic() < timeout
        if deadline is not None:
            timeout = max(0.001, min(timeout, deadline - time.monotonic()))
        if request.tools_json:
            if request.WhichOneof("input") != "messages":
                raise InvalidArgument("tools_json", "needs messages: tools go to the chat template")
            size, limit = _utf8_len(request.tools_json), self.config.max_prompt_bytes
            if size > limit:
                raise InvalidArgument("tools_json", f"is {size} bytes; the limit is {limit}")
            await asyncio.to_thread(parse_tools_json, request.tools_json, "tools_json")  # compiles each schema
        try:
            if request.WhichOneof("input") == "messages":
                reply = await model.tokenizer.ApplyChatTemplate(
                    tokenizer_pb2.ApplyChatTemplateRequest(
                        model=model.tokenizer_model,
                        messages=request.messages.messages,
                        add_generation_prompt=True,
                        tokenize=True,
                        tools_json=request.tools_json,
                    ),
                    timeout=timeout,
                )
                return list(reply.ids)
            reply = await model.tokenizer.Encode(
                tokenizer_pb2.EncodeRequest(
                    model=model.tokenizer_model, texts=[request.prompt], add_special_tokens=add_special
                ),
                timeout=timeout,
            )
            return list(reply.encodings[0].ids)
        except grpc.aio.AioRpcError as exc:
            if exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED and own_deadline:
                raise DeadlineExceeded(
                    "the request's deadline (timeout_ms, or its call's) passed while its prompt was being tokenized"
                ) from exc
            if exc.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                raise Unavailable(
                    f"tokenizer of {model.name!r} failed: {exc.code().name} {exc.details() or ''}".rstrip()
                ) from exc
            raise grpc_error_to_muestra(exc) from exc

    async def prepare(self, request: gateway_pb2.GenerateRequest, context) -> tuple[GenerationRequest, Router]:
        """Validate, tokenize and build the scheduler's request (shared with the HTTP API)."""
        model = self.registry.text_model(request.model)
        self._validate(request)
        model_info = ModelInfo(model.vocab_size, model.eos_token_ids, model.context_length)
        chain = prepare_chain(self.samplers, sampler_specs(request), model.generation_config, model_info)
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
            asked = request.speculation if request.HasField("speculation") else None
            speculation = self.proposers.choose(asked)
            if speculation is not None and callable(check := getattr(speculation.proposer, "check_target", None)):
                try:
                    check(speculation.params, model)
                except InvalidArgument:
                    if asked is not None:
                        raise
                    speculation = None  # the gateway's default cannot draft for this model (it is the draft model)
        row_invariant = wants_row_invariance(self.config.row_invariant, request.HasField("seed"), chain)
        constraint = None
        if request.HasField("constraint"):
            if chain.is_search:
                raise InvalidArgument("constraint", f"cannot be combined with {chain.last.sampler.name} (samplers)")
            if request.ignore_eos:
                raise InvalidArgument("constraint", "cannot be combined with ignore_eos: a finished text must end")
            spec = request.constraint
            params = {key: _value(v) for key, v in spec.params.fields.items()}
            constraint = await self.grammar_engines[model.name].compile(self.constraints, spec.name, params)
        if len(request.prompt_cache_key) > MAX_PROMPT_CACHE_KEY:
            raise InvalidArgument(
                "prompt_cache_key", f"is {len(request.prompt_cache_key)} characters; at most {MAX_PROMPT_CACHE_KEY}"
            )
        deadline = None
        if request.timeout_ms:
            deadline = time.monotonic() + request.timeout_ms / 1000
        remaining = context.time_remaining() if context is not None else None
        if remaining is not None and math.isfinite(remaining):
            deadline = min(deadline or math.inf, time.monotonic() + remaining)
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
            seed=request.seed if request.HasField("seed") else secrets.randbits(63),
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
            chat=request.WhichOneof("input") == "messages",
        )
        return generation, self.routers[model.name]

    async def Generate(self, request, context):
        generation, scheduler = await self.prepare(request, context)
        async with contextlib.aclosing(stream_generation(generation, scheduler)) as messages:
            async for message in messages:
                yield message

    # -- images -------------------------------------------------------------------------------

    async def GenerateImage(self, request, context):
        model = self.registry.image_model(request.model)
        if request.sampler and request.sampler not in model.scheduler_names:
            raise InvalidArgument(
                "sampler", f"unknown scheduler {request.sampler!r}; known: {', '.join(model.schedulers)}"
            )
        timeout = self.config.diffusion_timeout_s
        remaining = context.time_remaining() if context is not None else None
        if remaining is not None and math.isfinite(remaining):
            timeout = min(timeout, remaining)
        call = model.stub.Generate(request, timeout=timeout)
        try:
            async for message in call:
                yield message
        except grpc.aio.AioRpcError as exc:
            raise grpc_error_to_muestra(exc) from exc
        finally:
            call.cancel()

    # -- listings -----------------------------------------------------------------------------

    async def ListModels(self, request, context):
        models = [
            gateway_pb2.ModelInfo(
                name=m.name,
                kind="text",
                context_length=m.context_length,
                vocab_size=m.vocab_size,
                replicas=len(self.routers[m.name].healthy()),
            )
            for m in self.registry.text.values()
        ]
        models += [gateway_pb2.ModelInfo(name=m.name, kind="image", replicas=1) for m in self.registry.image.values()]
        return gateway_pb2.ListModelsResponse(models=models)

    async def ListSamplers(self, request, context):
        return gateway_pb2.ListSamplersResponse(samplers=[entry.to_proto() for entry in self.samplers.list()])

    async def ListConstraints(self, request, context):
        return gateway_pb2.ListConstraintsResponse(constraints=[e.to_proto() for e in self.constraints.list()])

    async def ListPlugins(self, request, context):
        plugins = {plugin.name: plugin.to_proto() for plugin in self.samplers.plugins()}
        for plugin, entries in self.constraints.by_plugin().items():
            first = entries[0]
            info = plugins.setdefault(
                plugin, gateway_pb2.PluginInfo(name=plugin, distribution=first.distribution, version=first.version)
            )
            info.constraints.extend(entry.name for entry in entries)
        for entry in self.proposers.list():
            info = plugins.setdefault(
                entry.plugin,
                gateway_pb2.PluginInfo(name=entry.plugin, distribution=entry.distribution, version=entry.version),
            )
            info.proposers.append(entry.name)
        unanswered = []
        for model in self.registry.image.values():  # schedulers load in the diffusion services
            try:
                reply = await model.stub.ListSchedulers(diffusion_pb2.ListSchedulersRequest(), timeout=5)
            except grpc.aio.AioRpcError as exc:
                # The samplers are still worth listing: say whose schedulers are missing instead.
                log.warning("ListPlugins: the diffusion service of %r did not answer (%s)", model.name, exc.code().name)
                unanswered.append(model.name)
                continue
            for scheduler in reply.schedulers:
                info = plugins.setdefault(
                    scheduler.plugin,
                    gateway_pb2.PluginInfo(
                        name=scheduler.plugin, distribution=scheduler.distribution, version=scheduler.version
                    ),
                )
                if scheduler.name not in info.schedulers:
                    info.schedulers.append(scheduler.name)
        return gateway_pb2.ListPluginsResponse(plugins=list(plugins.values()), unanswered_image_models=unanswered)

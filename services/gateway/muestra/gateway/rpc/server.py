"""The gateway's gRPC surface: Generate, GenerateImage, the listings, Tokenize and Detokenize.

Each call turns its message into the engine's terms (a GenerateRequest into a TextRequest) and its answer back;
what a request means and how it is checked is the engine's (engine/engine.py, engine/requests.py).
"""

from __future__ import annotations

import contextlib
import logging

import grpc
from google.protobuf import struct_pb2

from muestra.gateway.engine.engine import Engine
from muestra.gateway.engine.requests import Message, Step, TextRequest
from muestra.gateway.rpc.tokenize import TokenizeRPCs
from muestra.v1 import gateway_pb2, gateway_pb2_grpc

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


def _params(struct: struct_pb2.Struct) -> dict:
    return {key: _value(v) for key, v in struct.fields.items()}


def text_request(request: gateway_pb2.GenerateRequest) -> TextRequest:
    """A GenerateRequest in the engine's terms."""
    kind = request.WhichOneof("input")
    messages = None
    if kind == "messages":
        messages = tuple(
            Message(m.role, m.content, m.name, m.tool_calls_json, m.tool_call_id) for m in request.messages.messages
        )
    return TextRequest(
        model=request.model,
        prompt=request.prompt if kind == "prompt" else None,
        messages=messages,
        tools_json=request.tools_json,
        max_tokens=request.max_tokens,
        samplers=tuple(Step(spec.name, _params(spec.params)) for spec in request.samplers),
        n=request.n or 1,
        seed=request.seed if request.HasField("seed") else None,
        stop=tuple(request.stop),
        stop_token_ids=tuple(request.stop_token_ids),
        logprobs=request.logprobs,
        top_logprobs=request.top_logprobs,
        ignore_eos=request.ignore_eos,
        allow_special_tokens=request.allow_special_tokens,
        add_special_tokens=request.add_special_tokens if request.HasField("add_special_tokens") else None,
        include_stop_str_in_output=request.include_stop_str_in_output,
        constraint=Step(request.constraint.name, _params(request.constraint.params))
        if request.HasField("constraint")
        else None,
        speculation=Step(request.speculation.proposer, _params(request.speculation.params))
        if request.HasField("speculation")
        else None,
        timeout_ms=request.timeout_ms,
        disable_prefix_cache=request.disable_prefix_cache,
        prompt_cache_key=request.prompt_cache_key,
    )


def time_remaining(context) -> float | None:
    return context.time_remaining() if context is not None else None


class GatewayServicer(TokenizeRPCs, gateway_pb2_grpc.GatewayServicer):
    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    # -- text ---------------------------------------------------------------------------------

    async def Generate(self, request, context):
        async with contextlib.aclosing(self.engine.generate(text_request(request), time_remaining(context))) as out:
            async for message in out:
                yield message

    # -- images -------------------------------------------------------------------------------

    async def GenerateImage(self, request, context):
        images = self.engine.generate_image(request, time_remaining(context))
        async with contextlib.aclosing(images) as out:
            async for message in out:
                yield message

    # -- listings -----------------------------------------------------------------------------

    async def ListModels(self, request, context):
        return gateway_pb2.ListModelsResponse(
            models=[
                gateway_pb2.ModelInfo(
                    name=m.name, kind=m.kind, context_length=m.context_length, vocab_size=m.vocab_size,
                    replicas=m.replicas,
                )
                for m in self.engine.models()
            ]
        )  # fmt: skip

    async def ListSamplers(self, request, context):
        return gateway_pb2.ListSamplersResponse(samplers=[entry.to_proto() for entry in self.engine.samplers.list()])

    async def ListConstraints(self, request, context):
        return gateway_pb2.ListConstraintsResponse(constraints=[e.to_proto() for e in self.engine.constraints.list()])

    async def ListPlugins(self, request, context):
        plugins = {plugin.name: plugin.to_proto() for plugin in self.engine.samplers.plugins()}
        for plugin, entries in self.engine.constraints.by_plugin().items():
            first = entries[0]
            info = plugins.setdefault(
                plugin, gateway_pb2.PluginInfo(name=plugin, distribution=first.distribution, version=first.version)
            )
            info.constraints.extend(entry.name for entry in entries)
        for entry in self.engine.proposers.list():
            info = plugins.setdefault(
                entry.plugin,
                gateway_pb2.PluginInfo(name=entry.plugin, distribution=entry.distribution, version=entry.version),
            )
            info.proposers.append(entry.name)
        unanswered = []
        for model in self.engine.registry.image.values():  # schedulers load in the diffusion services
            try:
                schedulers = await self.engine.diffusion(model).schedulers()
            except grpc.aio.AioRpcError as exc:
                # The samplers are still worth listing: say whose schedulers are missing instead.
                log.warning("ListPlugins: the diffusion service of %r did not answer (%s)", model.name, exc.code().name)
                unanswered.append(model.name)
                continue
            for scheduler in schedulers:
                info = plugins.setdefault(
                    scheduler.plugin,
                    gateway_pb2.PluginInfo(
                        name=scheduler.plugin, distribution=scheduler.distribution, version=scheduler.version
                    ),
                )
                if scheduler.name not in info.schedulers:
                    info.schedulers.append(scheduler.name)
        return gateway_pb2.ListPluginsResponse(plugins=list(plugins.values()), unanswered_image_models=unanswered)

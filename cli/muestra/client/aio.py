"""The asyncio client: the same calls as Client, awaited."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import grpc

from muestra.client.errors import from_rpc_error
from muestra.client.images import GeneratedImage, Progress, build_image_request, image_event
from muestra.client.sync import MAX_MESSAGE_BYTES
from muestra.client.types import Completion, Delta, GenerationState, build_request, build_tokenize_request
from muestra.v1 import gateway_pb2, gateway_pb2_grpc


class AsyncGeneration(GenerationState):
    """`async for delta in generation`; afterwards `completions` holds the final stats."""

    def __init__(self, call) -> None:
        super().__init__()
        self._call = call

    async def __aiter__(self) -> AsyncIterator[Delta]:
        try:
            async for message in self._call:
                delta = self.absorb(message)
                if delta is not None:
                    yield delta
        except grpc.aio.AioRpcError as exc:
            if exc.code() == grpc.StatusCode.CANCELLED:
                return
            raise from_rpc_error(exc) from None

    async def wait(self) -> AsyncGeneration:
        async for _ in self:
            pass
        return self

    def cancel(self) -> None:
        self._call.cancel()


class AsyncClient:
    def __init__(self, address: str = "127.0.0.1:50051", api_key: str | None = None, timeout: float | None = None):
        self.address = address
        self.timeout = timeout
        self._metadata = (("authorization", f"Bearer {api_key}"),) if api_key else ()
        options = [("grpc.max_receive_message_length", MAX_MESSAGE_BYTES)]
        self._channel = grpc.aio.insecure_channel(address, options=options)
        self._stub = gateway_pb2_grpc.GatewayStub(self._channel)

    async def close(self) -> None:
        await self._channel.close()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    def generate(self, prompt: str | None = None, *, messages=None, **kwargs: Any) -> AsyncGeneration:
        request = build_request(prompt, messages, **kwargs)
        return AsyncGeneration(self._stub.Generate(request, metadata=self._metadata, timeout=self.timeout))

    async def complete(self, prompt: str | None = None, **kwargs: Any) -> tuple[str, Completion]:
        generation = await self.generate(prompt, **kwargs).wait()
        return generation.texts.get(0, ""), generation.completions[0]

    async def generate_image(self, prompt: str, on_progress=None, **kwargs: Any) -> list[GeneratedImage]:
        call = self._stub.GenerateImage(
            build_image_request(prompt, **kwargs), metadata=self._metadata, timeout=self.timeout
        )
        images = []
        try:
            async for message in call:
                event = image_event(message)
                if isinstance(event, Progress):
                    if on_progress is not None:
                        on_progress(event)
                else:
                    images.append(event)
        except grpc.aio.AioRpcError as exc:
            raise from_rpc_error(exc) from None
        return images

    async def _unary(self, method, request):
        try:
            return await method(request, metadata=self._metadata, timeout=self.timeout or 30)
        except grpc.aio.AioRpcError as exc:
            raise from_rpc_error(exc) from None

    async def list_models(self) -> list[gateway_pb2.ModelInfo]:
        return list((await self._unary(self._stub.ListModels, gateway_pb2.ListModelsRequest())).models)

    async def list_samplers(self) -> list[gateway_pb2.SamplerInfo]:
        return list((await self._unary(self._stub.ListSamplers, gateway_pb2.ListSamplersRequest())).samplers)

    async def list_plugins(self) -> list[gateway_pb2.PluginInfo]:
        return list((await self._unary(self._stub.ListPlugins, gateway_pb2.ListPluginsRequest())).plugins)

    async def tokenize(
        self, prompt: str | None = None, *, messages=None, model: str = "", add_special_tokens: bool | None = None
    ) -> gateway_pb2.TokenizeResponse:
        request = build_tokenize_request(prompt, messages, model, add_special_tokens)
        return await self._unary(self._stub.Tokenize, request)

    async def detokenize(self, ids, *, model: str = "", skip_special_tokens: bool = False) -> str:
        request = gateway_pb2.DetokenizeRequest(model=model, ids=list(ids), skip_special_tokens=skip_special_tokens)
        return (await self._unary(self._stub.Detokenize, request)).text

"""The blocking client."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import grpc

from muestra.client.errors import from_rpc_error
from muestra.client.images import GeneratedImage, Progress, build_image_request, image_event
from muestra.client.types import Completion, Delta, GenerationState, build_request, build_tokenize_request
from muestra.v1 import gateway_pb2, gateway_pb2_grpc

MAX_MESSAGE_BYTES = 64 * 1024 * 1024


class Generation(GenerationState):
    """Iterate for Delta objects as they stream; afterwards `completions` holds the final stats."""

    def __init__(self, call) -> None:
        super().__init__()
        self._call = call

    def __iter__(self) -> Iterator[Delta]:
        try:
            for message in self._call:
                delta = self.absorb(message)
                if delta is not None:
                    yield delta
        except grpc.RpcError as exc:
            if exc.code() == grpc.StatusCode.CANCELLED:
                return
            raise from_rpc_error(exc) from None

    def wait(self) -> Generation:
        """Consume the whole stream."""
        for _ in self:
            pass
        return self

    def cancel(self) -> None:
        """Close the stream; the gateway drops the request within one decode step."""
        self._call.cancel()


class Client:
    """muestra's gateway over gRPC.

    client = Client("127.0.0.1:50051")
    for delta in client.generate("El cielo es", max_tokens=40, temperature=0.7, seed=1):
        print(delta.text, end="", flush=True)
    """

    def __init__(self, address: str = "127.0.0.1:50051", api_key: str | None = None, timeout: float | None = None):
        self.address = address
        self.timeout = timeout
        self._metadata = (("authorization", f"Bearer {api_key}"),) if api_key else ()
        options = [("grpc.max_receive_message_length", MAX_MESSAGE_BYTES)]
        self._channel = grpc.insecure_channel(address, options=options)
        self._stub = gateway_pb2_grpc.GatewayStub(self._channel)

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def generate(self, prompt: str | None = None, *, messages=None, **kwargs: Any) -> Generation:
        """Stream completions of a prompt (or chat messages); see build_request for the keywords."""
        request = build_request(prompt, messages, **kwargs)
        return Generation(self._stub.Generate(request, metadata=self._metadata, timeout=self.timeout))

    def complete(self, prompt: str | None = None, **kwargs: Any) -> tuple[str, Completion]:
        """The whole text of completion 0 and its stats."""
        generation = self.generate(prompt, **kwargs).wait()
        return generation.texts.get(0, ""), generation.completions[0]

    def generate_image(self, prompt: str, on_progress=None, **kwargs: Any) -> list[GeneratedImage]:
        """Images for a prompt; on_progress(Progress) is called at every denoising step."""
        call = self._stub.GenerateImage(
            build_image_request(prompt, **kwargs), metadata=self._metadata, timeout=self.timeout
        )
        images = []
        try:
            for message in call:
                event = image_event(message)
                if isinstance(event, Progress):
                    if on_progress is not None:
                        on_progress(event)
                else:
                    images.append(event)
        except grpc.RpcError as exc:
            raise from_rpc_error(exc) from None
        return images

    def _unary(self, method, request):
        try:
            return method(request, metadata=self._metadata, timeout=self.timeout or 30)
        except grpc.RpcError as exc:
            raise from_rpc_error(exc) from None

    def list_models(self) -> list[gateway_pb2.ModelInfo]:
        return list(self._unary(self._stub.ListModels, gateway_pb2.ListModelsRequest()).models)

    def list_samplers(self) -> list[gateway_pb2.SamplerInfo]:
        return list(self._unary(self._stub.ListSamplers, gateway_pb2.ListSamplersRequest()).samplers)

    def list_plugins(self) -> list[gateway_pb2.PluginInfo]:
        return list(self._unary(self._stub.ListPlugins, gateway_pb2.ListPluginsRequest()).plugins)

    def tokenize(
        self, prompt: str | None = None, *, messages=None, model: str = "", add_special_tokens: bool | None = None
    ) -> gateway_pb2.TokenizeResponse:
        """The ids (and tokens) the model's tokenizer gives a prompt or a conversation, as Generate would."""
        return self._unary(self._stub.Tokenize, build_tokenize_request(prompt, messages, model, add_special_tokens))

    def detokenize(self, ids, *, model: str = "", skip_special_tokens: bool = False) -> str:
        request = gateway_pb2.DetokenizeRequest(model=model, ids=list(ids), skip_special_tokens=skip_special_tokens)
        return self._unary(self._stub.Detokenize, request).text

"""Tokenize and Detokenize: the gateway's public view of a text model's tokenizer service."""

from __future__ import annotations

import math

import grpc

from muestra.runtime.calls import grpc_error_to_muestra
from muestra.runtime.errors import DeadlineExceeded, InvalidArgument, Unavailable
from muestra.v1 import gateway_pb2, tokenizer_pb2


class TokenizeRPCs:
    """Mixed into GatewayServicer (it needs `config` and `registry`); each call forwards to the tokenizer."""

    def _timeout(self, context) -> tuple[float, bool]:
        """The tokenizer call's timeout, and whether the caller's own deadline is what sets it."""
        timeout = self.config.tokenizer_timeout_s
        remaining = context.time_remaining() if context is not None else None
        if remaining is not None and math.isfinite(remaining) and remaining < timeout:
            return max(0.001, remaining), True
        return timeout, False

    async def _forward(self, call, request, context, what: str):
        timeout, own_deadline = self._timeout(context)
        try:
            return await call(request, timeout=timeout)
        except grpc.aio.AioRpcError as exc:
            if exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED and own_deadline:
                raise DeadlineExceeded(f"the call's deadline passed while the tokenizer {what}") from exc
            if exc.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                raise Unavailable(f"tokenizer failed: {exc.code().name} {exc.details() or ''}".rstrip()) from exc
            raise grpc_error_to_muestra(exc) from exc

    async def Tokenize(self, request, context):
        model = self.registry.text_model(request.model)
        kind = request.WhichOneof("input")
        if kind is None:
            raise InvalidArgument("prompt", "give a prompt or messages")
        if kind == "prompt":
            text = request.prompt
            add_special = request.add_special_tokens if request.HasField("add_special_tokens") else True
        else:
            if not request.messages.messages:
                raise InvalidArgument("messages", "is empty")
            # Generate encodes the rendered conversation without adding special tokens again; so does this.
            rendered = await self._forward(
                model.tokenizer.ApplyChatTemplate,
                tokenizer_pb2.ApplyChatTemplateRequest(
                    model=model.tokenizer_model, messages=request.messages.messages, add_generation_prompt=True
                ),
                context,
                "rendered the chat template",
            )
            text, add_special = rendered.text, False
        size = len(text.encode("utf-8", errors="surrogatepass"))
        if size > self.config.max_prompt_bytes:
            raise InvalidArgument(kind, f"is {size} bytes; the limit is {self.config.max_prompt_bytes}")
        reply = await self._forward(
            model.tokenizer.Encode,
            tokenizer_pb2.EncodeRequest(model=model.tokenizer_model, texts=[text], add_special_tokens=add_special),
            context,
            "encoded the text",
        )
        encoding = reply.encodings[0]
        return gateway_pb2.TokenizeResponse(
            ids=encoding.ids, tokens=encoding.tokens, context_length=model.context_length
        )

    async def Detokenize(self, request, context):
        model = self.registry.text_model(request.model)
        reply = await self._forward(
            model.tokenizer.Decode,
            tokenizer_pb2.DecodeTokensRequest(
                model=model.tokenizer_model,
                sequences=[tokenizer_pb2.TokenIds(ids=request.ids)],
                skip_special_tokens=request.skip_special_tokens,
            ),
            context,
            "decoded the ids",
        )
        return gateway_pb2.DetokenizeResponse(text=reply.texts[0])

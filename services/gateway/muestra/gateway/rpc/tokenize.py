"""Tokenize and Detokenize: the gateway's public view of a text model's tokenizer service."""

from __future__ import annotations

from muestra.gateway.engine.requests import Message
from muestra.v1 import gateway_pb2


class TokenizeRPCs:
    """Mixed into GatewayServicer (it needs `engine`)."""

    async def Tokenize(self, request, context):
        kind = request.WhichOneof("input")
        messages = None
        if kind == "messages":
            messages = [Message(m.role, m.content, m.name, m.tool_calls_json, m.tool_call_id)
                        for m in request.messages.messages]  # fmt: skip
        add_special = request.add_special_tokens if request.HasField("add_special_tokens") else None
        encoding, model = await self.engine.tokenize(
            request.model, request.prompt if kind == "prompt" else None, messages, add_special,
            context.time_remaining() if context is not None else None,
        )  # fmt: skip
        return gateway_pb2.TokenizeResponse(
            ids=encoding.ids, tokens=encoding.tokens, context_length=model.context_length
        )

    async def Detokenize(self, request, context):
        text = await self.engine.detokenize(
            request.model, request.ids, request.skip_special_tokens,
            context.time_remaining() if context is not None else None,
        )  # fmt: skip
        return gateway_pb2.DetokenizeResponse(text=text)

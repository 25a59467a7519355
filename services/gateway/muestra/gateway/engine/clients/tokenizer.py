"""The engine's calls to a text model's tokenizer service."""

from __future__ import annotations

import time
from collections.abc import Iterable

import grpc

from muestra.gateway.engine.clients.errors import call_failed
from muestra.gateway.engine.requests import Message
from muestra.v1 import common_pb2, tokenizer_pb2


def chat_messages(messages: Iterable[Message]) -> list[common_pb2.ChatMessage]:
    return [
        common_pb2.ChatMessage(
            role=m.role, content=m.content, name=m.name, tool_calls_json=m.tool_calls_json, tool_call_id=m.tool_call_id
        )
        for m in messages
    ]


class TokenizerClient:
    """One text model's tokenizer: each call bounded by --tokenizer-timeout-s, or by the request's deadline when
    that ends first (and then a timeout is the request's DEADLINE_EXCEEDED, not the tokenizer's UNAVAILABLE)."""

    def __init__(self, model, timeout_s: float) -> None:
        self.model = model
        self.timeout_s = timeout_s

    def _timeout(self, deadline: float | None) -> tuple[float, bool]:
        if deadline is None:
            return self.timeout_s, False
        left = deadline - time.monotonic()
        return max(0.001, min(self.timeout_s, left)), left < self.timeout_s

    async def _call(self, method, request, deadline: float | None, during: str, service: str):
        timeout, own_deadline = self._timeout(deadline)
        try:
            return await method(request, timeout=timeout)
        except grpc.aio.AioRpcError as exc:
            raise call_failed(exc, service, own_deadline=own_deadline, during=during) from exc

    async def prompt_ids(self, text: str, add_special_tokens: bool, deadline: float | None = None) -> list[int]:
        """A generation's prompt as ids."""
        reply = await self._call(
            self.model.tokenizer.Encode,
            tokenizer_pb2.EncodeRequest(
                model=self.model.tokenizer_model, texts=[text], add_special_tokens=add_special_tokens
            ),
            deadline, "its prompt was being tokenized", f"tokenizer of {self.model.name!r}",
        )  # fmt: skip
        return list(reply.encodings[0].ids)

    async def chat_ids(self, messages: Iterable[Message], tools_json: str, deadline: float | None = None) -> list[int]:
        """A conversation through the model's chat template, with the assistant's cue, as ids."""
        reply = await self._call(
            self.model.tokenizer.ApplyChatTemplate,
            tokenizer_pb2.ApplyChatTemplateRequest(
                model=self.model.tokenizer_model, messages=chat_messages(messages), add_generation_prompt=True,
                tokenize=True, tools_json=tools_json,
            ),
            deadline, "its prompt was being tokenized", f"tokenizer of {self.model.name!r}",
        )  # fmt: skip
        return list(reply.ids)

    async def render(self, messages: Iterable[Message], deadline: float | None = None) -> str:
        """A conversation through the chat template, as text."""
        reply = await self._call(
            self.model.tokenizer.ApplyChatTemplate,
            tokenizer_pb2.ApplyChatTemplateRequest(
                model=self.model.tokenizer_model, messages=chat_messages(messages), add_generation_prompt=True
            ),
            deadline, "the tokenizer rendered the chat template", "tokenizer",
        )  # fmt: skip
        return reply.text

    async def encode(self, text: str, add_special_tokens: bool, deadline: float | None = None):
        """One text's encoding (ids and token strings)."""
        reply = await self._call(
            self.model.tokenizer.Encode,
            tokenizer_pb2.EncodeRequest(
                model=self.model.tokenizer_model, texts=[text], add_special_tokens=add_special_tokens
            ),
            deadline, "the tokenizer encoded the text", "tokenizer",
        )  # fmt: skip
        return reply.encodings[0]

    async def decode(self, ids: Iterable[int], skip_special_tokens: bool, deadline: float | None = None) -> str:
        reply = await self._call(
            self.model.tokenizer.Decode,
            tokenizer_pb2.DecodeTokensRequest(
                model=self.model.tokenizer_model, sequences=[tokenizer_pb2.TokenIds(ids=ids)],
                skip_special_tokens=skip_special_tokens,
            ),
            deadline, "the tokenizer decoded the ids", "tokenizer",
        )  # fmt: skip
        return reply.texts[0]

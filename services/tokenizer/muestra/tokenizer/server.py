"""The muestra.v1.Tokenizer gRPC surface: validation here, the work in a thread pool off the event loop.

Small decodes (a decode step's few short windows) are the exception: they run on the loop.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

import grpc

from muestra.runtime import FailedPrecondition, InvalidArgument, ResourceExhausted, ServiceSpec
from muestra.runtime.logs import joined_request_ids, request_id_scope
from muestra.runtime.step_streams import until_drained
from muestra.tokenizer.backend import SMALL_DECODE_IDS
from muestra.tokenizer.detokenize import Window, detokenize_step
from muestra.tokenizer.loader import LoadedTokenizer
from muestra.v1 import tokenizer_pb2, tokenizer_pb2_grpc

T = TypeVar("T")
log = logging.getLogger("muestra.tokenizer")
SERVICE_NAME = "muestra.v1.Tokenizer"
EXPORT_CHUNK_BYTES = 1 << 20


@dataclasses.dataclass
class Limits:
    """What one request may ask for."""

    max_text_bytes: int
    max_batch_size: int
    max_sequence_ids: int
    max_messages: int
    # The runtime's max_message_bytes: a reply over it could not be sent.
    max_reply_bytes: int = 64 * 1024 * 1024


def _check_count(field: str, count: int, limit: int) -> None:
    if count > limit:
        raise InvalidArgument(field, f"at most {limit} per request, got {count}")


def _json_list(field: str, text: str) -> list:
    """A JSON array field (tools_json, tool_calls_json), parsed for the chat template."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InvalidArgument(field, f"is not valid JSON: {exc}") from None
    if not isinstance(value, list):
        raise InvalidArgument(field, f"must be a JSON array, got {type(value).__name__}")
    return value


def _check_text(field: str, text: str, max_bytes: int) -> None:
    # Each character takes at most 4 UTF-8 bytes, so most texts need no encoding to be measured.
    if len(text) * 4 > max_bytes and len(text.encode("utf-8")) > max_bytes:
        raise InvalidArgument(field, f"is {len(text.encode('utf-8'))} UTF-8 bytes, over the limit of {max_bytes}")


def _checked_ids(field: str, ids, vocab_size: int, max_ids: int) -> list[int]:
    """The ids as a list, once they are within the length limit and the vocabulary."""
    ids = list(ids)
    if len(ids) > max_ids:
        raise InvalidArgument(field, f"has {len(ids)} ids, over the limit of {max_ids}")
    if ids and max(ids) >= vocab_size:
        index, bad = next((i, t) for i, t in enumerate(ids) if t >= vocab_size)
        raise InvalidArgument(f"{field}[{index}]", f"id {bad} is outside the vocabulary (vocab_size {vocab_size})")
    return ids


def _check_reply_size(reply, limit: int):
    size = reply.ByteSize()
    if size > limit:
        raise ResourceExhausted(
            f"the reply would be {size} bytes, over the message limit of {limit}; send fewer or shorter items per call"
        )
    return reply


class TokenizerServicer(tokenizer_pb2_grpc.TokenizerServicer):
    def __init__(self, tokenizers: list[LoadedTokenizer], limits: Limits, workers: int) -> None:
        if not tokenizers:
            raise ValueError("no tokenizers to serve")
        self.tokenizers = {t.name: t for t in tokenizers}
        self.default = tokenizers[0].name
        self.limits = limits
        self.executor = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="tokenize")

    def _select(self, model: str) -> LoadedTokenizer:
        tokenizer = self.tokenizers.get(model or self.default)
        if tokenizer is None:
            known = ", ".join(sorted(self.tokenizers))
            raise InvalidArgument("model", f"unknown tokenizer {model!r}; this service serves: {known}")
        return tokenizer

    def _batch(self, request, field: str):
        """The request's tokenizer and its `field` items (texts, sequences, streams), no more than a batch holds."""
        tokenizer = self._select(request.model)
        items = getattr(request, field)
        _check_count(field, len(items), self.limits.max_batch_size)
        return tokenizer, items

    async def _off_loop(self, fn: Callable[[], T]) -> T:
        return await asyncio.get_running_loop().run_in_executor(self.executor, fn)

    async def _decode_work(self, ids: int, fn: Callable[[], T]) -> T:
        """Small decodes (a decode step's windows) run right here: a thread handoff costs more."""
        return fn() if ids <= SMALL_DECODE_IDS else await self._off_loop(fn)

    async def Describe(self, request, context):
        t = self._select(request.model)
        return tokenizer_pb2.DescribeTokenizerResponse(
            model=t.name,
            models=list(self.tokenizers),
            vocab_size=t.backend.vocab_size,
            bos_token_id=t.bos_token_id,
            eos_token_ids=t.eos_token_ids,
            pad_token_id=t.pad_token_id,
            model_max_length=t.model_max_length,
            has_chat_template=t.chat_template is not None,
            backend=t.backend.kind,
            max_text_bytes=self.limits.max_text_bytes,
            special_token_ids=t.backend.special_token_ids,
        )

    async def ExportTokenizer(self, request, context):
        t = self._select(request.model)
        to_json = getattr(t.backend, "to_json", None)
        if to_json is None:
            raise FailedPrecondition(
                f"tokenizer {t.name!r} uses the {t.backend.kind} backend, which has no tokenizer.json form"
            )
        data = (await self._off_loop(to_json)).encode("utf-8")
        for start in range(0, len(data), EXPORT_CHUNK_BYTES):
            yield tokenizer_pb2.TokenizerChunk(data=data[start : start + EXPORT_CHUNK_BYTES])

    async def Encode(self, request, context):
        t, texts = self._batch(request, "texts")

        def work() -> tokenizer_pb2.EncodeResponse:
            for i, text in enumerate(texts):
                _check_text(f"texts[{i}]", text, self.limits.max_text_bytes)
            encoded = t.backend.encode_batch(list(texts), request.add_special_tokens, request.return_offsets)
            reply = tokenizer_pb2.EncodeResponse()
            for e in encoded:
                item = reply.encodings.add(ids=e.ids, tokens=e.tokens)
                if e.offsets is not None:
                    item.offset_starts.extend([start for start, _ in e.offsets])
                    item.offset_ends.extend([end for _, end in e.offsets])
            return _check_reply_size(reply, self.limits.max_reply_bytes)

        return await self._off_loop(work)

    async def Decode(self, request, context):
        t, sequences = self._batch(request, "sequences")

        def work() -> tokenizer_pb2.DecodeTokensResponse:
            id_lists = [
                _checked_ids(f"sequences[{i}].ids", seq.ids, t.backend.vocab_size, self.limits.max_sequence_ids)
                for i, seq in enumerate(sequences)
            ]
            texts = t.backend.decode_batch(id_lists, request.skip_special_tokens)
            raw = t.backend.decode_bytes(id_lists, request.skip_special_tokens) if request.raw_bytes else []
            reply = tokenizer_pb2.DecodeTokensResponse(texts=texts, raw=raw)
            return _check_reply_size(reply, self.limits.max_reply_bytes)

        return await self._decode_work(sum(len(s.ids) for s in sequences), work)

    async def ApplyChatTemplate(self, request, context):
        t = self._select(request.model)
        if t.chat_template is None:
            raise FailedPrecondition(f"tokenizer {t.name!r} has no chat template")
        if not request.messages:
            raise InvalidArgument("messages", "must hold at least one message")
        _check_count("messages", len(request.messages), self.limits.max_messages)
        messages, total_bytes = [], len(request.tools_json.encode())
        for i, m in enumerate(request.messages):
            if not m.role.strip():
                raise InvalidArgument(f"messages[{i}].role", "must not be empty")
            total_bytes += sum(
                len(text.encode()) for text in (m.role, m.content, m.name, m.tool_calls_json, m.tool_call_id)
            )
            message = {"role": m.role, "content": m.content}
            if m.name:
                message["name"] = m.name
            if m.tool_call_id:
                message["tool_call_id"] = m.tool_call_id
            messages.append(message)
        if total_bytes > self.limits.max_text_bytes:
            limit = self.limits.max_text_bytes
            raise InvalidArgument("messages", f"are {total_bytes} UTF-8 bytes in all, over the limit of {limit}")
        for i, m in enumerate(request.messages):
            if m.tool_calls_json:
                messages[i]["tool_calls"] = _json_list(f"messages[{i}].tool_calls_json", m.tool_calls_json)
        tools = _json_list("tools_json", request.tools_json) if request.tools_json else None

        def work() -> tokenizer_pb2.ApplyChatTemplateResponse:
            text = t.chat_template.render(messages, request.add_generation_prompt, t.special_tokens, tools)
            reply = tokenizer_pb2.ApplyChatTemplateResponse(text=text)
            if request.tokenize:
                reply.ids.extend(t.backend.encode_batch([text], False, False)[0].ids)
            return _check_reply_size(reply, self.limits.max_reply_bytes)

        return await self._off_loop(work)

    async def DetokenizeStep(self, request, context):
        t, streams = self._batch(request, "streams")

        def work() -> tokenizer_pb2.DetokenizeStepResponse:
            windows = []
            for i, stream in enumerate(streams):
                ids = _checked_ids(f"streams[{i}].ids", stream.ids, t.backend.vocab_size, self.limits.max_sequence_ids)
                if stream.read_offset > len(ids):
                    raise InvalidArgument(
                        f"streams[{i}].read_offset", f"is {stream.read_offset}, past the window's {len(ids)} ids"
                    )
                skip = stream.skip_special_tokens if stream.HasField("skip_special_tokens") else None
                windows.append(Window(ids, stream.read_offset, stream.final, skip))
            deltas = detokenize_step(t.backend, windows, request.skip_special_tokens)
            reply = tokenizer_pb2.DetokenizeStepResponse()
            for d in deltas:
                reply.deltas.add(text=d.text, prefix_advance=d.prefix_advance, read_advance=d.read_advance)
            return _check_reply_size(reply, self.limits.max_reply_bytes)

        return await self._decode_work(2 * sum(len(s.ids) for s in streams), work)

    async def DetokenizeSteps(self, request_iterator, context):
        async for request in until_drained(request_iterator):
            # One stream serves many requests: each message's log lines name the requests it serves.
            with request_id_scope(joined_request_ids(s.request_id for s in request.streams)):
                log.debug("DetokenizeSteps: %d streams", len(request.streams))
                reply = await self.DetokenizeStep(request, context)
            yield reply

    def close(self) -> None:
        self.executor.shutdown(wait=False, cancel_futures=True)


def service_spec(tokenizers: list[LoadedTokenizer], limits: Limits, workers: int) -> ServiceSpec:
    servicer = TokenizerServicer(tokenizers, limits, workers)

    async def register(server: grpc.aio.Server) -> list[str]:
        for t in tokenizers:
            log.info("serving %s from %s (%s, vocab %d)", t.name, t.path, t.backend.kind, t.backend.vocab_size)
        tokenizer_pb2_grpc.add_TokenizerServicer_to_server(servicer, server)
        return [SERVICE_NAME]

    async def close() -> None:
        servicer.close()

    return ServiceSpec(name="tokenizer", register=register, close=close)

"""A completions or chat request through the gateway: one JSON answer, or an SSE stream of chunks."""

from __future__ import annotations

import contextlib
import logging

from fastapi import Request
from fastapi.responses import JSONResponse, Response

from muestra.gateway.engine.engine import Engine, stream_generation
from muestra.gateway.http.errors import OpenAIError, from_muestra, internal
from muestra.gateway.http.openai.responses import Choices, envelope
from muestra.gateway.http.streams import (
    SSE_DONE,
    ClientGone,
    ClosingStreamingResponse,
    cancel_on_disconnect,
    merge,
    sse,
)
from muestra.runtime.errors import MuestraError
from muestra.runtime.logs import request_id_var
from muestra.v1 import gateway_pb2

log = logging.getLogger("muestra.gateway.openai")


class TextRun:
    """One completions or chat request on its way through the gateway."""

    def __init__(self, engine: Engine, body, requests, renames: dict[str, str], chat: bool) -> None:
        self.engine = engine
        self.body = body
        self.requests = requests
        self.renames = renames
        self.chat = chat
        prompts = [r.prompt for r in requests] if not chat else [""]
        self.choices = Choices(chat, prompts, body.n, echo=getattr(body, "echo", False))
        self.choices.want_logprobs = requests[0].logprobs
        self.include_usage = bool(body.stream and body.stream_options and body.stream_options.include_usage)

    def error(self, exc: BaseException) -> OpenAIError:
        if isinstance(exc, OpenAIError):
            return exc
        if isinstance(exc, MuestraError):
            return from_muestra(exc, self.renames)
        log.error("internal error", exc_info=exc)
        return internal(request_id_var.get())

    async def start(self):
        """Validate, tokenize and submit every generation; (choice, message) iterator and the model."""
        try:
            prepared = [await self.engine.prepare(request, None) for request in self.requests]
            model = self.engine.registry.text_model(self.requests[0].model)
        except Exception as exc:  # noqa: BLE001 - every failure becomes an OpenAI error
            raise self.error(exc) from None
        return merge([stream_generation(g, s) for g, s in prepared], self.body.n), model

    async def first_message(self, http: Request, messages):
        """The first (choice, message), or None: a stream's status line waits for it, so that errors before it get
        their own status. Raises ClientGone, or the failure as an OpenAI error."""
        try:
            return await cancel_on_disconnect(http, anext(messages, None))
        except ClientGone:
            raise
        except Exception as exc:  # noqa: BLE001
            await messages.aclose()
            raise self.error(exc) from None

    async def collect(self, http: Request, messages) -> None:
        """Every message into self.choices. Raises ClientGone, or the failure (a failed generation's too) as an
        OpenAI error."""

        async def read() -> None:
            async with contextlib.aclosing(messages):
                async for choice, message in messages:
                    self.choices.add(choice, message)

        try:
            await cancel_on_disconnect(http, read())
        except ClientGone:
            raise
        except Exception as exc:  # noqa: BLE001
            raise self.error(exc) from None
        errors = self.choices.errors()
        if errors:
            raise OpenAIError(500, errors[0], "server_error", None, "generation_error")

    async def respond(self, http: Request) -> Response:
        messages, model = await self.start()
        asked = self.requests[0]
        self.choices.ending_ids = frozenset(asked.stop_token_ids) | (
            frozenset() if asked.ignore_eos else frozenset(model.eos_token_ids)
        )
        kind = "chat.completion" if self.chat else "text_completion"
        try:
            if self.body.stream:
                first = await self.first_message(http, messages)
                head = envelope(kind + ".chunk" if self.chat else kind, request_id_var.get(), model.name,
                                model.fingerprint)  # fmt: skip
                return ClosingStreamingResponse(self.events(head, first, messages), media_type="text/event-stream")
            await self.collect(http, messages)
        except ClientGone:
            return Response(status_code=499)
        head = envelope(kind, request_id_var.get(), model.name, model.fingerprint)
        return JSONResponse({**head, "choices": self.choices.choice_bodies(), "usage": self.choices.usage()})

    async def events(self, head: dict, first, messages):
        """The SSE stream: role (chat) or echo chunks, deltas, each choice's finish, usage, [DONE]."""
        usage = {"usage": None} if self.include_usage else {}
        choices = self.choices
        try:
            for opening in choices.opening_deltas(len(self.requests) * self.body.n):
                yield sse({**head, "choices": [opening], **usage})
            item = first
            while item is not None:
                choice, message = item
                if message.HasField("delta"):
                    body = choices.delta_choice(choice, message.delta)
                    if body is not None:
                        yield sse({**head, "choices": [body], **usage})
                else:
                    choices.add(choice, message)
                    if message.done.finish_reason == gateway_pb2.ERROR:
                        error = OpenAIError(500, choices.errors()[0], "server_error", None, "generation_error")
                        yield sse(error.body())
                        break
                    yield sse({**head, "choices": [choices.final_choice(choice, message.done)], **usage})
                item = await anext(messages, None)
            else:
                if self.include_usage:
                    yield sse({**head, "choices": [], "usage": choices.usage()})
        except Exception as exc:  # noqa: BLE001 - the stream has started: the error goes in the stream
            yield sse(self.error(exc).body())
        finally:
            await messages.aclose()
        yield SSE_DONE

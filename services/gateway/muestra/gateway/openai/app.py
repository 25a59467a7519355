"""The OpenAI-compatible HTTP API: FastAPI routes over the gateway's own servicer (same schedulers, same checks)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.exceptions import HTTPException

from muestra.gateway.openai.a1111 import add_a1111
from muestra.gateway.openai.convert import chat_request, completion_requests
from muestra.gateway.openai.edge import Edge
from muestra.gateway.openai.errors import OpenAIError, from_muestra, from_validation, internal
from muestra.gateway.openai.images import respond_edits, respond_images
from muestra.gateway.openai.listings import add_listings
from muestra.gateway.openai.responses import Choices, envelope
from muestra.gateway.openai.schemas import ChatCompletionRequest, CompletionRequest, ImageGenerationRequest
from muestra.gateway.openai.streams import (
    SSE_DONE,
    ClientGone,
    ClosingStreamingResponse,
    cancel_on_disconnect,
    merge,
    sse,
)
from muestra.gateway.playground import mount_playground
from muestra.gateway.server import GatewayServicer, stream_generation
from muestra.runtime.errors import MuestraError
from muestra.runtime.logs import request_id_var
from muestra.v1 import gateway_pb2

log = logging.getLogger("muestra.gateway.openai")


class TextRun:
    """One completions or chat request on its way through the gateway."""

    def __init__(self, servicer: GatewayServicer, body, requests, renames: dict[str, str], chat: bool) -> None:
        self.servicer = servicer
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
            prepared = [await self.servicer.prepare(request, None) for request in self.requests]
            model = self.servicer.registry.text_model(self.requests[0].model)
        except Exception as exc:  # noqa: BLE001 - every failure becomes an OpenAI error
            raise self.error(exc) from None
        return merge([stream_generation(g, s) for g, s in prepared], self.body.n), model

    async def respond(self, http: Request) -> Response:
        messages, model = await self.start()
        asked = self.requests[0]
        self.choices.ending_ids = frozenset(asked.stop_token_ids) | (
            frozenset() if asked.ignore_eos else frozenset(model.eos_token_ids)
        )
        kind = "chat.completion" if self.chat else "text_completion"
        if self.body.stream:
            head = envelope(kind + ".chunk" if self.chat else kind, request_id_var.get(), model.name, model.fingerprint)
            try:  # the status line waits for the first token, so that errors before it get their own status
                first = await cancel_on_disconnect(http, anext(messages, None))
            except ClientGone:
                return Response(status_code=499)
            except Exception as exc:  # noqa: BLE001
                await messages.aclose()
                raise self.error(exc) from None
            return ClosingStreamingResponse(self.events(head, first, messages), media_type="text/event-stream")

        async def collect() -> None:
            async with contextlib.aclosing(messages):
                async for choice, message in messages:
                    self.choices.add(choice, message)

        try:
            await cancel_on_disconnect(http, collect())
        except ClientGone:
            return Response(status_code=499)
        except Exception as exc:  # noqa: BLE001
            raise self.error(exc) from None
        errors = self.choices.errors()
        if errors:
            raise OpenAIError(500, errors[0], "server_error", None, "generation_error")
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


def create_app(servicer: GatewayServicer, keys: list[str], max_body_bytes: int) -> Edge:
    """The ASGI app: the routes behind the Edge (API keys, body limit, request ids, logs, metrics)."""
    app = FastAPI(title="muestra", docs_url=None, redoc_url=None, openapi_url=None)
    started = int(time.time())

    @app.exception_handler(OpenAIError)
    async def openai_error(request: Request, exc: OpenAIError) -> JSONResponse:
        return JSONResponse(exc.body(), status_code=exc.status)

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        error = from_validation(list(exc.errors()))
        return JSONResponse(error.body(), status_code=error.status)

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException) -> JSONResponse:
        # FastAPI wraps what goes wrong while it reads the body (BodyTooLarge from the Edge) in a 400.
        if isinstance(exc.__cause__, OpenAIError):
            return JSONResponse(exc.__cause__.body(), status_code=exc.__cause__.status)
        error = OpenAIError(exc.status_code, f"{request.method} {request.url.path}: {exc.detail}", code=None)
        return JSONResponse(error.body(), status_code=exc.status_code)

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, http: Request) -> Response:
        requests, renames = completion_requests(body, servicer.config.max_n)
        return await TextRun(servicer, body, requests, renames, chat=False).respond(http)

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatCompletionRequest, http: Request) -> Response:
        request, renames = await asyncio.to_thread(chat_request, body)  # compiles the tools' schemas: off the loop
        run = TextRun(servicer, body, [request], renames, chat=True)
        run.choices.tool_calls = bool(body.tools) and body.tool_choice != "none"
        return await run.respond(http)

    @app.post("/v1/images/generations")
    async def images(body: ImageGenerationRequest, http: Request) -> Response:
        return await respond_images(servicer, body, http)

    @app.post("/v1/images/edits")
    async def image_edits(http: Request) -> Response:
        return await respond_edits(servicer, http)

    async def model_cards() -> list[dict]:
        listing = await servicer.ListModels(gateway_pb2.ListModelsRequest(), None)
        cards = []
        for m in listing.models:
            card = {"id": m.name, "object": "model", "created": started, "owned_by": "muestra", "kind": m.kind}
            if m.kind == "text":
                card.update(max_model_len=m.context_length, vocab_size=m.vocab_size, replicas=m.replicas)
            cards.append(card)
        return cards

    @app.get("/v1/models")
    async def models() -> dict:
        return {"object": "list", "data": await model_cards()}

    @app.get("/v1/models/{model:path}")
    async def model(model: str) -> dict:
        cards = await model_cards()
        for card in cards:
            if card["id"] == model:
                return card
        known = ", ".join(card["id"] for card in cards) or "none"
        raise OpenAIError(404, f"model: unknown model {model!r}; known: {known}", param="model", code="model_not_found")

    add_listings(app, servicer)
    add_a1111(app, servicer)
    mount_playground(app)

    @app.get("/health")
    async def health() -> Response:
        problem = servicer.watchdog.problem()
        if problem is not None:
            return JSONResponse({"status": "not serving", "reason": problem}, status_code=503)
        return JSONResponse({"status": "ok"})

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(generate_latest(), media_type=CONTENT_TYPE_LATEST)

    return Edge(app, keys, max_body_bytes)

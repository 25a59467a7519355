"""OpenAI's generation routes: POST /v1/completions, /v1/chat/completions, /v1/images/generations and /edits."""

from __future__ import annotations

import asyncio

from fastapi import APIRouter, Request
from fastapi.responses import Response

from muestra.gateway.http.openai.convert import chat_request, completion_requests
from muestra.gateway.http.openai.images import respond_edits, respond_images
from muestra.gateway.http.openai.schemas import ChatCompletionRequest, CompletionRequest, ImageGenerationRequest
from muestra.gateway.http.openai.text import TextRun
from muestra.gateway.http.state import EngineDep

router = APIRouter(prefix="/v1")


@router.post("/completions")
async def completions(body: CompletionRequest, http: Request, engine: EngineDep) -> Response:
    requests, renames = completion_requests(body, engine.config.max_n)
    return await TextRun(engine, body, requests, renames, chat=False).respond(http)


@router.post("/chat/completions")
async def chat_completions(body: ChatCompletionRequest, http: Request, engine: EngineDep) -> Response:
    request, renames = await asyncio.to_thread(chat_request, body)  # compiles the tools' schemas: off the loop
    run = TextRun(engine, body, [request], renames, chat=True)
    run.choices.tool_calls = bool(body.tools) and body.tool_choice != "none"
    return await run.respond(http)


@router.post("/images/generations")
async def images(body: ImageGenerationRequest, http: Request, engine: EngineDep) -> Response:
    return await respond_images(engine, body, http)


@router.post("/images/edits")
async def image_edits(http: Request, engine: EngineDep) -> Response:
    return await respond_edits(engine, http)

"""OpenAI's Responses API: POST /v1/responses (whole or streamed), GET and DELETE /v1/responses/{id}, and
GET /v1/responses/{id}/input_items.

A request runs as a chat completion of its whole conversation (the stored one of previous_response_id, then its
own input), so the prefix cache finds the past turns' KV (the lm's hot tier, or Redis) and only the new input is
prefilled. With `store` (the default) the response and its conversation are kept under the caller's API key.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time

from fastapi import APIRouter, Query, Request
from fastapi.responses import JSONResponse, Response
from pydantic import ValidationError

from muestra.gateway.http.errors import OpenAIError, from_validation
from muestra.gateway.http.openai.convert import chat_request
from muestra.gateway.http.openai.response_bodies import ResponsesRequest
from muestra.gateway.http.openai.response_items import (
    call_item,
    chat_messages,
    chat_response_format,
    chat_tool_choice,
    chat_tools,
    input_items,
    message_item,
    new_id,
    output_items,
    refuse_unserved,
    renamed,
    responses_param,
    text_format,
    usage,
)
from muestra.gateway.http.openai.response_store import owner_of
from muestra.gateway.http.openai.schemas import ChatCompletionRequest
from muestra.gateway.http.openai.text import TextRun
from muestra.gateway.http.state import EngineDep
from muestra.gateway.http.streams import ClientGone, ClosingStreamingResponse
from muestra.runtime.auth import bearer_value
from muestra.v1 import gateway_pb2

log = logging.getLogger("muestra.gateway.responses")
router = APIRouter(prefix="/v1")

# Fields that go to the chat path as they are (sampling, its extensions, routing).
_PASSED = {
    "model", "temperature", "top_p", "seed", "presence_penalty", "frequency_penalty", "logit_bias", "top_k", "min_p",
    "typical_p", "repetition_penalty", "samplers", "ignore_eos", "allow_special_tokens", "speculation", "stop",
    "stop_token_ids", "include_stop_str_in_output", "parallel_tool_calls", "prompt_cache_key", "user",
}  # fmt: skip


def _owner(http: Request) -> str:
    return owner_of(bearer_value(http.headers.get("authorization", "")))


def _not_found(response_id: str, param: str | None = None) -> OpenAIError:
    message = f"no stored response {response_id!r}: it was never stored (store false), was deleted, has expired, or " \
              "belongs to another API key"  # fmt: skip
    if param:
        message = f"{param}: {message}"
    return OpenAIError(404, message, "invalid_request_error", param, "not_found")


def _chat_body(body: ResponsesRequest, conversation: list[dict]) -> ChatCompletionRequest:
    chat = body.model_dump(include=_PASSED, exclude_unset=True, by_alias=True)
    if body.safety_identifier and "user" not in chat:
        chat["user"] = body.safety_identifier
    chat.update(
        messages=chat_messages(body.instructions, conversation),
        stream=body.stream,
        max_completion_tokens=body.max_output_tokens,
        tools=chat_tools(body.tools),
        tool_choice=chat_tool_choice(body.tool_choice),
        response_format=chat_response_format(body),
    )
    try:
        return ChatCompletionRequest.model_validate({k: v for k, v in chat.items() if v is not None})
    except ValidationError as exc:
        raise renamed(from_validation(list(exc.errors()))) from None


class ResponseRun:
    """One POST /v1/responses on its way through the gateway's chat path."""

    def __init__(self, engine, body: ResponsesRequest, store, owner: str) -> None:
        self.engine = engine
        self.body = body
        self.store = store
        self.owner = owner
        self.id = new_id("resp")
        self.created = int(time.time())
        self.model = body.model
        self.input: list[dict] = []

    async def prepare(self) -> TextRun:
        body = self.body
        refuse_unserved(body)
        history: list[dict] = []
        if body.previous_response_id:
            record = await self.store.get(self.owner, body.previous_response_id)
            if record is None:
                raise _not_found(body.previous_response_id, "previous_response_id")
            history = record["conversation"]
        self.input = [*history, *input_items(body, history)]
        chat = _chat_body(body, self.input)
        try:
            request, renames = await asyncio.to_thread(chat_request, chat)  # compiles the tools' schemas
        except OpenAIError as exc:
            raise renamed(exc) from None
        renames = {field: responses_param(param) for field, param in renames.items()}
        run = TextRun(self.engine, chat, [request], renames, chat=True)
        run.choices.tool_calls = bool(chat.tools) and chat.tool_choice != "none"
        return run

    def response(self, status: str, output: list[dict], run: TextRun | None = None) -> dict:
        """The response object, as the API returns it and stores it."""
        body = self.body
        done = run.choices.done.get(0) if run is not None else None
        incomplete = error = None
        if done is not None and done.finish_reason == gateway_pb2.LENGTH:
            incomplete = {"reason": "max_output_tokens"}
        if done is not None and done.finish_reason == gateway_pb2.ERROR:
            error = {"code": "server_error", "message": done.error or "generation failed"}
        return {
            "id": self.id, "object": "response", "created_at": self.created, "status": status,
            "background": False, "error": error, "incomplete_details": incomplete,
            "instructions": body.instructions, "max_output_tokens": body.max_output_tokens, "max_tool_calls": None,
            "model": self.model, "output": output, "parallel_tool_calls": body.parallel_tool_calls is not False,
            "previous_response_id": body.previous_response_id, "prompt_cache_key": body.prompt_cache_key,
            "reasoning": {"effort": None, "summary": None}, "safety_identifier": body.safety_identifier,
            "service_tier": "default", "store": body.store, "temperature": body.temperature,
            "text": text_format(body), "tool_choice": body.tool_choice or "auto", "tools": body.tools or [],
            "top_logprobs": 0, "top_p": body.top_p, "truncation": "disabled",
            "usage": usage(run.choices.usage()) if done is not None else None,
            "user": body.user, "metadata": body.metadata or {},
        }  # fmt: skip

    @staticmethod
    def status(run: TextRun) -> str:
        done = run.choices.done[0]
        if done.finish_reason == gateway_pb2.ERROR:
            return "failed"
        return "incomplete" if done.finish_reason in (gateway_pb2.LENGTH, gateway_pb2.CANCELLED) else "completed"

    async def keep(self, response: dict) -> None:
        """Store the response and its conversation (its input, then its output) under the caller's key."""
        if not self.body.store:
            return
        record = {"response": response, "input": self.input, "conversation": [*self.input, *response["output"]]}
        await self.store.put(self.owner, self.id, record)
        log.info("stored response %s (%d conversation items)", self.id, len(record["conversation"]))

    async def respond(self, http: Request) -> Response:
        run = await self.prepare()
        messages, model = await run.start()
        self.model = model.name
        run.choices.ending_ids = frozenset(model.eos_token_ids) if not run.requests[0].ignore_eos else frozenset()
        try:
            if self.body.stream:
                first = await run.first_message(http, messages)
                return ClosingStreamingResponse(self.events(run, first, messages), media_type="text/event-stream")
            await run.collect(http, messages)
        except ClientGone:
            return Response(status_code=499)
        except OpenAIError as exc:
            raise renamed(exc) from None
        message = run.choices.choice_bodies()[0]["message"]
        response = self.response(self.status(run), output_items(message), run)
        await self.keep(response)
        return JSONResponse(response)

    async def events(self, run: TextRun, first, messages):
        """The SSE stream: created, in_progress, each output item's events, completed (or incomplete / failed)."""
        stream = EventStream()
        choices = run.choices
        yield stream.event("response.created", response=self.response("in_progress", []))
        yield stream.event("response.in_progress", response=self.response("in_progress", []))
        try:
            item = first
            while item is not None:
                _, message = item
                if message.HasField("delta"):
                    body = choices.delta_choice(0, message.delta)
                    if body is not None:
                        for event in stream.delta(body["delta"]):
                            yield event
                else:
                    choices.add(0, message)
                    if message.done.finish_reason != gateway_pb2.ERROR:
                        for event in stream.delta(choices.final_choice(0, message.done).get("delta") or {}):
                            yield event
                    break
                item = await anext(messages, None)
            for event in stream.close():
                yield event
            if 0 not in choices.done:  # the generation ended without its last message: a gateway shutting down
                raise OpenAIError(503, "the gateway stopped before the response ended", "server_error", None,
                                  "unavailable")  # fmt: skip
            status = self.status(run)
            response = self.response(status, stream.items, run)
            if status != "failed":
                await self.keep(response)
            yield stream.event(f"response.{status}", response=response)
        except Exception as exc:  # noqa: BLE001 - the stream has started: the error goes in the stream
            error = renamed(run.error(exc))
            yield stream.event("error", code=error.code, message=error.message, param=error.param)
            failed = self.response("failed", stream.items)
            failed["error"] = {"code": error.code or "server_error", "message": error.message}
            yield stream.event("response.failed", response=failed)
        finally:
            await messages.aclose()


class EventStream:
    """Chat deltas as the Responses API's output-item events, numbered in order."""

    def __init__(self) -> None:
        self.sequence = 0
        self.items: list[dict] = []
        self.text_at: int | None = None  # the open message item's index
        self.call_at: int | None = None  # the open function call item's index
        self.calls: dict[int, int] = {}  # the chat delta's tool call index -> output index

    def event(self, kind: str, **fields) -> str:
        payload = {"type": kind, "sequence_number": self.sequence, **fields}
        self.sequence += 1
        return f"event: {kind}\ndata: {json.dumps(payload, ensure_ascii=False, separators=(',', ':'))}\n\n"

    def delta(self, delta: dict) -> list[str]:
        events = []
        if delta.get("content"):
            if self.text_at is None:
                events += self._close_call()
                self.text_at = len(self.items)
                item = message_item(new_id("msg"), "", "in_progress")
                part = item["content"].pop()
                self.items.append(item)
                events.append(self.event("response.output_item.added", output_index=self.text_at, item=item))
                events.append(self.event(
                    "response.content_part.added", item_id=item["id"], output_index=self.text_at, content_index=0,
                    part=part,
                ))  # fmt: skip
                item["content"].append(part)
            item = self.items[self.text_at]
            item["content"][0]["text"] += delta["content"]
            events.append(self.event(
                "response.output_text.delta", item_id=item["id"], output_index=self.text_at, content_index=0,
                delta=delta["content"], logprobs=[],
            ))  # fmt: skip
        for call in delta.get("tool_calls") or ():
            if call["index"] not in self.calls:
                events += self._close_text() + self._close_call()
                function = call["function"]
                self.call_at = self.calls[call["index"]] = len(self.items)
                item = call_item(new_id("fc"), call["id"], function["name"], "", "in_progress")
                self.items.append(item)
                events.append(self.event("response.output_item.added", output_index=self.call_at, item=dict(item)))
                arguments = function.get("arguments", "")
            else:
                arguments = call["function"].get("arguments", "")
            at = self.calls[call["index"]]
            if arguments:
                self.items[at]["arguments"] += arguments
                events.append(self.event(
                    "response.function_call_arguments.delta", item_id=self.items[at]["id"], output_index=at,
                    delta=arguments,
                ))  # fmt: skip
        return events

    def _close_text(self) -> list[str]:
        if self.text_at is None:
            return []
        at, self.text_at = self.text_at, None
        item = self.items[at]
        item["status"] = "completed"
        part = item["content"][0]
        return [
            self.event("response.output_text.done", item_id=item["id"], output_index=at, content_index=0,
                       text=part["text"], logprobs=[]),
            self.event("response.content_part.done", item_id=item["id"], output_index=at, content_index=0, part=part),
            self.event("response.output_item.done", output_index=at, item=item),
        ]  # fmt: skip

    def _close_call(self) -> list[str]:
        if self.call_at is None:
            return []
        at, self.call_at = self.call_at, None
        item = self.items[at]
        item["status"] = "completed"
        return [
            self.event("response.function_call_arguments.done", item_id=item["id"], output_index=at,
                       name=item["name"], arguments=item["arguments"]),
            self.event("response.output_item.done", output_index=at, item=item),
        ]  # fmt: skip

    def close(self) -> list[str]:
        return self._close_text() + self._close_call()


@router.post("/responses")
async def create_response(body: ResponsesRequest, http: Request, engine: EngineDep) -> Response:
    return await ResponseRun(engine, body, http.app.state.response_store, _owner(http)).respond(http)


@router.get("/responses/{response_id}")
async def retrieve_response(response_id: str, http: Request) -> Response:
    record = await http.app.state.response_store.get(_owner(http), response_id)
    if record is None:
        raise _not_found(response_id)
    return JSONResponse(record["response"])


@router.delete("/responses/{response_id}")
async def delete_response(response_id: str, http: Request) -> Response:
    if not await http.app.state.response_store.delete(_owner(http), response_id):
        raise _not_found(response_id)
    return JSONResponse({"id": response_id, "object": "response.deleted", "deleted": True})


@router.get("/responses/{response_id}/input_items")
async def list_input_items(
    response_id: str,
    http: Request,
    limit: int = Query(20, ge=1, le=100),
    order: str = Query("desc", pattern="^(asc|desc)$"),
    after: str | None = Query(None, max_length=128),
    before: str | None = Query(None, max_length=128),
) -> Response:
    """The items the model read for this response: its stored conversation before it, then its own input."""
    record = await http.app.state.response_store.get(_owner(http), response_id)
    if record is None:
        raise _not_found(response_id)
    items = record["input"] if order == "asc" else record["input"][::-1]
    ids = [item["id"] for item in items]
    for name, cursor in (("after", after), ("before", before)):
        if cursor is not None and cursor not in ids:
            raise OpenAIError(400, f"{name}: no input item {cursor!r} in this response", "invalid_request_error", name,
                              "invalid_value")  # fmt: skip
    start = ids.index(after) + 1 if after is not None else 0
    end = ids.index(before) if before is not None else len(items)
    page = items[start:end][:limit]
    return JSONResponse({
        "object": "list", "data": page, "first_id": page[0]["id"] if page else None,
        "last_id": page[-1]["id"] if page else None, "has_more": start + len(page) < end,
    })  # fmt: skip

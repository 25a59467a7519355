"""Plumbing between HTTP requests and generations: merging several generations, noticing a client leave."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable
from typing import TypeVar

from starlette.requests import Request
from starlette.responses import StreamingResponse

from muestra.v1 import gateway_pb2

T = TypeVar("T")
_END = object()


class ClientGone(Exception):
    """The HTTP client disconnected before the answer was ready."""


def sse(payload: dict) -> str:
    """One server-sent event carrying a JSON object."""
    return f"data: {json.dumps(payload, ensure_ascii=False, separators=(',', ':'))}\n\n"


SSE_DONE = "data: [DONE]\n\n"


class ClosingStreamingResponse(StreamingResponse):
    """Closes its body iterator however the response ends.

    When the client goes away Starlette cancels the send, leaving the iterator suspended at a yield;
    closing it runs its `finally`, which cancels the generation (its lm rows go at the next step).
    """

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self.body_iterator.aclose()


async def merge(
    streams: list[AsyncIterator[gateway_pb2.GenerateResponse]], n: int
) -> AsyncIterator[tuple[int, gateway_pb2.GenerateResponse]]:
    """(choice, message) from every generation as it comes; message.index i of stream k is choice k * n + i.

    Closing this iterator early closes every stream, which cancels their generations.
    """
    if len(streams) == 1:
        stream = streams[0]
        try:
            async for message in stream:
                yield message.index, message
        finally:
            await stream.aclose()
        return
    queue: asyncio.Queue = asyncio.Queue()

    async def pump(k: int, stream) -> None:
        try:
            async for message in stream:
                queue.put_nowait((k * n + message.index, message))
            queue.put_nowait((k, _END))
        except Exception as exc:  # noqa: BLE001 - handed to the reader, which raises it
            queue.put_nowait((k, exc))

    tasks = [asyncio.ensure_future(pump(k, stream)) for k, stream in enumerate(streams)]
    try:
        running = len(tasks)
        while running:
            choice, item = await queue.get()
            if item is _END:
                running -= 1
            elif isinstance(item, Exception):
                raise item
            else:
                yield choice, item
    finally:
        # Cancelling a pump cancels its stream (stream_generation marks the generation cancelled);
        # nothing here awaits, so this also runs inside a cancelled request.
        for task in tasks:
            task.cancel()


async def _disconnected(request: Request) -> None:
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


async def cancel_on_disconnect(request: Request, work: Awaitable[T]) -> T:
    """Await `work`; if the client disconnects first, cancel it and raise ClientGone."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
        if not task.done():
            task.cancel()
    if task.cancelled() or not task.done():
        raise ClientGone()
    return task.result()

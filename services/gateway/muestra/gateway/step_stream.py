"""A long-lived bidirectional stream for a call made once per decode step (one request, one reply).

A unary call per step pays for setting up an HTTP/2 stream, its metadata and the server's
interceptors every time: about 0.5 ms of round trip and 0.55 ms of CPU on both ends together
here, against 0.2 ms and 0.26 ms for a message on an open stream. The stream is opened on first
use and reopened after it breaks: a stream found ended before a step is sent (the server went
away while it was idle) is replaced first. A step that breaks a reused stream is sent once more on
a fresh one only when the step is stateless on the server (DetokenizeStep, not Decode).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import grpc

log = logging.getLogger("muestra.gateway.step_stream")

# Statuses that end a stream because of the request itself: retrying cannot help.
_REQUEST_ERRORS = (
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
    grpc.StatusCode.FAILED_PRECONDITION,
    grpc.StatusCode.OUT_OF_RANGE,
)


class StreamEnded(Exception):
    """The server closed the stream without an error status before answering."""


_BROKEN = (grpc.aio.AioRpcError, asyncio.InvalidStateError, StreamEnded)


class StepStream:
    """step(request) -> reply over one stream of `open_stream()` (a stream-stream multicallable).

    Failures are raised as grpc.aio.AioRpcError (a stream that ended early as UNAVAILABLE).
    """

    def __init__(self, open_stream: Callable[[], grpc.aio.StreamStreamCall], what: str, retry: bool = True) -> None:
        self._open_stream = open_stream
        self.what = what
        # Whether a step that broke a reused stream may be sent again (only for stateless steps).
        self.retry = retry
        self._call: grpc.aio.StreamStreamCall | None = None

    async def step(self, request):
        if self._call is not None and self._call.done():
            self.close()  # it ended while idle (the server went away): open a new one
        fresh = self._call is None
        try:
            return await self._exchange(request)
        except _BROKEN as exc:
            self.close()
            if fresh or not self.retry or (isinstance(exc, grpc.aio.AioRpcError) and exc.code() in _REQUEST_ERRORS):
                raise _as_rpc_error(exc) from exc
            log.info("%s stream broke (%s); retrying the step on a new stream", self.what, exc)
        try:
            return await self._exchange(request)
        except _BROKEN as exc:
            self.close()
            raise _as_rpc_error(exc) from exc

    async def _exchange(self, request):
        if self._call is None:
            self._call = self._open_stream()
        call = self._call
        await call.write(request)
        reply = await call.read()
        if reply is grpc.aio.EOF:
            self.close()
            raise StreamEnded(f"the {self.what} stream ended before answering")
        return reply

    def close(self) -> None:
        if self._call is not None:
            self._call.cancel()
            self._call = None


def _as_rpc_error(exc: BaseException) -> grpc.aio.AioRpcError:
    """Callers handle one kind of failure: a stream that ended or was closed reads as UNAVAILABLE."""
    if isinstance(exc, grpc.aio.AioRpcError):
        return exc
    return grpc.aio.AioRpcError(grpc.StatusCode.UNAVAILABLE, grpc.aio.Metadata(), grpc.aio.Metadata(), str(exc))

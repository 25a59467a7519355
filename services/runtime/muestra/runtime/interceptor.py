"""The one place where exceptions become gRPC statuses, and every request is logged and counted."""

from __future__ import annotations

import asyncio
import inspect
import logging
import time

import grpc
from google.protobuf.message import DecodeError
from prometheus_client import Counter, Histogram

from muestra.runtime.errors import InvalidArgument, MuestraError
from muestra.runtime.logs import REQUEST_ID_HEADER, new_request_id, request_id_from_metadata, request_id_var

log = logging.getLogger("muestra.requests")

REQUESTS = Counter("muestra_grpc_requests_total", "gRPC requests handled", ["method", "code"])
LATENCY = Histogram(
    "muestra_grpc_request_duration_seconds",
    "Time from a gRPC request's arrival to its last response message",
    ["method"],
    buckets=(0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60, 300),
)
# Logged at DEBUG: probes, and the calls a gateway makes once per decode step (one line per
# token would drown the log; the requests they serve are logged by the gateway). All are counted.
_QUIET_PREFIXES = (
    "/grpc.health.",
    "/grpc.reflection.",
    "/muestra.v1.LanguageModel/Decode",
    "/muestra.v1.LanguageModel/BatchSteps",
    "/muestra.v1.LanguageModel/Filter",
    "/muestra.v1.Tokenizer/DetokenizeStep",
    "/muestra.v1.Tokenizer/DetokenizeSteps",
)


class _Call:
    """Bookkeeping for one request: its id, its outcome, its log line."""

    def __init__(self, method: str, context: grpc.aio.ServicerContext) -> None:
        self.method = method
        self.context = context
        self.started = time.perf_counter()
        self.request_id = request_id_from_metadata(context.invocation_metadata()) or new_request_id()
        self.token = request_id_var.set(self.request_id)
        self.code = grpc.StatusCode.OK
        # Read now: asking a cancelled stream's context for its peer after the call ended
        # crashes grpc.aio (a segfault when the handler is finalized).
        self.peer = context.peer()
        context.set_trailing_metadata(((REQUEST_ID_HEADER, self.request_id),))

    async def fail(self, exc: BaseException) -> None:
        """Record `exc` and abort the call with the status it maps to (always raises)."""
        if isinstance(exc, asyncio.CancelledError):
            self.code = grpc.StatusCode.CANCELLED
            raise exc
        if isinstance(exc, grpc.aio.AbortError):
            self.code = self.context.code() or grpc.StatusCode.UNKNOWN
            raise exc
        if isinstance(exc, DecodeError):  # a message of a request stream that does not parse
            exc = malformed(exc)
        if isinstance(exc, MuestraError):
            self.code = exc.code
            await self._abort(exc.code, _short(str(exc)))
        self.code = grpc.StatusCode.INTERNAL
        log.exception("internal error in %s", self.method)
        await self._abort(
            grpc.StatusCode.INTERNAL,
            f"internal error in {self.method} (request id {self.request_id}); the service log has the details",
        )

    async def _abort(self, code: grpc.StatusCode, message: str) -> None:
        """End the call with this status; when the call is over already (its deadline passed, its client left),
        no status can be sent, and the handler ends as a cancelled one (grpc would log the failed send)."""
        remaining = self.context.time_remaining()
        over = self.context.cancelled() or (remaining is not None and remaining <= 0)
        if not over:
            try:
                await self.context.abort(code, message)
            except grpc.aio.AbortError:
                raise
            except Exception:  # the send failed: the call ended meanwhile
                remaining = self.context.time_remaining()
                if not (self.context.cancelled() or (remaining is not None and remaining <= 0)):
                    raise
        if self.code not in (grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED):
            self.code = grpc.StatusCode.CANCELLED
        raise asyncio.CancelledError()

    def finish(self) -> None:
        elapsed = time.perf_counter() - self.started
        code = self.code
        if code == grpc.StatusCode.OK and not self.context.cancelled():
            code = self.context.code() or grpc.StatusCode.OK
        code_name = code.name if isinstance(code, grpc.StatusCode) else str(code)
        REQUESTS.labels(self.method, code_name).inc()
        LATENCY.labels(self.method).observe(elapsed)
        level = logging.DEBUG if self.method.startswith(_QUIET_PREFIXES) else logging.INFO
        log.log(level, "%s %s %.1fms peer=%s", self.method, code_name, elapsed * 1000, self.peer)
        try:
            request_id_var.reset(self.token)
        except ValueError:
            # grpc closes a stream handler that its client cancelled from another task (another
            # context), where this request's id was never set: there is nothing to restore.
            pass


# A status message travels in a header that grpc caps at 16 KiB: a message that echoes a huge field
# would reach the client as RESOURCE_EXHAUSTED "Stream removed" instead of the status meant.
MAX_STATUS_MESSAGE = 2000


def _short(message: str) -> str:
    if len(message) <= MAX_STATUS_MESSAGE:
        return message
    return f"{message[: MAX_STATUS_MESSAGE - 40]}… ({len(message)} characters in all)"


class Malformed:
    """What a unary request's bytes became when they do not parse as its message type."""

    def __init__(self, error: Exception) -> None:
        self.error = error


def malformed(error: Exception) -> InvalidArgument:
    # upb's message names the type and the reason, e.g. "Error parsing message with type
    # 'muestra.v1.EncodeRequest': String field had bad UTF-8"
    return InvalidArgument("request", f"not a valid protobuf message ({error})")


def _tolerant(deserializer):
    """grpc answers bytes its deserializer cannot parse with UNKNOWN before any handler runs: parse here."""
    if deserializer is None:
        return None

    def parse(data: bytes):
        try:
            return deserializer(data)
        except Exception as exc:  # noqa: BLE001 - DecodeError, and whatever else bad bytes raise
            return Malformed(exc)

    return parse


def _check_parsed(request) -> None:
    if isinstance(request, Malformed):
        raise malformed(request.error)


def _wrap_coroutine(behavior, method: str):
    """A handler that returns its response, or a streaming one that writes with context.write (Health/Watch)."""

    async def handler(request_or_iterator, context):
        call = _Call(method, context)
        try:
            _check_parsed(request_or_iterator)
            return await behavior(request_or_iterator, context)
        except BaseException as exc:  # noqa: BLE001 - every failure is mapped to a status
            await call.fail(exc)
        finally:
            call.finish()

    return handler


def _wrap_stream_response(behavior, method: str):
    async def handler(request_or_iterator, context):
        call = _Call(method, context)
        try:
            _check_parsed(request_or_iterator)
            async for response in behavior(request_or_iterator, context):
                yield response
        except BaseException as exc:
            if isinstance(exc, GeneratorExit):
                call.code = grpc.StatusCode.CANCELLED
                raise
            await call.fail(exc)
        finally:
            call.finish()

    return handler


def _wrap_streaming(behavior, method: str):
    """grpc runs an async generator's yields and a coroutine's context.write calls: keep the handler's kind."""
    if inspect.isasyncgenfunction(behavior):
        return _wrap_stream_response(behavior, method)
    return _wrap_coroutine(behavior, method)


class ErrorMappingInterceptor(grpc.aio.ServerInterceptor):
    """Maps exceptions to statuses, sets the request id, logs and counts every request."""

    async def intercept_service(self, continuation, handler_call_details):
        handler = await continuation(handler_call_details)
        if handler is None:
            return None
        method = handler_call_details.method
        # A request stream's messages are parsed as they are read; one that does not parse raises
        # DecodeError in the handler, which fail() maps to INVALID_ARGUMENT.
        deserializer = handler.request_deserializer
        kwargs = dict(
            request_deserializer=deserializer if handler.request_streaming else _tolerant(deserializer),
            response_serializer=handler.response_serializer,
        )
        if handler.unary_unary:
            return grpc.unary_unary_rpc_method_handler(_wrap_coroutine(handler.unary_unary, method), **kwargs)
        if handler.stream_unary:
            return grpc.stream_unary_rpc_method_handler(_wrap_coroutine(handler.stream_unary, method), **kwargs)
        if handler.unary_stream:
            return grpc.unary_stream_rpc_method_handler(_wrap_streaming(handler.unary_stream, method), **kwargs)
        return grpc.stream_stream_rpc_method_handler(_wrap_streaming(handler.stream_stream, method), **kwargs)

"""Client channels between services: they carry the current request id, and the internal token, in metadata."""

from __future__ import annotations

import asyncio

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from muestra.runtime.logs import REQUEST_ID_HEADER, request_id_var


def _with_metadata(details: grpc.aio.ClientCallDetails, token: str) -> grpc.aio.ClientCallDetails:
    request_id = request_id_var.get()
    pairs = list(details.metadata or ())
    added = False
    if request_id != "-" and not any(key == REQUEST_ID_HEADER for key, _ in pairs):
        pairs.append((REQUEST_ID_HEADER, request_id))
        added = True
    if token and not any(key == "authorization" for key, _ in pairs):
        pairs.append(("authorization", f"Bearer {token}"))
        added = True
    return details._replace(metadata=grpc.aio.Metadata(*pairs)) if added else details


class _AddMetadata:
    """Sends the request id and the internal token with every call of its kind."""

    def __init__(self, token: str) -> None:
        self.token = token

    async def _intercept(self, continuation, details, request_or_iterator):
        return await continuation(_with_metadata(details, self.token), request_or_iterator)


class _UnaryUnary(_AddMetadata, grpc.aio.UnaryUnaryClientInterceptor):
    intercept_unary_unary = _AddMetadata._intercept


class _UnaryStream(_AddMetadata, grpc.aio.UnaryStreamClientInterceptor):
    intercept_unary_stream = _AddMetadata._intercept


class _StreamUnary(_AddMetadata, grpc.aio.StreamUnaryClientInterceptor):
    intercept_stream_unary = _AddMetadata._intercept


class _StreamStream(_AddMetadata, grpc.aio.StreamStreamClientInterceptor):
    intercept_stream_stream = _AddMetadata._intercept


def metadata_interceptors(token: str = "") -> list:
    """One interceptor per call kind: grpc.aio files each interceptor under the first kind it implements."""
    return [_UnaryUnary(token), _UnaryStream(token), _StreamUnary(token), _StreamStream(token)]


def channel_options(max_message_bytes: int = 64 * 1024 * 1024) -> list[tuple[str, int]]:
    return [
        ("grpc.max_send_message_length", max_message_bytes),
        ("grpc.max_receive_message_length", max_message_bytes),
    ]


# grpc's reconnect backoff grows to 2 minutes while a peer is down, so a restarted replica could wait
# that long to be found again: between services, a reconnect is tried at least every 2 s.
RECONNECT_OPTIONS = [
    ("grpc.initial_reconnect_backoff_ms", 250),
    ("grpc.max_reconnect_backoff_ms", 2000),
]


def service_channel(target: str, max_message_bytes: int = 64 * 1024 * 1024, token: str = "") -> grpc.aio.Channel:
    """An insecure asyncio channel to another muestra service that forwards the request id (and sends
    `token`, the internal token, when one is configured)."""
    return grpc.aio.insecure_channel(
        target,
        options=[*channel_options(max_message_bytes), *RECONNECT_OPTIONS],
        interceptors=metadata_interceptors(token),
    )


async def wait_until_serving(target: str, timeout_s: float = 30.0, service: str = "") -> None:
    """Poll the standard health service at `target` until it reports SERVING."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    async with grpc.aio.insecure_channel(target) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        while True:
            try:
                reply = await stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=1.0)
                if reply.status == health_pb2.HealthCheckResponse.SERVING:
                    return
            except grpc.aio.AioRpcError:
                pass
            if asyncio.get_running_loop().time() > deadline:
                raise TimeoutError(f"{target} did not report SERVING within {timeout_s:.0f}s")
            await asyncio.sleep(0.1)

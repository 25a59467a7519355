"""Client channels between services: they carry the current request id in metadata."""

from __future__ import annotations

import asyncio

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from muestra.runtime.logs import REQUEST_ID_HEADER, request_id_var


def _with_request_id(details: grpc.aio.ClientCallDetails) -> grpc.aio.ClientCallDetails:
    request_id = request_id_var.get()
    pairs = list(details.metadata or ())
    if request_id == "-" or any(key == REQUEST_ID_HEADER for key, _ in pairs):
        return details
    pairs.append((REQUEST_ID_HEADER, request_id))
    return details._replace(metadata=grpc.aio.Metadata(*pairs))


class _RequestIdInterceptor(
    grpc.aio.UnaryUnaryClientInterceptor,
    grpc.aio.UnaryStreamClientInterceptor,
    grpc.aio.StreamUnaryClientInterceptor,
    grpc.aio.StreamStreamClientInterceptor,
):
    async def intercept_unary_unary(self, continuation, details, request):
        return await continuation(_with_request_id(details), request)

    async def intercept_unary_stream(self, continuation, details, request):
        return await continuation(_with_request_id(details), request)

    async def intercept_stream_unary(self, continuation, details, request_iterator):
        return await continuation(_with_request_id(details), request_iterator)

    async def intercept_stream_stream(self, continuation, details, request_iterator):
        return await continuation(_with_request_id(details), request_iterator)


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


def service_channel(target: str, max_message_bytes: int = 64 * 1024 * 1024) -> grpc.aio.Channel:
    """An insecure asyncio channel to another muestra service that forwards the request id."""
    return grpc.aio.insecure_channel(
        target,
        options=[*channel_options(max_message_bytes), *RECONNECT_OPTIONS],
        interceptors=[_RequestIdInterceptor()],
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

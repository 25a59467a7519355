"""Every exception becomes a gRPC status in one place, with the request id carried along."""

from __future__ import annotations

import asyncio

import grpc
import pytest
from grpc_health.v1 import health_pb2

from muestra.runtime.errors import InvalidArgument, ResourceExhausted
from muestra.runtime.interceptor import ErrorMappingInterceptor
from muestra.runtime.logs import REQUEST_ID_HEADER, request_id_var


async def _ok(request, context):
    return b"echo:" + request + b":" + request_id_var.get().encode()


async def _invalid(request, context):
    raise InvalidArgument("top_p", "must be in (0, 1], got 1.5")


async def _echo_huge(request, context):
    raise InvalidArgument("model", f"unknown model {'x' * 1_000_000!r}")


async def _parse_me(request, context):
    return request.SerializeToString()


async def _crash(request, context):
    raise RuntimeError("secret internal detail")


async def _stream_then_fail(request, context):
    yield b"first"
    raise ResourceExhausted("queue is full (limit 4)")


def _server() -> grpc.aio.Server:
    server = grpc.aio.server(interceptors=[ErrorMappingInterceptor()])
    handlers = {
        "Ok": grpc.unary_unary_rpc_method_handler(_ok),
        "Invalid": grpc.unary_unary_rpc_method_handler(_invalid),
        "Crash": grpc.unary_unary_rpc_method_handler(_crash),
        "Huge": grpc.unary_unary_rpc_method_handler(_echo_huge),
        "Parse": grpc.unary_unary_rpc_method_handler(
            _parse_me, request_deserializer=health_pb2.HealthCheckRequest.FromString
        ),
        "Stream": grpc.unary_stream_rpc_method_handler(_stream_then_fail),
    }
    server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler("test.Example", handlers)])
    return server


@pytest.fixture
def call():
    """Run one RPC against a fresh in-process server; returns (result or error, trailing metadata)."""

    def run(method: str, payload: bytes = b"x", metadata=(), stream: bool = False):
        async def go():
            server = _server()
            port = server.add_insecure_port("127.0.0.1:0")
            await server.start()
            try:
                async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
                    if stream:
                        rpc = channel.unary_stream(f"/test.Example/{method}")(payload, metadata=metadata)
                        items = []
                        try:
                            async for item in rpc:
                                items.append(item)
                        except grpc.aio.AioRpcError as exc:
                            return items, exc
                        return items, None
                    rpc = channel.unary_unary(f"/test.Example/{method}")(payload, metadata=metadata)
                    try:
                        return await rpc, await rpc.trailing_metadata()
                    except grpc.aio.AioRpcError as exc:
                        return exc, exc.trailing_metadata()
            finally:
                await server.stop(None)

        return asyncio.run(go())

    return run


def test_muestra_error_maps_to_its_status_with_the_field_named(call):
    error, _ = call("Invalid")
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error.details() == "top_p: must be in (0, 1], got 1.5"


def test_unexpected_exception_is_internal_without_a_stack_trace(call):
    error, _ = call("Crash", metadata=((REQUEST_ID_HEADER, "req-42"),))
    assert error.code() == grpc.StatusCode.INTERNAL
    assert "secret internal detail" not in error.details()
    assert "Traceback" not in error.details()
    assert "req-42" in error.details()


def test_request_id_from_metadata_is_used_and_returned(call):
    reply, trailing = call("Ok", b"hi", metadata=((REQUEST_ID_HEADER, "abc123"),))
    assert reply == b"echo:hi:abc123"
    assert dict(trailing)[REQUEST_ID_HEADER] == "abc123"


def test_a_request_without_an_id_gets_a_fresh_one(call):
    reply, trailing = call("Ok", b"hi")
    generated = dict(trailing)[REQUEST_ID_HEADER]
    assert len(generated) == 16 and reply.endswith(generated.encode())


def test_error_in_a_stream_ends_it_with_the_mapped_status(call):
    items, error = call("Stream", stream=True)
    assert items == [b"first"]
    assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "limit 4" in error.details()


def test_a_status_message_that_echoes_a_huge_field_is_cut_to_fit_its_header(call):
    # Uncut, grpc drops it (16 KiB header limit) and the client sees RESOURCE_EXHAUSTED "Stream removed".
    error, _ = call("Huge")
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error.details().startswith("model: unknown model 'xxx")
    assert error.details().endswith("(1000023 characters in all)") and len(error.details()) < 2100


def test_request_bytes_that_do_not_parse_are_invalid_argument(call):
    # grpc itself would answer UNKNOWN "Exception deserializing request!" before any handler ran.
    error, _ = call("Parse", b"\x0a\x02\xff\xfe")  # field 1 (service, a string): invalid UTF-8
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error.details().startswith("request: not a valid protobuf message")
    reply, _ = call("Parse", health_pb2.HealthCheckRequest(service="lm").SerializeToString())
    assert health_pb2.HealthCheckRequest.FromString(reply).service == "lm"

"""API keys: when configured, every gateway RPC except health needs `authorization: Bearer <key>`."""

from __future__ import annotations

import hmac

import grpc

from muestra.runtime.errors import Unauthenticated

_OPEN_PREFIXES = ("/grpc.health.v1.Health/",)


def _reject(message: str):
    async def handler(request, context):
        raise Unauthenticated(message)

    return handler


def key_is_valid(presented: str, keys: list[str]) -> bool:
    """Constant-time comparison against every configured key (keys are never logged)."""
    return any(hmac.compare_digest(presented.encode(), key.encode()) for key in keys)


def bearer_token(metadata) -> str | None:
    for key, value in metadata or ():
        if key == "authorization" and isinstance(value, str) and value.startswith("Bearer "):
            return value[len("Bearer ") :].strip()
    return None


class ApiKeyInterceptor(grpc.aio.ServerInterceptor):
    def __init__(self, keys: list[str]) -> None:
        self.keys = [k for k in keys if k]

    async def intercept_service(self, continuation, handler_call_details):
        handler = await continuation(handler_call_details)
        if handler is None or not self.keys or handler_call_details.method.startswith(_OPEN_PREFIXES):
            return handler
        token = bearer_token(handler_call_details.invocation_metadata)
        if token is not None and key_is_valid(token, self.keys):
            return handler
        message = "missing API key: send metadata 'authorization: Bearer <key>'" if token is None else "invalid API key"
        kwargs = dict(
            request_deserializer=handler.request_deserializer, response_serializer=handler.response_serializer
        )
        if handler.unary_stream:

            async def reject_stream(request, context):
                raise Unauthenticated(message)
                yield  # pragma: no cover - makes this an async generator

            return grpc.unary_stream_rpc_method_handler(reject_stream, **kwargs)
        return grpc.unary_unary_rpc_method_handler(_reject(message), **kwargs)

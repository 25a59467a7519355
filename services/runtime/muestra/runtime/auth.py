"""Bearer tokens on gRPC calls and HTTP requests: the gateway's API keys, and the internal token.

The gateway asks its callers for an API key; the tokenizer, lm and diffusion services ask theirs (the
gateway) for the internal token, a secret shared inside the deployment. Health checks need neither.
Tokens are compared in constant time and never logged.
"""

from __future__ import annotations

import hmac

import grpc

from muestra.runtime.errors import Unauthenticated

OPEN_PREFIXES = ("/grpc.health.v1.Health/",)


def token_is_valid(presented: str, tokens: list[str]) -> bool:
    """Constant-time comparison against every configured token."""
    return any(hmac.compare_digest(presented.encode(), token.encode()) for token in tokens)


def bearer_value(header: str) -> str | None:
    """The credentials of an `Authorization: Bearer <token>` value (the scheme is case-insensitive, RFC 6750)."""
    scheme, _, credentials = header.strip().partition(" ")
    if scheme.lower() != "bearer":
        return None
    return credentials.strip()


def bearer_token(metadata) -> str | None:
    for key, value in metadata or ():
        if key == "authorization" and isinstance(value, str):
            return bearer_value(value)
    return None


class BearerTokenInterceptor(grpc.aio.ServerInterceptor):
    """Every RPC but health needs `authorization: Bearer <token>` with one of `tokens` (none: all pass)."""

    def __init__(self, tokens: list[str], what: str = "API key", placeholder: str = "key") -> None:
        self.tokens = [t for t in tokens if t]
        self.what = what
        self.placeholder = placeholder

    async def intercept_service(self, continuation, handler_call_details):
        handler = await continuation(handler_call_details)
        if handler is None or not self.tokens or handler_call_details.method.startswith(OPEN_PREFIXES):
            return handler
        token = bearer_token(handler_call_details.invocation_metadata)
        if token is not None and token_is_valid(token, self.tokens):
            return handler
        if token is None:
            message = f"missing {self.what}: send metadata 'authorization: Bearer <{self.placeholder}>'"
        else:
            message = f"invalid {self.what}"
        return _rejecting(handler, message)


def _rejecting(handler: grpc.RpcMethodHandler, message: str) -> grpc.RpcMethodHandler:
    kwargs = dict(request_deserializer=handler.request_deserializer, response_serializer=handler.response_serializer)

    async def unary(request, context):
        raise Unauthenticated(message)

    async def streaming(request, context):
        raise Unauthenticated(message)
        yield  # pragma: no cover - makes this an async generator

    if handler.request_streaming and handler.response_streaming:
        return grpc.stream_stream_rpc_method_handler(streaming, **kwargs)
    if handler.request_streaming:
        return grpc.stream_unary_rpc_method_handler(unary, **kwargs)
    if handler.response_streaming:
        return grpc.unary_stream_rpc_method_handler(streaming, **kwargs)
    return grpc.unary_unary_rpc_method_handler(unary, **kwargs)

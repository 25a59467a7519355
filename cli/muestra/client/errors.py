"""Typed errors: one class per gRPC status a caller may want to handle."""

from __future__ import annotations

import grpc


class MuestraError(Exception):
    """A request failed; `code` is the gRPC status, `details` the server's message."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(f"{code.name}: {details}")
        self.code = code
        self.details = details


class InvalidArgumentError(MuestraError):
    """A field was malformed or over its limit; the message names it."""


class NotFoundError(MuestraError):
    """An unknown model."""


class ResourceExhaustedError(MuestraError):
    """A queue or memory budget is full; retry later."""


class AuthenticationError(MuestraError):
    """Missing or wrong API key."""


class UnavailableError(MuestraError):
    """The gateway (or a service behind it) cannot be reached."""


class DeadlineExceededError(MuestraError):
    """The request ran past its deadline."""


_BY_CODE = {
    grpc.StatusCode.INVALID_ARGUMENT: InvalidArgumentError,
    grpc.StatusCode.NOT_FOUND: NotFoundError,
    grpc.StatusCode.RESOURCE_EXHAUSTED: ResourceExhaustedError,
    grpc.StatusCode.UNAUTHENTICATED: AuthenticationError,
    grpc.StatusCode.UNAVAILABLE: UnavailableError,
    grpc.StatusCode.DEADLINE_EXCEEDED: DeadlineExceededError,
}


def from_rpc_error(exc: grpc.RpcError) -> MuestraError:
    code, details = exc.code(), exc.details() or ""
    return _BY_CODE.get(code, MuestraError)(code, details)

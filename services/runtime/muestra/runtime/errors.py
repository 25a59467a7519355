"""Exceptions that services raise; the interceptor turns each into a gRPC status."""

from __future__ import annotations

import grpc


class MuestraError(Exception):
    """An error whose message is meant for the client."""

    code: grpc.StatusCode = grpc.StatusCode.INTERNAL


class InvalidArgument(MuestraError):
    """A request field is malformed or outside its limit; the message names the field."""

    code = grpc.StatusCode.INVALID_ARGUMENT

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


class NotFound(MuestraError):
    code = grpc.StatusCode.NOT_FOUND


class ResourceExhausted(MuestraError):
    code = grpc.StatusCode.RESOURCE_EXHAUSTED


class FailedPrecondition(MuestraError):
    code = grpc.StatusCode.FAILED_PRECONDITION


class Unauthenticated(MuestraError):
    code = grpc.StatusCode.UNAUTHENTICATED


class Unavailable(MuestraError):
    code = grpc.StatusCode.UNAVAILABLE


class DeadlineExceeded(MuestraError):
    code = grpc.StatusCode.DEADLINE_EXCEEDED


def check_limit(field: str, value: int | float, low: int | float, high: int | float) -> None:
    """Raise InvalidArgument unless low <= value <= high (NaN always fails)."""
    if not (low <= value <= high):
        raise InvalidArgument(field, f"must be between {low} and {high}, got {value}")

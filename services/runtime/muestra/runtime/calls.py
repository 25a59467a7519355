"""Calling other services: a backend's gRPC failure as a muestra error."""

from __future__ import annotations

import grpc

from muestra.runtime.errors import MuestraError


def grpc_error_to_muestra(exc: grpc.aio.AioRpcError) -> MuestraError:
    """A backend's status, passed on to the client with its code and message."""
    error = MuestraError(exc.details() or exc.code().name)
    error.code = exc.code()
    return error

"""One mapping from a failed call to another service to the error the request gets, for every client."""

from __future__ import annotations

import grpc

from muestra.runtime.calls import grpc_error_to_muestra
from muestra.runtime.errors import DeadlineExceeded, MuestraError, Unavailable

# Statuses that say the service is down or slow, not that the request is wrong.
UNREACHABLE = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)


def failed_message(service: str, exc: grpc.aio.AioRpcError) -> str:
    """ "<service> failed: <STATUS> <details>": how every client names a service that failed a call."""
    return f"{service} failed: {exc.code().name} {exc.details() or ''}".rstrip()


def call_failed(
    exc: grpc.aio.AioRpcError, service: str, *, own_deadline: bool = False, during: str = ""
) -> MuestraError:
    """What a request gets when `service` failed a call made for it.

    - The request's own deadline (timeout_ms, or its call's) ran out: DEADLINE_EXCEEDED, saying `during` what.
    - The service is down or slow: UNAVAILABLE, naming it (the client may retry, perhaps on another replica).
    - Anything else is the service's verdict on the request (INVALID_ARGUMENT, NOT_FOUND …): passed on as it is.
    """
    code = exc.code()
    if code == grpc.StatusCode.DEADLINE_EXCEEDED and own_deadline:
        return DeadlineExceeded(f"the request's deadline (timeout_ms, or its call's) passed while {during}")
    if code in UNREACHABLE:
        return Unavailable(failed_message(service, exc))
    return grpc_error_to_muestra(exc)

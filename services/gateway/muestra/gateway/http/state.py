"""What the HTTP routes share: create_app puts it on app.state, and routes take it as FastAPI dependencies."""

from __future__ import annotations

import time
from typing import Annotated

from fastapi import Depends, FastAPI, Request

from muestra.gateway.rpc.server import GatewayServicer


def attach(app: FastAPI, servicer: GatewayServicer) -> None:
    """The gateway's servicer (its schedulers, registry and checks) and when this app was made."""
    app.state.servicer = servicer
    app.state.created = int(time.time())  # the "created" of every /v1/models card
    app.state.started = time.monotonic()  # /v1/status's uptime_s counts from here


async def _servicer(request: Request) -> GatewayServicer:
    # async: a plain def dependency would run in FastAPI's thread pool
    return request.app.state.servicer


Servicer = Annotated[GatewayServicer, Depends(_servicer)]

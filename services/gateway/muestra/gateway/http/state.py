"""What the HTTP routes share: create_app puts it on app.state, and routes take it as FastAPI dependencies."""

from __future__ import annotations

import time
from typing import Annotated

from fastapi import Depends, FastAPI, Request

from muestra.gateway.engine.engine import Engine


def attach(app: FastAPI, engine: Engine) -> None:
    """The gateway's engine (its schedulers, registry and checks) and when this app was made."""
    app.state.engine = engine
    app.state.created = int(time.time())  # the "created" of every /v1/models card
    app.state.started = time.monotonic()  # /v1/status's uptime_s counts from here


async def _engine(request: Request) -> Engine:
    # async: a plain def dependency would run in FastAPI's thread pool
    return request.app.state.engine


EngineDep = Annotated[Engine, Depends(_engine)]

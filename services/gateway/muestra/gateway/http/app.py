"""The gateway's HTTP app: OpenAI's routes, muestra's listings, AUTOMATIC1111's API and the playground,
over the gateway's own engine (same schedulers, same checks), behind the Edge."""

from __future__ import annotations

from fastapi import APIRouter, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.exceptions import HTTPException

from muestra.gateway.engine.engine import Engine
from muestra.gateway.http import a1111, playground, state
from muestra.gateway.http.edge import Edge
from muestra.gateway.http.errors import OpenAIError, from_validation
from muestra.gateway.http.openai import listings, response_routes, routes
from muestra.gateway.http.openai.response_store import MemoryStore
from muestra.gateway.http.state import EngineDep

service = APIRouter()


@service.get("/health")
async def health(engine: EngineDep) -> Response:
    problem = engine.watchdog.problem()
    if problem is not None:
        return JSONResponse({"status": "not serving", "reason": problem}, status_code=503)
    return JSONResponse({"status": "ok"})


@service.get("/metrics")
async def metrics() -> Response:
    return Response(generate_latest(), media_type=CONTENT_TYPE_LATEST)


async def openai_error(request: Request, exc: OpenAIError) -> JSONResponse:
    return JSONResponse(exc.body(), status_code=exc.status)


async def validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
    error = from_validation(list(exc.errors()))
    return JSONResponse(error.body(), status_code=error.status)


async def http_error(request: Request, exc: HTTPException) -> JSONResponse:
    # FastAPI wraps what goes wrong while it reads the body (BodyTooLarge from the Edge) in a 400.
    if isinstance(exc.__cause__, OpenAIError):
        return JSONResponse(exc.__cause__.body(), status_code=exc.__cause__.status)
    error = OpenAIError(exc.status_code, f"{request.method} {request.url.path}: {exc.detail}", code=None)
    return JSONResponse(error.body(), status_code=exc.status_code)


def create_app(
    engine: Engine, keys: list[str], max_body_bytes: int, body_timeout_s: float = 60.0, response_store=None
) -> Edge:
    """The ASGI app: the routes behind the Edge (API keys, body limit and deadline, request ids, logs, metrics).

    `response_store`: where /v1/responses keeps stored responses (response_store.open_store), in process by default.
    """
    app = FastAPI(title="muestra", docs_url=None, redoc_url=None, openapi_url=None)
    state.attach(app, engine)
    app.state.response_store = response_store if response_store is not None else MemoryStore(30 * 24 * 3600.0, 10000)
    app.state.a1111_jobs = a1111.Jobs()
    app.state.playground_files = playground.load_files()
    app.add_exception_handler(OpenAIError, openai_error)
    app.add_exception_handler(RequestValidationError, validation_error)
    app.add_exception_handler(HTTPException, http_error)
    app.add_exception_handler(a1111.A1111Error, a1111.a1111_error)
    for router in (routes.router, response_routes.router, listings.router, a1111.router, playground.router, service):
        app.include_router(router)
    return Edge(app, keys, max_body_bytes, body_timeout_s)

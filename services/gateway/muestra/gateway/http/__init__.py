"""The gateway's API side over HTTP. app.py builds it from routers: OpenAI's (openai/: the generation routes,
the Responses API, the listings /v1/models, /v1/samplers, /v1/schedulers, /v1/status), AUTOMATIC1111's API
(a1111/), the playground at / (playground/), /health and /metrics; edge.py is what every request goes through,
errors.py and streams.py are shared by all three."""

from __future__ import annotations

from muestra.gateway.http.app import create_app
from muestra.gateway.http.openai.response_store import open_store
from muestra.gateway.http.serve import HttpServer


async def start_http_api(engine, config, keys: list[str]) -> HttpServer:
    """Serve the HTTP API on config.http_host (default: the gRPC host) and config.http_port, in this event loop."""
    store = open_store(config)
    app = create_app(engine, keys, config.http_max_body_bytes, config.http_body_timeout_s, store)
    server = HttpServer(app, config.http_host or config.host, config.http_port, config.grace_period_s)
    server.closing.append(store.close)
    await server.start()
    return server


__all__ = ["HttpServer", "create_app", "start_http_api"]

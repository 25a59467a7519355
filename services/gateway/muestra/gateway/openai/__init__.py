"""The gateway's HTTP API: OpenAI's routes under /v1, muestra's listings (/v1/samplers, /v1/schedulers,
/v1/status), /health, /metrics, and the playground at / (muestra.gateway.playground)."""

from __future__ import annotations

from muestra.gateway.openai.app import create_app
from muestra.gateway.openai.serve import HttpServer


async def start_http_api(servicer, config, keys: list[str]) -> HttpServer:
    """Serve the HTTP API on config.http_host (default: the gRPC host) and config.http_port, in this event loop."""
    app = create_app(servicer, keys, config.http_max_body_bytes)
    server = HttpServer(app, config.http_host or config.host, config.http_port, config.grace_period_s)
    await server.start()
    return server


__all__ = ["HttpServer", "create_app", "start_http_api"]

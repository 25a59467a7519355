"""The Prometheus /metrics endpoint of a service, behind the same bearer tokens as its gRPC port."""

from __future__ import annotations

import socket
import threading
from socketserver import ThreadingMixIn
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import make_wsgi_app

from muestra.runtime.auth import bearer_value, token_is_valid


class _Server(ThreadingMixIn, WSGIServer):
    daemon_threads = True


class _Server6(_Server):
    address_family = socket.AF_INET6


class _Quiet(WSGIRequestHandler):
    def log_message(self, format, *args) -> None:
        pass


def start_metrics_server(host: str, port: int, tokens: list[str]) -> int:
    """Serve /metrics on host:port (0: a free port) in a daemon thread; the port. With tokens, a scrape
    needs `Authorization: Bearer <token>` (Prometheus: `authorization: {credentials_file: ...}`)."""
    metrics = make_wsgi_app()
    tokens = [t for t in tokens if t]

    def app(environ, start_response):
        if tokens:
            token = bearer_value(environ.get("HTTP_AUTHORIZATION", ""))
            if token is None or not token_is_valid(token, tokens):
                start_response("401 Unauthorized", [("Content-Type", "text/plain"), ("WWW-Authenticate", "Bearer")])
                return [b"missing or invalid bearer token (Authorization: Bearer <token>)\n"]
        return metrics(environ, start_response)

    server_class = _Server6 if ":" in host else _Server
    httpd = make_server(host, port, app, server_class, handler_class=_Quiet)
    threading.Thread(target=httpd.serve_forever, name="metrics", daemon=True).start()
    return httpd.server_port

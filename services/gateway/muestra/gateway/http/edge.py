"""What every HTTP request goes through: its request id, the API key, the body limit, one log line, metrics."""

from __future__ import annotations

import asyncio
import json
import logging
import time

from prometheus_client import Counter, Histogram

from muestra.gateway.http.errors import OpenAIError, unauthorized
from muestra.gateway.http.playground import PREFIX, is_open_path
from muestra.runtime.auth import bearer_value, token_is_valid
from muestra.runtime.logs import REQUEST_ID_HEADER, new_request_id, request_id_var, valid_request_id

log = logging.getLogger("muestra.requests")

HTTP_REQUESTS = Counter("muestra_http_requests_total", "HTTP requests handled", ["path", "status"])
HTTP_LATENCY = Histogram(
    "muestra_http_request_duration_seconds",
    "Time from an HTTP request's arrival to the end of its response (the whole stream when streaming)",
    ["path"],
    buckets=(0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60, 300),
)
OPEN_PATHS = ("/health",)  # and the playground's own files (is_open_path)
# Metric labels: the routes, and "other" for everything else (so unknown paths cannot grow the label set).
KNOWN_PATHS = {
    "/v1/completions",
    "/v1/chat/completions",
    "/v1/responses",
    "/v1/images/generations",
    "/v1/images/edits",
    "/sdapi/v1/txt2img",
    "/sdapi/v1/img2img",
    "/sdapi/v1/progress",
    "/sdapi/v1/interrupt",
    "/sdapi/v1/samplers",
    "/sdapi/v1/sd-models",
    "/sdapi/v1/loras",
    "/sdapi/v1/options",
    "/sdapi/v1/schedulers",
    "/sdapi/v1/extra-single-image",
    "/sdapi/v1/extra-batch-images",
    "/v1/models",
    "/v1/samplers",
    "/v1/schedulers",
    "/v1/status",
    "/health",
    "/metrics",
    "/",
}


class BodyTooLarge(OpenAIError):
    def __init__(self, limit: int) -> None:
        super().__init__(
            413, f"the request body is over the limit of {limit} bytes", "invalid_request_error", None, "body_too_large"
        )


class BodyTimeout(OpenAIError):
    def __init__(self, timeout_s: float) -> None:
        super().__init__(
            408, f"the request body did not arrive within {timeout_s:g} s", "invalid_request_error", None,
            "body_timeout",
        )  # fmt: skip


async def send_error(send, error: OpenAIError, a1111: bool = False) -> None:
    """The error as OpenAI's error object, or as AUTOMATIC1111's {"detail": ...} on its /sdapi routes."""
    body = json.dumps({"detail": error.message}).encode() if a1111 else error.json_bytes()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": error.status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


class Edge:
    """ASGI middleware around the whole app."""

    def __init__(self, app, keys: list[str], max_body_bytes: int, body_timeout_s: float = 60.0) -> None:
        self.app = app
        self.keys = [k for k in keys if k]
        self.max_body_bytes = max_body_bytes
        self.body_timeout_s = body_timeout_s

    def _refuse(self, scope, headers: dict[bytes, bytes]) -> OpenAIError | None:
        if self.keys and scope["path"] not in OPEN_PATHS and not is_open_path(scope["path"]):
            token = bearer_value(headers.get(b"authorization", b"").decode("latin-1"))
            if token is None:
                return unauthorized("missing API key: send the header 'Authorization: Bearer <key>'")
            if not token_is_valid(token, self.keys):
                return unauthorized("invalid API key")
        length = headers.get(b"content-length")
        if length is not None and length.isdigit() and int(length) > self.max_body_bytes:
            return BodyTooLarge(self.max_body_bytes)
        return None

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope["headers"])
        # A client's id travels on to the services as a gRPC header: one that could not is replaced.
        request_id = valid_request_id(headers.get(REQUEST_ID_HEADER.encode())) or new_request_id()
        token = request_id_var.set(request_id)
        started = time.perf_counter()
        status = 0
        received = 0
        body_ended = False
        body_deadline = asyncio.get_running_loop().time() + self.body_timeout_s

        async def send_with_id(message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                message = {**message, "headers": [*message.get("headers", ()), (b"x-request-id", request_id.encode())]}
            await send(message)

        async def limited_receive():
            nonlocal received, body_ended
            if body_ended:  # what is left to receive is the client leaving, however long the answer takes
                return await receive()
            try:
                async with asyncio.timeout_at(body_deadline):
                    message = await receive()
            except TimeoutError:
                raise BodyTimeout(self.body_timeout_s) from None
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_body_bytes:
                    raise BodyTooLarge(self.max_body_bytes)
                body_ended = not message.get("more_body", False)
            return message

        try:
            refusal = self._refuse(scope, headers)
            if refusal is not None:
                await send_error(send_with_id, refusal, a1111=scope["path"].startswith("/sdapi/"))
            else:
                await self.app(scope, limited_receive, send_with_id)
        finally:
            elapsed = time.perf_counter() - started
            path = scope["path"]
            path = path if path in KNOWN_PATHS else "/ui" if path.startswith(PREFIX) else "other"
            HTTP_REQUESTS.labels(path, str(status or 499)).inc()
            HTTP_LATENCY.labels(path).observe(elapsed)
            level = logging.DEBUG if path in ("/health", "/metrics") else logging.INFO
            client = scope.get("client") or ("-", 0)
            log.log(
                level, "HTTP %s %s %d %.1fms peer=%s:%s", scope["method"], scope["path"], status or 499,
                elapsed * 1000, client[0], client[1],
            )  # fmt: skip
            request_id_var.reset(token)

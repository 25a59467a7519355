"""Logging set-up and the request id that travels in gRPC metadata across services."""

from __future__ import annotations

import contextvars
import logging
import sys
import uuid

REQUEST_ID_HEADER = "x-request-id"
request_id_var: contextvars.ContextVar[str] = contextvars.ContextVar("request_id", default="-")


class _RequestIdFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        record.request_id = request_id_var.get()
        return True


def configure_logging(service: str, level: str = "INFO") -> None:
    """One line per record: time, level, service, request id, message."""
    handler = logging.StreamHandler(sys.stderr)
    handler.addFilter(_RequestIdFilter())
    handler.setFormatter(
        logging.Formatter(f"%(asctime)s %(levelname)s {service} [%(request_id)s] %(name)s: %(message)s")
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())


def new_request_id() -> str:
    return uuid.uuid4().hex[:16]


def request_id_from_metadata(metadata) -> str | None:
    for key, value in metadata or ():
        if key == REQUEST_ID_HEADER and value:
            return str(value)[:64]
    return None

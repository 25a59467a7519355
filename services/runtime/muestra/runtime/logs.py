"""Logging set-up and the request id that travels in gRPC metadata across services."""

from __future__ import annotations

import contextlib
import contextvars
import logging
import re
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


_REQUEST_ID = re.compile(r"[A-Za-z0-9._:/+=-]{1,64}")


def valid_request_id(value: str | bytes | None) -> str | None:
    """A client's request id, if it is 1-64 characters that every log and gRPC header can carry; else None."""
    if isinstance(value, bytes):
        value = value.decode("ascii", errors="replace")
    if value and _REQUEST_ID.fullmatch(value):
        return value
    return None


@contextlib.contextmanager
def request_id_scope(request_id: str):
    """Log lines inside carry `request_id` (one message of a stream that serves many requests)."""
    token = request_id_var.set(request_id or "-")
    try:
        yield
    finally:
        request_id_var.reset(token)


_SHOWN_IDS = 4


def joined_request_ids(ids) -> str:
    """Several requests' ids as one log field: the first few, then how many more ("a,b,c,d+3")."""
    # Runs once per decode step: only the ids that are shown are checked (the others are only counted).
    unique = [i for i in dict.fromkeys(ids) if i]
    shown = ",".join(i for i in unique[:_SHOWN_IDS] if valid_request_id(i))
    if len(unique) <= _SHOWN_IDS:
        return shown or "-"
    return f"{shown or '-'}+{len(unique) - _SHOWN_IDS}"


def request_id_from_metadata(metadata) -> str | None:
    for key, value in metadata or ():
        if key == REQUEST_ID_HEADER:
            return valid_request_id(value)
    return None


def without_password(url: str) -> str:
    """A URL as it may be logged: any password is replaced by ***."""
    scheme, sep, rest = url.partition("://")
    userinfo, at, host = rest.rpartition("@")
    if not at or ":" not in userinfo:
        return url
    return f"{scheme}{sep}{userinfo.split(':', 1)[0]}:***@{host}"

"""Calling other services: a backend's gRPC failure as a muestra error, and a backend's health with backoff."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

import grpc
from prometheus_client import Counter

from muestra.runtime.errors import MuestraError


def grpc_error_to_muestra(exc: grpc.aio.AioRpcError) -> MuestraError:
    """A backend's status, passed on to the client with its code and message."""
    error = MuestraError(exc.details() or exc.code().name)
    error.code = exc.code()
    return error


class BackendHealth:
    """Whether an optional backend (a Redis cache) answers: healthy, or failing from an error until a call
    of the kind that failed succeeds.

    One warning when it starts failing and one info line when it is back, however many calls pass in
    between. While failing, callers skip the backend except for one probe per backoff window (1 s, doubling
    up to 16 s), so a down or black-holed backend costs one timeout per window, not one per request.
    Counters labelled by `op` are counted per kind of call.
    """

    BACKOFF_S = 1.0
    MAX_BACKOFF_S = 16.0

    def __init__(
        self,
        what: str,
        consequence: str,
        log: logging.Logger,
        *,
        errors: Counter,
        incidents: Counter,
        skipped: Counter,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.what = what
        self.consequence = consequence
        self.healthy = True
        self._log = log
        self._errors_total, self._incidents_total, self._skipped_total = errors, incidents, skipped
        self._clock = clock
        # Callers may be threads (the lm's prefix store) or tasks on one loop (the gateway).
        self._lock = threading.Lock()
        self._failing_op = ""
        self._since = 0.0
        self._errors = 0
        self._backoff = self.BACKOFF_S
        self._retry_at = 0.0

    def should_try(self, op: str) -> bool:
        """True when the caller may call the backend now: it is healthy, or this call is the window's probe."""
        if self.healthy:
            return True
        with self._lock:
            now = self._clock()
            if self.healthy or now >= self._retry_at:
                # This caller probes; others keep skipping until the probe's outcome is known.
                self._retry_at = now + self._backoff
                return True
        _count(self._skipped_total, op)
        return False

    def failed(self, op: str, exc: BaseException) -> None:
        _count(self._errors_total, op)
        with self._lock:
            now = self._clock()
            self._errors += 1
            if self.healthy:
                self.healthy = False
                self._failing_op, self._since, self._errors = op, now, 1
                self._backoff = self.BACKOFF_S
                _count(self._incidents_total, op)
                self._log.warning(
                    "%s %s failed (%s: %s); %s until it recovers (retrying after %.0f s, then less often)",
                    self.what, op, type(exc).__name__, exc, self.consequence, self._backoff,
                )  # fmt: skip
            else:
                self._backoff = min(self._backoff * 2, self.MAX_BACKOFF_S)
            self._retry_at = now + self._backoff

    def succeeded(self, op: str) -> None:
        if self.healthy:
            return
        with self._lock:
            if not self.healthy and op == self._failing_op:
                self.healthy = True
                self._log.info(
                    "%s answers again after %.1f s (%d failed calls while it was failing)",
                    self.what, self._clock() - self._since, self._errors,
                )  # fmt: skip


def _count(counter: Counter, op: str) -> None:
    (counter.labels(op=op) if "op" in counter._labelnames else counter).inc()

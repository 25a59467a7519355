"""The scheduler watchdog: a scheduler that has work and stops moving turns the gateway NOT_SERVING.

Every await on another service has a deadline, so a scheduler that stops moving for longer than
any deadline is a gateway bug, and a gateway in that state must not keep receiving traffic. Each
scheduler notes when its loop last moved on and what it is waiting for; the runtime asks
`Watchdog.problem()` every second and sets the health status from it.
"""

from __future__ import annotations

import contextlib
import itertools
import time
from collections.abc import Callable, Iterable, Iterator


class Progress:
    """When a scheduler's loop last moved on, and the awaits it has in flight (for the log)."""

    def __init__(self) -> None:
        self.moved_at = time.monotonic()
        self._waits: dict[int, tuple[str, float]] = {}
        self._keys = itertools.count()

    def moved(self) -> None:
        self.moved_at = time.monotonic()

    @contextlib.contextmanager
    def waiting_for(self, what: str) -> Iterator[None]:
        key = next(self._keys)
        self._waits[key] = (what, time.monotonic())
        try:
            yield
        finally:
            del self._waits[key]

    def waits(self) -> list[str]:
        """What is awaited right now, oldest first."""
        now = time.monotonic()
        return [f"{what} (for {now - since:.1f} s)" for what, since in sorted(self._waits.values(), key=lambda w: w[1])]


class Watchdog:
    """problem(): why the gateway should not serve (a stalled scheduler), or None."""

    def __init__(self, schedulers: Callable[[], Iterable], stall_s: float) -> None:
        # schedulers() -> objects with .name, .has_work() and .progress
        self.schedulers = schedulers
        self.stall_s = stall_s

    def problem(self) -> str | None:
        if self.stall_s <= 0:
            return None
        now = time.monotonic()
        stalled = []
        for scheduler in self.schedulers():
            idle_for = now - scheduler.progress.moved_at
            if scheduler.has_work() and idle_for > self.stall_s:
                waits = "; ".join(scheduler.progress.waits()) or "nothing (a loop that does not move)"
                stalled.append(
                    f"scheduler of {scheduler.name} made no progress for {idle_for:.0f} s, waiting for {waits}"
                )
        return " | ".join(stalled) or None

"""The server side of a long-lived step stream (lm BatchSteps, tokenizer DetokenizeSteps).

A caller keeps such a stream open between steps, even when it has nothing to send. On SIGTERM the
runtime waits up to its grace period for in-flight calls, and an open stream is one: so once the
service is draining, a stream is ended when its caller leaves it idle for IDLE_AFTER_DRAIN_S, and
the service stops as soon as its real work is done. The caller opens a new stream (to another
replica) for its next step.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterable, AsyncIterator
from typing import TypeVar

T = TypeVar("T")

# Metadata naming the caller's lease on lm calls: a batch belongs to the lease it was created under,
# and goes when the lease's step stream breaks (muestra.lm.engine).
LEASE_HEADER = "x-muestra-lease"

# Once draining, how long a stream may wait for its next request before it is ended.
IDLE_AFTER_DRAIN_S = 0.5

_draining: asyncio.Event | None = None


def draining() -> asyncio.Event:
    """Set when the service starts to stop (the runtime sets it; one per event loop's service)."""
    global _draining
    if _draining is None:
        _draining = asyncio.Event()
    return _draining


def reset_draining() -> None:
    """A new service in this process starts undrained (tests run several one after another)."""
    global _draining
    _draining = None


async def until_drained(requests: AsyncIterable[T]) -> AsyncIterator[T]:
    """The stream's requests, until it ends, or until it idles IDLE_AFTER_DRAIN_S once the service drains."""
    iterator = aiter(requests)
    # One watcher for the whole stream, not one per step: this runs for every decode step.
    watch = asyncio.ensure_future(draining().wait())
    pending: asyncio.Future | None = None
    try:
        while True:
            pending = asyncio.ensure_future(anext(iterator))
            if not watch.done():
                await asyncio.wait({pending, watch}, return_when=asyncio.FIRST_COMPLETED)
            if not pending.done():
                await asyncio.wait({pending}, timeout=IDLE_AFTER_DRAIN_S)
                if not pending.done():
                    return
            try:
                request = pending.result()
            except StopAsyncIteration:
                return
            pending = None
            yield request
    finally:
        watch.cancel()
        if pending is not None:
            # Ended while waiting for a request (the stream closed, or the service stopped): the read
            # still finishes, with StopAsyncIteration or a cancelled call, and nobody wants its result.
            pending.cancel()
            pending.add_done_callback(_discard)


def _discard(future: asyncio.Future) -> None:
    if not future.cancelled():
        future.exception()

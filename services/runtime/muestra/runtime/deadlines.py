"""Awaiting with a deadline, cheaply enough for once per decode step."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

T = TypeVar("T")


async def within(timeout_s: float, awaitable: Awaitable[T]) -> T:
    """`awaitable`'s result, or asyncio.TimeoutError after timeout_s.

    asyncio.timeout (3.11+) runs the awaitable in this task, where wait_for (3.10) creates a task per call.
    """
    if hasattr(asyncio, "timeout"):
        async with asyncio.timeout(timeout_s):
            return await awaitable
    return await asyncio.wait_for(awaitable, timeout_s)

"""The lm's model thread: every forward runs there, one at a time, so the engine has a single writer."""

from __future__ import annotations

import asyncio
import contextlib
from concurrent.futures import ThreadPoolExecutor


class ModelThread:
    """Runs the engine's calls off the event loop; decode steps never queue behind more than one prefill job."""

    def __init__(self) -> None:
        # One thread: forwards are serialized and the batch table has a single writer.
        self.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="lm-model")
        # Calls submitted to that thread and not yet finished (only the event loop changes this).
        self._calls = 0
        # Held by the prefill whose forward (or chunk) is queued or running on the model thread: decode steps
        # never queue behind more than one.
        self._chunk_turn = asyncio.Lock()
        # The prefill jobs that asked for a turn and have not begun on the model thread: while one waits, a greedy
        # burst there ends at its next step. A job leaves the set when it begins, or when its turn ends without
        # it having begun (never submitted, or cancelled in the queue).
        self._prefills_waiting: set[PrefillTurn] = set()

    def prefill_waiting(self) -> bool:
        return bool(self._prefills_waiting)

    async def run(self, fn, *args):
        self._calls += 1
        try:
            return await asyncio.get_running_loop().run_in_executor(self.executor, fn, *args)
        finally:
            self._calls -= 1

    async def step(self, fn, *args):
        """A decode step runs right on the event loop when the model thread is idle.

        Handing a step to the model thread and its result back costs 0.5-0.8 ms on a busy 2-core
        machine, several percent of a small model's step. Nothing else can touch the engine meanwhile:
        the model thread has no work, and only this loop gives it any. Health checks and other calls
        wait for the step (tens of ms); prefills, which can take seconds, always go to the model thread.
        """
        if self._calls == 0:
            return fn(*args)
        return await self.run(fn, *args)

    @contextlib.asynccontextmanager
    async def prefill_turn(self):
        """A prefill job's turn on the model thread: after the prefill job queued before it (decode steps are
        not held), and ending the greedy burst that runs there at its next step."""
        turn = PrefillTurn(self)
        self._prefills_waiting.add(turn)
        try:
            async with self._chunk_turn:
                yield turn
        finally:
            self._prefills_waiting.discard(turn)


class PrefillTurn:
    """submit(fn, *args): run fn on the model thread for the turn that prefill_turn granted (once)."""

    def __init__(self, thread: ModelThread) -> None:
        self.thread = thread

    def submit(self, fn, *args) -> asyncio.Future:
        def run():
            self.thread._prefills_waiting.discard(self)  # set operations hold the GIL: safe beside the loop
            return fn(*args)

        return asyncio.ensure_future(self.thread.run(run))

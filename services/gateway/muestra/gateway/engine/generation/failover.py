"""A replica scheduler's failures: the replica fails (its requests that streamed nothing move to another one, once;
the rest end with UNAVAILABLE and their seeds), the gateway shuts down, or the loop itself stops by a bug."""

from __future__ import annotations

import asyncio
import logging

from muestra.gateway.engine.clients.lm import LmFailed
from muestra.gateway.engine.generation.request import GenerationRequest
from muestra.runtime.errors import (
    DeadlineExceeded,
    MuestraError,
    Unavailable,
)

log = logging.getLogger("muestra.gateway.scheduler")

# A request that has streamed nothing moves to another replica at most this many times.
MAX_REROUTES = 1


class Failover:
    """Mixed into ReplicaScheduler: what it does when a call, the replica or the gateway fails."""

    def _loop_ended(self, task: asyncio.Task) -> None:
        """The loop only ends by a bug (or with the gateway): nobody may be left waiting on it."""
        if task.cancelled():
            return
        exc = task.exception()
        log.error("the scheduler of %s stopped", self.name, exc_info=exc)
        error = MuestraError(f"internal error in the gateway's scheduler for {self.name}")
        for request in [*self.batch.requests(), *self._stop_prefills(), *self.waiting]:
            request.fail(error)
        self.batch.drop()
        self.waiting.clear()
        self.lm.close()

    async def _lm_failed(self, exc: LmFailed) -> None:
        """The replica's batches are gone: move what has streamed nothing, fail the rest, leave the rotation."""
        prefilling, _ = await self._end_prefills()  # the lm frees them: the lease's stream breaks below
        in_flight = [*self.batch.requests(), *prefilling]
        log.warning("%s; %d request(s) in flight there", exc, len(in_flight))
        self.batch.drop()
        self.lm.close()
        for request in in_flight:
            self._move_or_fail(request, exc)
        if self.out_of_rotation is not None:
            self.out_of_rotation(self)

    def _stop_prefills(self) -> list[GenerationRequest]:
        """Cancel every prefill in flight (the lm frees what a cancelled Prefill made); their requests."""
        stopped, self.prefilling = self.prefilling, []
        for prefilling in stopped:
            prefilling.task.cancel()
        return [p.request for p in stopped]

    async def _end_prefills(self) -> tuple[list[GenerationRequest], list[str]]:
        """_stop_prefills, waiting for the tasks to end; their requests, and the batches of prefills that were
        done already (for the caller to free). Each task's outcome is retrieved: the caller handles it."""
        tasks = [p.task for p in self.prefilling]
        requests = self._stop_prefills()
        made = []
        if tasks:
            await asyncio.wait(tasks)
            for task in tasks:
                if not task.cancelled() and task.exception() is None:
                    made.append(task.result().batch_id)
        return requests, made

    def _move_or_fail(self, request: GenerationRequest, exc: LmFailed) -> None:
        if request.cancelled:
            request.out.put_nowait(None)
            return
        if not request.started and request.attempts <= MAX_REROUTES and self.reroute is not None:
            log.info("request %s streamed nothing yet: moving it off %s", request.request_id, self.replica.address)
            self.reroute(request, self)
            return
        request.fail(Unavailable(f"{exc}; retry with seed {request.seed} for the same text"))

    def shut_down(self) -> None:
        """The gateway's grace period is ending: fail what is in flight or waiting, each with its seed."""
        for request in [*self._stop_prefills(), *self.batch.requests(), *self.waiting]:
            request.fail(Unavailable(f"the gateway is shutting down; retry with seed {request.seed} for the same text"))
        self.waiting.clear()
        self.wake.set()

    async def _end_all(self, exc: MuestraError) -> None:
        """End every request in flight or waiting with `exc`, and free their batches on the lm."""
        prefilling, made = await self._end_prefills()
        in_flight = [*self.batch.requests(), *prefilling]
        log.warning("%s; ending %d request(s) in flight and %d waiting", exc, len(in_flight), len(self.waiting))
        for request in in_flight:
            request.fail(exc)
        while self.waiting:
            self.waiting.popleft().fail(exc)
        batch_ids = [*self.batch.drop(), *made]
        if batch_ids:
            try:
                await self.lm.clear(batch_ids)
            except LmFailed as failed:
                log.warning("freeing the batches of failed requests: %s", failed)


def deadline_error(request: GenerationRequest, when: str) -> DeadlineExceeded:
    return DeadlineExceeded(
        f"the request's deadline (timeout_ms, or its call's) passed {when}; retry with seed {request.seed} for the "
        "same text"
    )

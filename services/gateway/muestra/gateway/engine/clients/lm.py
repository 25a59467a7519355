"""The scheduler's side of one lm replica: its lease, its step stream, and the calls that change its batches.

Prefill is a unary call with the request's own deadline (when it comes before the lm's). Decode,
Filter and Clear go over one open BatchSteps stream (a draining lm keeps serving them there); they
change the lm's batches, so a broken step is not retried. The lm leases the batches this client
creates to it: nobody else can step or clear them, and they are freed if the stream breaks (or if
they idle past the lm's batch_idle_s).

A failure of the replica (it is gone, broken, or missed the lm deadline) is LmFailed: its batches
are lost. A Prefill refused for the request's own sake (a bad argument, a prompt that does not fit)
is the request's error alone. A Prefill is never cut at the request's own deadline: the lm would
still make the batch, under this lease, where nobody could name it to free it (the scheduler frees
the batch of a request whose deadline passed meanwhile).
"""

from __future__ import annotations

import uuid

import grpc
import numpy as np

from muestra.gateway.engine.clients.backends import LmReplica
from muestra.gateway.engine.clients.errors import failed_message
from muestra.gateway.engine.clients.progress import Progress
from muestra.gateway.engine.clients.step_stream import StepStream
from muestra.runtime.calls import grpc_error_to_muestra
from muestra.runtime.errors import Unavailable
from muestra.runtime.step_streams import LEASE_HEADER
from muestra.v1 import lm_pb2

# Statuses of a Prefill that concern the request, not the replica: that request fails alone.
REQUEST_STATUSES = (
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
    grpc.StatusCode.FAILED_PRECONDITION,
    grpc.StatusCode.OUT_OF_RANGE,
    grpc.StatusCode.INTERNAL,
)


class LmFailed(Unavailable):
    """The lm replica failed a call, or did not answer within the deadline: its batch is lost."""

    def __init__(self, address: str, exc: grpc.aio.AioRpcError) -> None:
        super().__init__(failed_message(f"lm replica {address}", exc))
        self.address = address


def logits_matrix(output: lm_pb2.BatchOutput) -> np.ndarray | None:
    tensor = output.logits
    if not tensor.data:
        return None
    return np.frombuffer(tensor.data, dtype=np.float32).reshape(tuple(tensor.shape))


class LmClient:
    def __init__(self, replica: LmReplica, progress: Progress, timeout_s: float) -> None:
        self.replica = replica
        self.address = replica.address
        self.name = f"lm {replica.address}"
        self.progress = progress
        self.timeout_s = timeout_s
        self.lease = f"gateway-{uuid.uuid4().hex}"
        self.metadata = ((LEASE_HEADER, self.lease),)
        self.stream = StepStream(
            lambda requests: replica.stub.BatchSteps(requests, metadata=self.metadata),
            self.name,
            retry=False,
            timeout_s=timeout_s,
        )

    async def prefill(self, prefill: lm_pb2.PrefillRequest) -> lm_pb2.PrefillResponse:
        """Prefill into a new batch held under this client's lease."""
        # The lm frees a lease's batches when its step stream breaks: have one open before holding any.
        self.stream.open()
        with self.progress.waiting_for(f"{self.name} Prefill"):
            try:
                return await self.replica.stub.Prefill(prefill, timeout=self.timeout_s, metadata=self.metadata)
            except grpc.aio.AioRpcError as exc:
                if exc.code() in REQUEST_STATUSES:
                    raise grpc_error_to_muestra(exc) from exc
                raise LmFailed(self.address, exc) from exc

    async def decode(self, request: lm_pb2.DecodeRequest) -> lm_pb2.DecodeResponse:
        return (await self._step("Decode", decode=request)).decode

    async def filter(self, batch_id: str, rows: list[int]) -> str:
        """The id of the batch made of `rows` of `batch_id` (in that order, repeats allowed)."""
        reply = await self._step("Filter", filter=lm_pb2.FilterRequest(batch_id=batch_id, rows=rows))
        return reply.filter.batch_id

    async def clear(self, batch_ids: list[str]) -> None:
        await self._step("Clear", clear=lm_pb2.ClearRequest(batch_ids=batch_ids))

    def close(self) -> None:
        """Break the step stream: the lm frees every batch of the lease."""
        self.stream.close()

    async def _step(self, what: str, **step) -> lm_pb2.BatchStepResponse:
        with self.progress.waiting_for(f"{self.name} BatchSteps {what}"):
            try:
                return await self.stream.step(lm_pb2.BatchStepRequest(**step))
            except grpc.aio.AioRpcError as exc:
                raise LmFailed(self.address, exc) from exc

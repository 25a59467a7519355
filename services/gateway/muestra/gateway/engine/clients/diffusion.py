"""The engine's calls to an image model's diffusion service."""

from __future__ import annotations

import math
from collections.abc import AsyncIterator

import grpc

from muestra.gateway.engine.clients.errors import call_failed
from muestra.v1 import diffusion_pb2

# How long a listing (schedulers, LoRAs, the model's description) waits for the service.
LIST_TIMEOUT_S = 5.0


class DiffusionClient:
    """One image model's diffusion service. Listings raise grpc.aio.AioRpcError as it is: each caller says in its
    own terms which service did not answer (a listing goes on without it, A1111 answers 503)."""

    def __init__(self, model, timeout_s: float) -> None:
        self.model = model
        self.timeout_s = timeout_s

    async def generate(
        self, request: diffusion_pb2.ImageRequest, time_remaining: float | None = None
    ) -> AsyncIterator[diffusion_pb2.ImageResponse]:
        """The service's progress, previews and images for `request`; closing the iterator cancels the call."""
        timeout, own_deadline = self.timeout_s, False
        if time_remaining is not None and math.isfinite(time_remaining) and time_remaining < timeout:
            timeout, own_deadline = max(0.001, time_remaining), True
        call = self.model.stub.Generate(request, timeout=timeout)
        try:
            async for message in call:
                yield message
        except grpc.aio.AioRpcError as exc:
            raise call_failed(
                exc, f"diffusion service of {self.model.name!r}", own_deadline=own_deadline,
                during="the diffusion service made its images",
            ) from exc  # fmt: skip
        finally:
            call.cancel()

    async def schedulers(self) -> list[diffusion_pb2.SchedulerInfo]:
        reply = await self.model.stub.ListSchedulers(diffusion_pb2.ListSchedulersRequest(), timeout=LIST_TIMEOUT_S)
        return list(reply.schedulers)

    async def loras(self) -> list[diffusion_pb2.LoraInfo]:
        reply = await self.model.stub.ListLoras(diffusion_pb2.ListLorasRequest(), timeout=LIST_TIMEOUT_S)
        return list(reply.loras)

    async def describe(self) -> diffusion_pb2.DescribeDiffusionResponse:
        return await self.model.stub.Describe(diffusion_pb2.DescribeDiffusionRequest(), timeout=LIST_TIMEOUT_S)

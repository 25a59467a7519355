"""One generation at a time on a worker thread, a bounded wait, and events streamed back to the event loop."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import functools
import logging
import threading
import time
from collections.abc import AsyncIterator

import torch

from muestra.diffusion.engine import DiffusionEngine, GenerationCancelled
from muestra.diffusion.infotext import encode_png, parameters_text
from muestra.diffusion.loras import prompt_with_loras
from muestra.diffusion.metrics import CANCELLED, IMAGE_SECONDS, IMAGES, QUEUE_DEPTH
from muestra.diffusion.params import GenerationParams
from muestra.runtime.errors import ResourceExhausted
from muestra.v1 import diffusion_pb2

log = logging.getLogger("muestra.diffusion.worker")


_END = object()


class Generation:
    """One request's events, produced on the worker thread and consumed on the event loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop, started: float) -> None:
        self._loop = loop
        self._events: asyncio.Queue = asyncio.Queue()
        self.started = started
        self.cancel_event = threading.Event()
        # The last step the worker reported, and its value when the client cancelled (for the log).
        self.last_step = 0
        self.cancelled_at_step: int | None = None

    def emit(self, event: object) -> None:
        try:
            self._loop.call_soon_threadsafe(self._events.put_nowait, event)
        except RuntimeError:  # the loop is closed: the service is shutting down
            self.cancel_event.set()

    def cancel(self) -> None:
        if not self.cancel_event.is_set():
            self.cancel_event.set()
            self.cancelled_at_step = self.last_step

    async def events(self) -> AsyncIterator[diffusion_pb2.ImageResponse]:
        """Progress and images in order, as the stream sends them; re-raises the worker's error, if any."""
        while True:
            event = await self._events.get()
            if event is _END:
                return
            if isinstance(event, BaseException):
                raise event
            yield event


class GenerationWorker:
    """Runs generations one at a time; at most `max_queue` wait behind the running one."""

    def __init__(self, engine: DiffusionEngine, max_queue: int, torch_threads: int = 0) -> None:
        self.engine = engine
        self.max_queue = max_queue
        self._pending = 0  # running + waiting; only touched on the event loop
        self._executor = concurrent.futures.ThreadPoolExecutor(
            1, thread_name_prefix="diffusion", initializer=_set_threads, initargs=(torch_threads,)
        )

    def submit(self, params: GenerationParams, started: float) -> Generation:
        """Queue a generation or raise ResourceExhausted when `max_queue` are already waiting."""
        if self._pending > self.max_queue:
            raise ResourceExhausted(
                f"the diffusion service is busy: one generation running and {self._pending - 1} waiting "
                f"(max_queue={self.max_queue}); retry later"
            )
        loop = asyncio.get_running_loop()
        generation = Generation(loop, started)
        self._pending += 1
        QUEUE_DEPTH.set(self._pending)
        # The worker's log lines carry the request id, like the rest of the request's.
        run = functools.partial(contextvars.copy_context().run, self._run, params, generation)
        future = loop.run_in_executor(self._executor, run)
        future.add_done_callback(self._finished)
        return generation

    def _finished(self, future: asyncio.Future) -> None:
        self._pending -= 1
        QUEUE_DEPTH.set(self._pending)

    def close(self) -> None:
        self._executor.shutdown(wait=True, cancel_futures=True)

    def _run(self, params: GenerationParams, generation: Generation) -> None:
        try:
            if generation.cancel_event.is_set():
                log.info("generation cancelled by the client before it started")
                CANCELLED.inc()
                return
            for index, seed in enumerate(params.seeds):
                generation.emit(self._image(params, index, seed, generation))
        except GenerationCancelled as stop:
            CANCELLED.inc()
            log.info(
                "generation cancelled by the client at step %d; the loop %s",
                generation.cancelled_at_step, stop,
            )  # fmt: skip
        except BaseException as exc:  # noqa: BLE001 - handed to the request, which maps it to a status
            generation.emit(exc)
        finally:
            generation.emit(_END)

    def _image(
        self, params: GenerationParams, index: int, seed: int, generation: Generation
    ) -> diffusion_pb2.ImageResponse:
        started = time.perf_counter()

        def on_step(step: int, total: int, latents: torch.Tensor) -> None:
            generation.last_step = step
            preview = b""
            if params.preview_every and step % params.preview_every == 0 and self.engine.preview.supports(latents):
                preview = self.engine.preview.png(latents)
            progress = diffusion_pb2.ImageProgress(
                image_index=index,
                step=step,
                total=total,
                elapsed_s=time.perf_counter() - generation.started,
                preview_png=preview,
            )
            generation.emit(diffusion_pb2.ImageResponse(progress=progress))

        image = self.engine.generate(params, seed, on_step, generation.cancel_event)
        text = parameters_text(
            prompt=prompt_with_loras(params.prompt, list(params.loras)),
            negative_prompt=params.negative_prompt,
            steps=params.steps,
            sampler=params.sampler.name,
            guidance_scale=params.guidance_scale,
            seed=seed,
            width=params.width,
            height=params.height,
            model=self.engine.name,
            scheduler_options=params.scheduler_options,
            strength=params.strength if params.init_image is not None else None,
            mask_blur=params.mask_blur if params.mask_image is not None else None,
            invert_mask=params.invert_mask,
            padding_mask_crop=params.padding_mask_crop,
        )
        png = encode_png(image, text)
        IMAGES.inc()
        IMAGE_SECONDS.observe(time.perf_counter() - started)
        return diffusion_pb2.ImageResponse(
            image=diffusion_pb2.GeneratedImage(
                index=index, seed=seed, png=png, width=image.width, height=image.height, parameters=text
            )
        )


def _set_threads(threads: int) -> None:
    if threads > 0:
        torch.set_num_threads(threads)

"""Server bootstrap: gRPC with health, reflection, metrics, one interceptor and graceful shutdown."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import signal
import time
from collections.abc import Awaitable, Callable

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from muestra.runtime.auth import BearerTokenInterceptor
from muestra.runtime.channels import channel_options
from muestra.runtime.config import ServiceConfig
from muestra.runtime.interceptor import ErrorMappingInterceptor
from muestra.runtime.logs import configure_logging
from muestra.runtime.metrics_http import start_metrics_server
from muestra.runtime.step_streams import draining, reset_draining

log = logging.getLogger("muestra.runtime")


@dataclasses.dataclass
class ServiceSpec:
    """What a service hands the runtime."""

    # Short name used in logs, flags and environment variables ("tokenizer", "lm", …).
    name: str
    # Adds the servicers to the server and returns their full service names
    # (e.g. "muestra.v1.Tokenizer") for health and reflection.
    register: Callable[[grpc.aio.Server], Awaitable[list[str]]]
    # Called once after the server has stopped.
    close: Callable[[], Awaitable[None]] | None = None
    # More server interceptors, run inside the error-mapping one (so their errors are mapped too).
    interceptors: list[grpc.aio.ServerInterceptor] = dataclasses.field(default_factory=list)
    # Asked every HEALTH_PROBE_S while serving: why the service should not get traffic, or None.
    # Its answer sets the health status of every service name (NOT_SERVING while it has a reason).
    health_probe: Callable[[], str | None] | None = None
    # Started when the service begins to stop, with the grace period; awaited once the server has
    # stopped. It runs while in-flight calls drain (the gateway ends its HTTP API and open streams there).
    drain: Callable[[float], Awaitable[None]] | None = None
    # Bearer tokens every RPC but health (and /metrics) needs; None: the internal token, when configured
    # (the tokenizer, lm and diffusion services). The gateway gives its API keys.
    tokens: list[str] | None = None
    token_name: str = "internal token"


HEALTH_PROBE_S = 1.0
# How often a lasting NOT_SERVING reason is logged again.
PROBLEM_LOG_S = 30.0


async def serve(spec: ServiceSpec, config: ServiceConfig, started: asyncio.Event | None = None) -> None:
    """Run until SIGTERM/SIGINT, then let in-flight requests finish within the grace period."""
    reset_draining()
    tokens = spec.tokens if spec.tokens is not None else [config.internal_token]
    placeholder = "key" if spec.token_name == "API key" else "token"
    server = grpc.aio.server(
        interceptors=[
            ErrorMappingInterceptor(), BearerTokenInterceptor(tokens, spec.token_name, placeholder), *spec.interceptors
        ],
        options=channel_options(config.max_message_bytes),
    )  # fmt: skip
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    names = await spec.register(server)
    reflection.enable_server_reflection([*names, health.SERVICE_NAME, reflection.SERVICE_NAME], server)
    port = server.add_insecure_port(f"{config.host}:{config.port}")
    if port == 0:
        raise SystemExit(f"cannot bind {config.host}:{config.port}")
    if config.metrics_port >= 0:
        metrics_port = start_metrics_server(config.host, config.metrics_port, tokens)
        needs = f" ({spec.token_name} required)" if any(tokens) else ""
        log.info("metrics on http://%s:%d/metrics%s", config.host, metrics_port, needs)
    await server.start()
    for name in ("", *names):
        await health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    log.info("%s serving %s on %s:%d", spec.name, ", ".join(names), config.host, port)
    if started is not None:
        started.set()

    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        try:
            loop.add_signal_handler(sig, stopping.set)
        except (NotImplementedError, RuntimeError):  # not the main thread (tests)
            pass
    watcher = asyncio.ensure_future(_exit_with_parent(stopping))
    prober = asyncio.ensure_future(_probe_health(spec, health_servicer, ["", *names]))
    waiter = asyncio.ensure_future(server.wait_for_termination())
    stopper = asyncio.ensure_future(stopping.wait())
    await asyncio.wait([waiter, stopper], return_when=asyncio.FIRST_COMPLETED)
    log.info("%s stopping: %.1fs grace for in-flight requests", spec.name, config.grace_period_s)
    prober.cancel()
    draining().set()  # idle step streams end (muestra.runtime.step_streams)
    await health_servicer.enter_graceful_shutdown()
    drainer = asyncio.ensure_future(spec.drain(config.grace_period_s)) if spec.drain is not None else None
    await server.stop(config.grace_period_s)
    if drainer is not None:
        await drainer
    stopper.cancel()
    watcher.cancel()
    if spec.close is not None:
        await spec.close()
    await asyncio.sleep(0)  # the tasks cancelled above take their cancellation
    # asyncio.run cancels what is left without a word: named here, a task that nobody waits for shows (one
    # collected while the service ran would have been "Task was destroyed but it is pending").
    left = sorted(_task_name(task) for task in asyncio.all_tasks() if task is not asyncio.current_task())
    log.info("%s stopped (tasks still running: %s)", spec.name, ", ".join(left) or "none")


def _task_name(task: asyncio.Task) -> str:
    coro = task.get_coro()
    return getattr(coro, "__qualname__", None) or repr(coro)


async def _probe_health(spec: ServiceSpec, health_servicer, names: list[str]) -> None:
    """Keep every name's health status in line with spec.health_probe (a stuck service is NOT_SERVING)."""
    if spec.health_probe is None:
        return
    problem = None
    logged_at = 0.0
    while True:
        await asyncio.sleep(HEALTH_PROBE_S)
        try:
            now = spec.health_probe()
        except Exception:
            log.exception("health probe failed")
            continue
        if (now is None) == (problem is None):
            # Still in the same state: a lasting problem is logged again every PROBLEM_LOG_S.
            if now is not None and time.monotonic() - logged_at >= PROBLEM_LOG_S:
                log.error("%s is still NOT_SERVING: %s", spec.name, now)
                logged_at = time.monotonic()
            problem = now
            continue
        if now is not None:
            log.error("%s is NOT_SERVING: %s", spec.name, now)
            logged_at = time.monotonic()
        else:
            log.info("%s is SERVING again", spec.name)
        problem = now
        status = health_pb2.HealthCheckResponse.NOT_SERVING if now else health_pb2.HealthCheckResponse.SERVING
        for name in names:
            await health_servicer.set(name, status)


async def _exit_with_parent(stopping: asyncio.Event) -> None:
    """With MUESTRA_EXIT_WITH_PARENT=<pid> (set by `muestra up`), stop when that process is gone."""
    parent = os.environ.get("MUESTRA_EXIT_WITH_PARENT")
    if not parent:
        return
    while os.getppid() == int(parent):
        await asyncio.sleep(1.0)
    log.warning("parent process %s is gone; stopping", parent)
    stopping.set()


def run_service(spec: ServiceSpec, config: ServiceConfig) -> None:
    """Entry point of every `python -m muestra.<service>`."""
    configure_logging(spec.name, config.log_level)
    asyncio.run(serve(spec, config))

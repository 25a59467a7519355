"""uvicorn in the gateway's own event loop, beside the grpc.aio server (so both share the schedulers)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket

import uvicorn

log = logging.getLogger("muestra.gateway.openai")


class _Uvicorn(uvicorn.Server):
    """A uvicorn server that leaves SIGTERM/SIGINT to the service runtime."""

    @contextlib.contextmanager
    def capture_signals(self):
        yield

    def install_signal_handlers(self) -> None:  # uvicorn < 0.29
        pass


def bind(host: str, port: int) -> socket.socket:
    """A listening socket on host:port (0: a free port); SystemExit naming the address when it is taken."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
        sock = socket.socket(family, kind, proto)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(1024)
    except OSError as exc:
        raise SystemExit(
            f"cannot bind the HTTP API to {host}:{port} ({exc.strerror or exc}); "
            "pass --http-port 0 for a free port, or --http-port -1 to turn the HTTP API off"
        ) from None
    sock.setblocking(False)
    return sock


class HttpServer:
    def __init__(self, app, host: str, port: int, grace_period_s: float) -> None:
        self.socket = bind(host, port)
        self.host = host
        self.port = self.socket.getsockname()[1]
        config = uvicorn.Config(
            app,
            log_config=None,
            access_log=False,
            lifespan="off",
            ws="none",
            timeout_graceful_shutdown=grace_period_s,
            server_header=False,
        )
        self.server = _Uvicorn(config)
        self.task: asyncio.Task | None = None

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    async def start(self) -> None:
        self.task = asyncio.ensure_future(self.server.serve(sockets=[self.socket]))
        while not self.server.started:
            if self.task.done():
                self.task.result()
                raise RuntimeError("the HTTP server stopped while starting")
            await asyncio.sleep(0.01)
        log.info("OpenAI-compatible HTTP API on %s/v1", self.url)

    async def stop(self) -> None:
        """Stop accepting, let open responses finish within the grace period, then return."""
        if self.task is None:
            return
        self.server.should_exit = True
        await self.task
        self.task = None

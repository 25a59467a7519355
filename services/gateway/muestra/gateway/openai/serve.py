"""uvicorn in the gateway's own event loop, beside the grpc.aio server (so both share the schedulers)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket

import h11
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

log = logging.getLogger("muestra.gateway.openai")
# h11 parses a 1-byte chunk of a chunked body in about 5 us: 4 KiB of them is some 4 ms of one loop turn.
FEED_BYTES = 4096
# How long a connection answered before its request body ended may go on sending (unread) before it is closed.
LINGER_S = 2.0


class _Uvicorn(uvicorn.Server):
    """A uvicorn server that leaves SIGTERM/SIGINT to the service runtime."""

    @contextlib.contextmanager
    def capture_signals(self):
        yield

    def install_signal_handlers(self) -> None:  # uvicorn < 0.29
        pass


class _FairH11Protocol(H11Protocol):
    """uvicorn's h11 protocol, fed FEED_BYTES per event-loop turn so that no connection holds the loop (a body in
    1-byte chunks costs a parse per byte), and closed once its answer is sent if the request body is unfinished
    (a 413 or a 408) instead of parsing the rest of a body nobody reads."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.unparsed = bytearray()
        self.next_feed: asyncio.Handle | None = None
        self.discarding = False
        self.linger: asyncio.TimerHandle | None = None

    def data_received(self, data: bytes) -> None:
        if self.discarding:
            return
        self.unparsed += data
        if self.next_feed is None:
            self._feed()

    def _feed(self) -> None:
        self.next_feed = None
        if self.discarding or not self.unparsed:
            # Answered mid-body meanwhile: nothing more is parsed (h11 takes an empty feed as the end of input).
            return
        piece = bytes(self.unparsed[:FEED_BYTES])
        del self.unparsed[:FEED_BYTES]
        super().data_received(piece)
        if self.unparsed and not self.discarding and not self.transport.is_closing():
            self.transport.pause_reading()
            self.next_feed = self.loop.call_soon(self._feed)
        elif not self.flow.read_paused and not self.transport.is_closing():
            self.transport.resume_reading()

    def on_response_complete(self) -> None:
        if self.conn.their_state is not h11.SEND_BODY or self.transport.is_closing():
            super().on_response_complete()
            return
        # Answered mid-body: read and drop what the client still sends for a while, so that it sees the answer
        # (closing with unread bytes would send it a reset), then close.
        self.server_state.total_requests += 1
        self.discarding = True
        self.unparsed.clear()
        if self.next_feed is not None:
            self.next_feed.cancel()
            self.next_feed = None
        if self.transport.can_write_eof():
            self.transport.write_eof()
        self.transport.resume_reading()
        self.linger = self.loop.call_later(LINGER_S, self.transport.close)

    def connection_lost(self, exc: Exception | None) -> None:
        for handle in (self.next_feed, self.linger):
            if handle is not None:
                handle.cancel()
        super().connection_lost(exc)


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
            http=_FairH11Protocol,
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

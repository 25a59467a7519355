"""uvicorn in the gateway's own event loop, beside the grpc.aio server (so both share the schedulers)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket

import h11
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from muestra.gateway.http.framing import ChunkedBody, block_end

log = logging.getLogger("muestra.gateway.openai")
# h11 parses a head or an unread body at most this much per event-loop turn (it refuses a head past 16 KiB).
FEED_BYTES = 4096
# A body's piece per turn: up to this many bytes, and of a chunked body this many chunks read one by one (about
# 1 us each; runs of equal chunks cost some 3 ns a byte), so that a turn stays well under a millisecond.
BODY_BYTES = 32 * 1024
BODY_CHUNKS = 128
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
    """uvicorn's h11 protocol, fed one piece per event-loop turn so that no connection holds the loop: a request
    head alone, then its body (a chunked one read in framing.py and given to h11 as one chunk a piece, since h11
    costs some 5 us a chunk); the next request waits here until this one is answered, so its head is parsed alone
    too. A connection answered before its request body ended (a 413 or a 408) is closed once its answer is sent
    instead of parsing the rest of a body nobody reads."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.unparsed = bytearray()
        self.next_feed: asyncio.Handle | None = None
        self.discarding = False
        self.linger: asyncio.TimerHandle | None = None
        self.block_next = True  # the next bytes are a header block: a request head, or a chunked body's trailers
        self.body_left = 0  # bytes of a Content-Length body still to give h11
        self.chunked: ChunkedBody | None = None

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
        if self.conn.their_state is h11.DONE:
            self.transport.pause_reading()  # a pipelined request: on_response_complete feeds it
            return
        piece, used, head_ended = self._next_piece()
        del self.unparsed[:used]
        if piece:
            super().data_received(piece)
        if head_ended:
            self._start_body()
        if self.discarding or self.transport.is_closing():
            return
        if self.unparsed and used:
            self.transport.pause_reading()
            self.next_feed = self.loop.call_soon(self._feed)
        elif not self.flow.read_paused:
            self.transport.resume_reading()  # all parsed, or what is left waits for more bytes

    def _next_piece(self) -> tuple[bytes, int, bool]:
        """(the bytes to give h11 now, how many unparsed bytes they stand for, whether they end a request head)."""
        if self.chunked is not None:
            piece, used = self.chunked.take(self.unparsed, BODY_BYTES, BODY_CHUNKS)
            if self.chunked.finished:
                self.block_next = self.chunked.trailers_next
                self.chunked = None
            return piece, used, False
        if self.body_left:
            used = min(self.body_left, BODY_BYTES, len(self.unparsed))
            self.body_left -= used
            return bytes(self.unparsed[:used]), used, False
        is_head = self.conn.their_state is h11.IDLE
        end = block_end(self.conn.trailing_data[0], self.unparsed, FEED_BYTES) if is_head or self.block_next else None
        self.block_next = end is None and self.block_next
        used = end or min(FEED_BYTES, len(self.unparsed))
        return bytes(self.unparsed[:used]), used, is_head and end is not None

    def _start_body(self) -> None:
        """After a head parsed alone: its body, if any, is given to h11 a piece at a time from here."""
        if self.conn.their_state is not h11.SEND_BODY or self.conn.trailing_data[0]:
            return  # no body, or h11 holds bytes past the head (then it parses the body itself)
        headers = dict(self.headers)
        if b"transfer-encoding" in headers:  # h11 accepts no coding but chunked
            self.chunked = ChunkedBody()
        elif headers.get(b"content-length", b"").isdigit():
            self.body_left = int(headers[b"content-length"])

    def on_response_complete(self) -> None:
        if self.conn.their_state is not h11.SEND_BODY or self.transport.is_closing():
            super().on_response_complete()
            if self.unparsed and self.next_feed is None and not self.transport.is_closing():
                self._feed()  # the next request, held while this one was answered
            return
        # Answered mid-body: read and drop what the client still sends for a while, so that it sees the answer
        # (closing with unread bytes would send it a reset), then close.
        self.server_state.total_requests += 1
        self.discarding = True
        self.unparsed.clear()
        self.chunked, self.body_left = None, 0
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
        self.closing: list = []  # coroutine functions run once the server has stopped (the response store's client)

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
        for close in self.closing:
            await close()

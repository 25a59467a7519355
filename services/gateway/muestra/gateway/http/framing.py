"""Request framing read ahead of h11: where a header block ends, and chunked bodies re-framed as one chunk per piece.

h11 spends about 5 us on each chunk of a chunked body, so a body in 1-byte chunks cost the gateway 5 us a byte
(an 8 MiB limit took 44 s to pass). Read here, a chunk costs about 1 us, and a run of chunks with the same header
is one regex match and a few slices; h11 still parses every head and trailer, and sees each piece of a body as
one chunk. What this reader does not accept it leaves to h11 untouched, at a chunk boundary, so h11 refuses it
as it would have."""

from __future__ import annotations

import re

# h11's grammar for a chunk header (h11/_abnf.py, which it fullmatches against the line up to its first CRLF).
CHUNK_HEADER = re.compile(rb"([0-9A-Fa-f]{1,20})(?:;.*?)?[ \t]*\r\n")
# h11 ends a header block (a request head, a body's trailers) at the first of these (h11/_receivebuffer.py).
BLANK_LINE = re.compile(rb"\n\r?\n")
# h11 refuses an event that has not ended within this many buffered bytes (its max_incomplete_event_size).
MAX_LINE = 16 * 1024
CRLF = b"\r\n"


def block_end(pending: bytes, data: bytes | bytearray, limit: int) -> int | None:
    """How many bytes of data end the header block h11 holds the start of (pending), as h11 finds its end; None
    when it does not end within data's first `limit` bytes."""
    if not pending:  # h11 takes a leading empty line as the whole block
        if data[:1] == b"\n":
            return 1
        if data[:2] == CRLF:
            return 2
    tail = bytes(pending[-2:])  # h11 resumes its search two bytes before the end of what it holds
    match = BLANK_LINE.search(tail + data[:limit])
    if match is None or match.end() <= len(tail):
        return None
    return match.end() - len(tail)


def _run_of(header: bytes, size: int) -> re.Pattern[bytes]:
    return re.compile(b"(?:" + re.escape(header) + b".{%d}\r\n)+" % size, re.DOTALL)


# Chunks under 16 bytes whose header is plainly their size are read a run at a time (a header with an extension
# or leading zeros is read alone: compiling a pattern per header would cost more than it saves).
RUNS = {b"%c\r\n" % digit: _run_of(b"%c\r\n" % digit, int(chr(digit), 16)) for digit in b"123456789abcdefABCDEF"}


def _gather(run: bytes | bytearray, header_len: int, size: int) -> bytearray:
    """The data of a run of chunks that share one header (so one period): a slice per byte of a chunk."""
    period = header_len + size + 2
    data = bytearray(len(run) // period * size)
    for offset in range(size):
        data[offset::size] = run[header_len + offset :: period]
    return data


class ChunkedBody:
    """One chunked request body, read from the bytes that follow its head."""

    def __init__(self) -> None:
        self.left_in_chunk = 0  # data bytes of the current chunk still to come
        self.footer_left = 0  # bytes of the CRLF after the current chunk's data still to come
        self.last_header = b""
        # Nothing more to read here: the last chunk's header was handed on (its trailers follow, a header block
        # for h11: trailers_next), or the next byte is one this reader does not accept (h11 takes over there).
        self.finished = False
        self.trailers_next = False

    def take(self, buf: bytearray, max_bytes: int, max_chunks: int) -> tuple[bytes, int]:
        """(the bytes to give h11, how many of buf's first bytes they stand for): about max_bytes of buf at most,
        and max_chunks chunks besides those in runs."""
        data: list[bytes | bytearray] = []
        end = min(len(buf), max_bytes)
        pos = self._go_on(buf, 0, end, data)
        chunks = 0
        last_chunk = b""
        while pos < end and chunks < max_chunks and not (self.finished or self.left_in_chunk or self.footer_left):
            match = CHUNK_HEADER.match(buf, pos)
            if match is None or match.end() - pos > MAX_LINE:
                # Not a chunk header h11 takes (then h11 refuses it), or not all here yet.
                self.finished = buf.find(CRLF, pos, pos + MAX_LINE) >= 0 or len(buf) - pos >= MAX_LINE
                break
            header = match[0]
            size = int(match[1], 16)
            if size == 0:
                last_chunk = header
                self.finished = self.trailers_next = True
                pos = match.end()
                break
            if header == self.last_header and header in RUNS:
                run = RUNS[header].match(buf, pos, end)
                if run is not None:
                    data.append(_gather(buf[pos : run.end()], len(header), size))
                    pos = run.end()
                    continue
            self.last_header = header
            chunks += 1
            stop = match.end() + size
            if buf[stop : stop + 2] == CRLF:  # the whole chunk is here
                data.append(buf[match.end() : stop])
                pos = stop + 2
            else:
                self.left_in_chunk = size
                pos = self._go_on(buf, match.end(), end, data)
        size = sum(len(piece) for piece in data)
        reframed = b"%x\r\n%b\r\n" % (size, b"".join(data)) if size else b""
        return reframed + last_chunk, pos

    def _go_on(self, buf: bytearray, pos: int, end: int, data: list) -> int:
        """Reads on in a chunk begun before pos (its data, then its CRLF); where it stopped."""
        if self.left_in_chunk:
            stop = min(end, pos + self.left_in_chunk)
            data.append(buf[pos:stop])
            self.left_in_chunk -= stop - pos
            if self.left_in_chunk:
                return stop
            pos, self.footer_left = stop, 2
        if self.footer_left:
            got = buf[pos : pos + self.footer_left]
            if got != CRLF[2 - self.footer_left :][: len(got)]:
                self.finished = True  # h11 takes these bytes for a chunk header, and refuses them
                return pos
            self.footer_left -= len(got)
            pos += len(got)
        return pos

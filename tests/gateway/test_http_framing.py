"""Chunked bodies read ahead of h11 (muestra.gateway.http.framing) give h11 the same body, trailers and refusals
as the client's own framing would, whatever the chunk sizes and however the bytes arrive."""

from __future__ import annotations

import random
import time

import h11
import pytest

from muestra.gateway.http.framing import ChunkedBody, block_end

HEAD = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"


def chunked(pieces: list[bytes], header: bytes = b"%x", end: bytes = b"0\r\n\r\n") -> bytes:
    return b"".join(header % len(piece) + b"\r\n" + piece + b"\r\n" for piece in pieces) + end


def h11_reads(wire: bytes) -> tuple[bytes, list]:
    """What h11 makes of HEAD + wire fed 4 KiB at a time, as the gateway feeds it: (body, trailers), or
    RemoteProtocolError."""
    conn = h11.Connection(h11.SERVER)
    data = HEAD + wire
    body = b""
    for start in range(0, len(data), 4096):
        conn.receive_data(data[start : start + 4096])
        while (event := conn.next_event()) is not h11.NEED_DATA:
            if isinstance(event, h11.Data):
                body += event.data
            elif isinstance(event, h11.EndOfMessage):
                return body, list(event.headers)
    raise AssertionError("h11 wants more bytes")


def read_ahead(wire: bytes, rng: random.Random, max_bytes: int = 64 * 1024) -> bytes:
    """The bytes the gateway gives h11 for HEAD + wire arriving in random reads: the head, then what ChunkedBody
    takes (re-framed), then the rest as it came once ChunkedBody has finished."""
    body = ChunkedBody()
    unparsed = bytearray()
    out = bytearray()
    pos = 0
    while pos < len(wire) or unparsed:
        read = rng.randint(1, 40) if rng.random() < 0.5 else rng.randint(1, 5000)
        unparsed += wire[pos : pos + read]
        pos += read
        while unparsed and not body.finished:
            piece, used = body.take(unparsed, max_bytes, 7)
            out += piece
            del unparsed[:used]
            if not used:
                break
        if body.finished:
            out += unparsed
            unparsed.clear()
    return bytes(out)


BODIES = {
    "one-byte chunks": [b"x"] * 3000,
    "one-byte chunks of every byte": [bytes([b]) for b in range(256)] * 3,
    "runs of each size under 16": [bytes(range(size)) * 1 for size in range(1, 16) for _ in range(50)],
    "alternating sizes": [b"a", b"bc"] * 500,
    "data that looks like framing": [b"1\r\nx\r\n", b"\r\n", b"0\r\n\r\n", b"\n\r\n"] * 40,
    "one large chunk": [bytes(range(256)) * 800],
    "random sizes": [bytes([65 + n % 26]) * n for n in random.Random(0).choices(range(1, 300), k=400)],
}


@pytest.mark.parametrize("name", sorted(BODIES))
@pytest.mark.parametrize("header", [b"%x", b"%X", b"000%x", b"%x;name=value", b'%x;a;b="c" ', b"%x \t"])
def test_h11_reads_the_same_body_from_the_re_framed_bytes(name, header):
    wire = chunked(BODIES[name], header=header, end=b"0;last\r\nTrailer-One: 1\r\nTrailer-Two: 2\r\n\r\n")
    expected = h11_reads(wire)
    for seed in range(3):
        reframed = read_ahead(wire, random.Random(seed))
        assert h11_reads(reframed) == expected


@pytest.mark.parametrize(
    "wire",
    [
        b"1\r\nx\r\n1\r\nyX\r\n0\r\n\r\n",  # no CRLF after a chunk's data
        b"1\r\nx\r\n1\r\nx\r\nzz\r\nx\r\n0\r\n\r\n",  # not a hex size
        b"1\r\nx\r\n" * 40 + b"1\r\nx\n0\r\n\r\n",  # a bare LF after the data
        b"1\r\nx\r\n1\nx\r\n0\r\n\r\n",  # a header ending in a bare LF
        b"1\r\nx\r\n1 ;a\r\nx\r\n0\r\n\r\n",  # space before an extension
        b"1\r\nx\r\n" + b"1;" + b"e" * 30000 + b"\r\nx\r\n0\r\n\r\n",  # a header past h11's 16 KiB
    ],
)
def test_a_malformed_body_is_refused_by_h11_as_before(wire):
    with pytest.raises(h11.RemoteProtocolError):
        h11_reads(wire)
    for seed in range(3):
        with pytest.raises(h11.RemoteProtocolError):
            h11_reads(read_ahead(wire, random.Random(seed)))


def test_the_last_chunk_and_its_trailers_are_left_to_h11():
    body = ChunkedBody()
    buf = bytearray(chunked([b"ab", b"cd"], end=b"0\r\nX-Trailer: 1\r\n\r\nGET / HTTP/1.1\r\n"))
    piece, used = body.take(buf, 1 << 20, 100)
    assert piece == b"4\r\nabcd\r\n0\r\n" and body.finished and body.trailers_next
    rest = buf[used:]
    assert rest[: block_end(b"", rest, 4096)] == b"X-Trailer: 1\r\n\r\n"


@pytest.mark.parametrize("split", [1, 5, 30, len(HEAD) - 4, len(HEAD) - 3, len(HEAD) - 2, len(HEAD) - 1])
def test_a_head_ends_where_h11_ends_it_however_it_is_split(split):
    wire = HEAD + b"5\r\nhello\r\n"
    pending, data = wire[:split], wire[split:]
    end = block_end(pending, data, 4096)
    assert pending + data[:end] == HEAD
    assert block_end(b"", b"\r\nGET", 4096) == 2 and block_end(b"", b"GET / HTTP/1.1\r\n", 4096) is None
    assert block_end(b"GET /\n", b"\nrest", 4096) == 1 and block_end(b"GET /", b"x" * 5000 + b"\r\n\r\n", 4096) is None


def test_one_byte_chunks_cost_a_few_nanoseconds_a_byte():
    wire = bytearray(b"1\r\nx\r\n" * 100_000)
    body = ChunkedBody()
    started = time.perf_counter()
    taken = 0
    while taken < len(wire):
        _, used = body.take(wire[taken : taken + 64 * 1024], 64 * 1024, 256)
        taken += used
    per_byte = (time.perf_counter() - started) / len(wire)
    # h11 alone: about 1 us a byte; read here about 3 ns (50 on a loaded machine still passes).
    assert per_byte < 100e-9, f"{per_byte * 1e9:.0f} ns a byte"

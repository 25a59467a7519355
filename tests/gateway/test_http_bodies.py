"""Hostile request bodies over a raw socket: a body in 1-byte chunks gets its 413 as soon as the limit is passed,
a body that trickles in gets 408 at the body deadline, and other clients keep their pace all the while (issues
33 and 48); a chunked body, read ahead of h11, reaches the routes whole, and a request pipelined after it too."""

from __future__ import annotations

import json
import socket
import statistics
import time

import pytest

from tests.harness import free_port
from tests.http_attacks import (
    Attack,
    bystander_bound,
    bystander_latencies,
    completion_latencies,
    one_byte_chunks,
)

MAX_BODY = 8 * 1024 * 1024  # the default
BODY_TIMEOUT_S = 4.0
CHUNKED = "Transfer-Encoding: chunked\r\nContent-Type: application/json\r\n"


@pytest.fixture(scope="module")
def port(text_stack) -> int:
    port = free_port()
    text_stack(
        "llama", "--http-port", str(port), "--http-max-body-bytes", str(MAX_BODY),
        "--http-body-timeout-s", str(BODY_TIMEOUT_S),
    )  # fmt: skip
    return port


def test_a_50_mb_body_in_one_byte_chunks_gets_413_within_seconds_and_others_keep_their_pace(port):
    # 300 MB on the wire; the limit is passed after 8M chunks (48 MB). h11 alone took 44 s to get there, while
    # a bystander's completions took 6x as long (issue 48).
    baseline = statistics.median(completion_latencies(port, lambda: False, at_least=10))
    attack = Attack(port, CHUNKED, one_byte_chunks(50_000_000))
    try:
        latencies = completion_latencies(port, attack.running, at_least=3)
    finally:
        attack.close()
    ratio = statistics.median(latencies) / baseline
    print(f"1-byte chunks: 413 after {attack.answered_after}s; bystanders {ratio:.2f}x their {baseline:.3f}s")
    assert attack.status() == 413 and attack.error()["code"] == "body_too_large", attack.answer[:300]
    assert attack.answered_after is not None and attack.answered_after < 5.0, attack.answered_after
    assert ratio < 2.0, f"bystanders took {sorted(latencies)} against {baseline:.3f}s before"


def test_a_body_in_one_byte_chunks_reaches_the_route_whole_and_a_pipelined_request_follows(port):
    body = json.dumps({"model": "", "prompt": "Hi there", "max_tokens": 2, "temperature": 0}).encode()
    framed = b"".join(b"1;ext=x\r\n" + body[i : i + 1] + b"\r\n" for i in range(len(body)))
    head = f"POST /v1/completions HTTP/1.1\r\nHost: x\r\n{CHUNKED}"
    second = b"GET /v1/models HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(head.encode() + b"\r\n" + framed + b"0\r\nX-Trailer: 1\r\n\r\n" + second)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    first, _, rest = answer.partition(b"\r\n\r\n")
    assert first.startswith(b"HTTP/1.1 200"), answer[:300]
    assert b'"text_completion"' in rest and b"HTTP/1.1 200" in rest and b'"object":"list"' in rest, rest[-300:]


def test_a_body_that_trickles_in_gets_408_at_the_body_deadline(port):
    def trickle(sock: socket.socket) -> None:
        sock.sendall(b'{"prompt": "')
        for _ in range(200):  # 40 s at 5 bytes a second, far past the deadline
            time.sleep(0.2)
            sock.sendall(b"x")

    bound = bystander_bound(port)
    attack = Attack(port, "Content-Length: 1000\r\nContent-Type: application/json\r\n", trickle)
    try:
        latencies = bystander_latencies(port, attack.running)
    finally:
        attack.close()
    print(f"trickle: answered after {attack.answered_after}s; bystanders' slowest {max(latencies):.3f}s < {bound}")
    assert attack.status() == 408 and attack.error()["code"] == "body_timeout", attack.answer[:300]
    assert BODY_TIMEOUT_S - 0.5 < attack.answered_after < BODY_TIMEOUT_S + 3, attack.answered_after
    assert max(latencies) < bound, f"bystanders waited {sorted(latencies)[-3:]}"

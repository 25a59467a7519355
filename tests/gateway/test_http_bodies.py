"""Hostile request bodies over a raw socket: a body in 1-byte chunks gets its 413 as the bytes arrive, a body that
trickles in gets 408 at the body deadline, and other clients are answered quickly all the while (issue 33)."""

from __future__ import annotations

import socket
import time

import pytest

from tests.harness import free_port
from tests.http_attacks import Attack, bystander_bound, bystander_latencies, one_byte_chunks

MAX_BODY = 64 * 1024
BODY_TIMEOUT_S = 4.0


@pytest.fixture(scope="module")
def port(text_stack) -> int:
    port = free_port()
    text_stack(
        "llama", "--http-port", str(port), "--http-max-body-bytes", str(MAX_BODY),
        "--http-body-timeout-s", str(BODY_TIMEOUT_S),
    )  # fmt: skip
    return port


def test_a_body_in_one_byte_chunks_gets_413_quickly_and_nobody_waits(port):
    # 32x the limit, 12 MiB on the wire: the 413 comes once the limit is passed, and the rest is not parsed.
    bound = bystander_bound(port)
    headers = "Transfer-Encoding: chunked\r\nContent-Type: application/json\r\n"
    attack = Attack(port, headers, one_byte_chunks(MAX_BODY * 32))
    try:
        latencies = bystander_latencies(port, attack.running)
    finally:
        attack.close()
    print(f"1-byte chunks: answer after {attack.answered_after}s; bystanders' slowest {max(latencies):.3f}s < {bound}")
    assert attack.status() == 413 and attack.error()["code"] == "body_too_large", attack.answer[:300]
    # About 64k chunks at a few microseconds each, the loop shared with the bystanders.
    assert attack.answered_after is not None and attack.answered_after < 10.0, attack.answered_after
    assert max(latencies) < bound, f"bystanders waited {sorted(latencies)[-3:]}"


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

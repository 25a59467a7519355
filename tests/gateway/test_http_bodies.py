"""Hostile request bodies over a raw socket: a body in 1-byte chunks gets its 413 as the bytes arrive, a body that
trickles in gets 408 at the body deadline, and other clients are answered quickly all the while (issue 33)."""

from __future__ import annotations

import json
import socket
import threading
import time
import urllib.request
from collections.abc import Callable

import pytest

from tests.harness import free_port

MAX_BODY = 64 * 1024
BODY_TIMEOUT_S = 4.0
BYSTANDER_S = 1.0  # a tiny request's answer takes ~10 ms on an idle machine (see bystander_bound)


@pytest.fixture(scope="module")
def port(text_stack) -> int:
    port = free_port()
    text_stack(
        "llama", "--http-port", str(port), "--http-max-body-bytes", str(MAX_BODY),
        "--http-body-timeout-s", str(BODY_TIMEOUT_S),
    )  # fmt: skip
    return port


class Attack:
    """One raw connection that sends a POST's headers, then whatever `send_body` writes; its answer is timed."""

    def __init__(self, port: int, headers: str, send_body: Callable[[socket.socket], None]) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=120)
        self.sock.sendall(f"POST /v1/completions HTTP/1.1\r\nHost: x\r\n{headers}\r\n".encode())
        self.started = time.monotonic()
        self.answered_after: float | None = None
        self.answer = b""
        self.sender = threading.Thread(target=self._send, args=(send_body,), daemon=True)
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.sender.start()
        self.reader.start()

    def _send(self, send_body) -> None:
        try:
            send_body(self.sock)
        except OSError:
            pass  # the server closed after answering

    def _read(self) -> None:
        while True:
            try:
                data = self.sock.recv(65536)
            except OSError:
                return
            if not data:
                return
            if not self.answer:
                self.answered_after = time.monotonic() - self.started
            self.answer += data

    def status(self) -> int:
        return int(self.answer.split(b" ", 2)[1]) if self.answer.startswith(b"HTTP/1.1 ") else 0

    def error(self) -> dict:
        return json.loads(self.answer.partition(b"\r\n\r\n")[2])["error"]

    def running(self) -> bool:
        return self.reader.is_alive() and time.monotonic() - self.started < 30

    def close(self) -> None:
        self.sock.close()
        self.sender.join(5)
        self.reader.join(5)


def bystander_latencies(port: int, running: Callable[[], bool]) -> list[float]:
    """A tiny request at a time (the model list, then a 1-token completion) while running(): seconds each."""
    root = f"http://127.0.0.1:{port}"
    completion = json.dumps({"model": "", "prompt": "Hi", "max_tokens": 1}).encode()
    latencies = []
    while running() or len(latencies) < 2:
        started = time.monotonic()
        if len(latencies) % 2:
            request = urllib.request.Request(root + "/v1/completions", data=completion, method="POST")
            request.add_header("Content-Type", "application/json")
        else:
            request = urllib.request.Request(root + "/v1/models")
        with urllib.request.urlopen(request, timeout=120) as response:
            assert response.status == 200
            response.read()
        latencies.append(time.monotonic() - started)
        time.sleep(0.05)
    return latencies


def bystander_bound(port: int) -> float:
    """BYSTANDER_S, or 4x the slowest of a few tiny requests with no attack where the machine is that loaded."""
    return max(BYSTANDER_S, 4 * max(bystander_latencies(port, lambda: False) * 2))


def one_byte_chunks(total: int) -> Callable[[socket.socket], None]:
    def send(sock: socket.socket) -> None:
        burst = b"1\r\nx\r\n" * 8192
        for _ in range(total // 8192):
            sock.sendall(burst)
        sock.sendall(b"0\r\n\r\n")

    return send


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

"""Hostile HTTP bodies over raw sockets, and a bystander timing tiny requests meanwhile.

Used by tests/gateway/test_http_bodies.py and tests/fuzz/test_http_fuzz.py."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import threading
import time
import urllib.request
from collections.abc import Callable

ATTACKER_NICE = 19
BYSTANDER_S = 1.0  # a tiny request's answer takes ~10 ms on an idle machine (see bystander_bound)


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
        # A real attacker sends from its own machine; here it shares two cores with the services it attacks, so
        # its thread yields them the CPU (Linux nices a thread alone): what the bystanders measure is how the
        # gateway shares its time, not the attacking client's own CPU use.
        with contextlib.suppress(OSError):
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), ATTACKER_NICE)
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


def completion_latencies(port: int, running: Callable[[], bool], at_least: int = 0) -> list[float]:
    """A 1-token completion at a time while running() (and until at_least are timed): seconds each."""
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/completions", method="POST", headers={"Content-Type": "application/json"},
        data=json.dumps({"model": "", "prompt": "Hi", "max_tokens": 1}).encode(),
    )  # fmt: skip
    latencies = []
    while running() or len(latencies) < at_least:
        started = time.monotonic()
        with urllib.request.urlopen(request, timeout=120) as response:
            assert response.status == 200
            response.read()
        latencies.append(time.monotonic() - started)
        time.sleep(0.02)
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

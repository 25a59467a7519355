"""Child processes on loopback ports: free ports, the gRPC health check, and one process that is started until it
serves, paused, killed, stopped and restarted on the same port."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

_HANDED_OUT: set[int] = set()


def free_port(host: str = "127.0.0.1") -> int:
    """A free port on `host` never handed out before in this process: each probe socket closes at once, so the
    kernel may offer the same port to two calls, and two services of one stack would then race for it."""
    while True:
        with socket.socket() as sock:
            sock.bind((host, 0))
            port = sock.getsockname()[1]
        if port not in _HANDED_OUT:
            _HANDED_OUT.add(port)
            return port


def healthy(address: str) -> bool:
    """Whether the gRPC health service at `address` says SERVING now (False while it does not answer)."""
    try:
        with grpc.insecure_channel(address) as channel:
            reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=1)
            return reply.status == health_pb2.HealthCheckResponse.SERVING
    except grpc.RpcError:
        return False


def rss_bytes(pid: int) -> int:
    """Resident set size of a live process (0 once it is gone)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def service_command(name: str, port: int, args: list[str], host: str = "127.0.0.1") -> list[str]:
    """`python -m muestra.<name>` on host:port, with this interpreter."""
    return [sys.executable, "-m", f"muestra.{name}", "--host", host, "--port", str(port), *args]


class StartFailed(RuntimeError):
    """A process exited, or did not serve in time, while it was being started."""

    def __init__(self, process: Process, why: str, exited: bool) -> None:
        super().__init__(f"{process.name} {why}:\n{process.log_tail()}")
        self.process = process
        self.exited = exited  # else it was still running when the time ran out


class Process:
    """One child process on a fixed port: started until it serves, paused, killed, stopped, and restarted on the
    same port, so that the addresses others were given stay valid.

    Its output goes to `log_path`: the first start truncates the file, each restart appends under a ==== line.
    It is ready when its gRPC health check says SERVING, or with `grpc_health=False` when its port accepts.
    """

    def __init__(
        self, name: str, command: list[str], log_path: Path, port: int, *, host: str = "127.0.0.1",
        grpc_health: bool = True, env: dict | None = None, stdin_text: str | None = None, new_session: bool = False,
    ) -> None:  # fmt: skip
        self.name = name
        self.command = command
        self.log_path = Path(log_path)
        self.host = host
        self.port = port
        self.address = f"{host}:{port}"
        self.grpc_health = grpc_health
        self.env = env
        # Written to its standard input, then closed: secrets reach it there, never on its command line.
        self.stdin_text = stdin_text
        # A session of its own: a Ctrl-C in the terminal reaches only the parent, which stops the children in order.
        self.new_session = new_session
        self.proc: subprocess.Popen | None = None
        self.starts = 0
        self.metrics_url = ""  # set by whoever gave it a metrics port

    @property
    def pid(self) -> int:
        return self.proc.pid if self.proc is not None else 0

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def spawn(self) -> None:
        """Start the process without waiting for it."""
        self.starts += 1
        with open(self.log_path, "ab" if self.starts > 1 else "wb") as log_file:
            if self.starts > 1:
                log_file.write(f"\n==== start {self.starts}: {' '.join(self.command)}\n".encode())
                log_file.flush()
            self.proc = subprocess.Popen(
                self.command, stdout=log_file, stderr=subprocess.STDOUT, env=self.env,
                stdin=subprocess.PIPE if self.stdin_text is not None else subprocess.DEVNULL,
                start_new_session=self.new_session,
            )  # fmt: skip
        if self.stdin_text is not None:
            self.proc.stdin.write(self.stdin_text.encode())
            self.proc.stdin.close()

    def ready(self) -> bool:
        if self.grpc_health:
            return healthy(self.address)
        try:
            with socket.create_connection((self.host, self.port), timeout=0.2):
                return True
        except OSError:
            return False

    def start(self, timeout_s: float = 180.0, cancelled: Callable[[], bool] = lambda: False) -> bool:
        """spawn() and wait until it is ready; False where `cancelled()` came true first (it is left running).

        StartFailed when it exits or is not ready within `timeout_s`."""
        self.spawn()
        deadline = time.monotonic() + timeout_s
        while not self.ready():
            if cancelled():
                return False
            if self.proc.poll() is not None:
                raise StartFailed(self, f"exited with {self.proc.returncode}", exited=True)
            if time.monotonic() > deadline:
                raise StartFailed(self, f"not ready after {timeout_s:.0f}s", exited=False)
            time.sleep(0.1)
        return True

    def kill(self) -> None:
        """SIGKILL and reap."""
        if self.alive():
            self.proc.send_signal(signal.SIGCONT)  # a stopped process dies only once continued
            self.proc.kill()
            self.proc.wait()

    def pause(self) -> None:
        if self.alive():
            self.proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        if self.alive():
            self.proc.send_signal(signal.SIGCONT)

    def stop(self, timeout_s: float = 30.0) -> int | None:
        """SIGTERM and wait (SIGKILL after timeout_s); the exit code (None if it never started)."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode

    terminate = stop  # the name some LocalStack tests use

    def rss(self) -> int:
        return rss_bytes(self.pid) if self.alive() else 0

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"


class ServiceProcess(Process):
    """`python -m muestra.<name>` on a free loopback port, serving once constructed; its log is
    <log_dir>/<name>-<port>.log and its environment this process's with `env` on top."""

    def __init__(self, name: str, args: list[str], log_dir: Path, env: dict | None = None) -> None:
        port = free_port()
        log_path = Path(log_dir) / f"{name}-{port}.log"
        super().__init__(name, service_command(name, port, args), log_path, port, env={**os.environ, **(env or {})})
        try:
            self.start(timeout_s=120.0)
        except Exception as exc:
            self.stop()
            raise RuntimeError(f"{name} failed to start:\n{self.log_tail()}") from exc

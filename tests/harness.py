"""Starting real services and a real redis-server on loopback ports for the tests."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

_HANDED_OUT: set[int] = set()


def free_port() -> int:
    """A free loopback port never handed out before in this process: each probe socket closes at once, so the kernel
    may offer the same port to two calls, and two services of one stack would then race for it."""
    while True:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        if port not in _HANDED_OUT:
            _HANDED_OUT.add(port)
            return port


def wait_serving(address: str, proc: subprocess.Popen | None = None, timeout_s: float = 120.0) -> None:
    """Block until the gRPC health service at `address` says SERVING (or the process died)."""
    deadline = time.monotonic() + timeout_s
    with grpc.insecure_channel(address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        while time.monotonic() < deadline:
            if proc is not None and proc.poll() is not None:
                raise RuntimeError(f"service at {address} exited with {proc.returncode}")
            try:
                if (
                    stub.Check(health_pb2.HealthCheckRequest(), timeout=1).status
                    == health_pb2.HealthCheckResponse.SERVING
                ):
                    return
            except grpc.RpcError:
                time.sleep(0.1)
    raise TimeoutError(f"{address} not SERVING after {timeout_s}s")


class ServiceProcess:
    """One muestra service, `python -m muestra.<name>`, as a child process on a loopback port."""

    def __init__(self, name: str, args: list[str], log_dir: Path, env: dict | None = None) -> None:
        self.name = name
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.log_path = log_dir / f"{name}-{self.port}.log"
        full_env = {**os.environ, **(env or {})}
        with open(self.log_path, "wb") as log_file:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", f"muestra.{name}", "--host", "127.0.0.1", "--port", str(self.port), *args],
                stdout=log_file,
                stderr=subprocess.STDOUT,
                env=full_env,
            )
        try:
            wait_serving(self.address, self.proc)
        except Exception as exc:
            self.stop()
            raise RuntimeError(f"{name} failed to start:\n{self.log_tail()}") from exc

    def log_tail(self, lines: int = 40) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def stop(self, timeout_s: float = 15.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


class RedisServer:
    """A throwaway redis-server on an ephemeral loopback port, no persistence."""

    def __init__(self, workdir: Path, extra_args: tuple[str, ...] = (), tls: tuple[Path, Path] | None = None) -> None:
        """`tls` = (certificate, key): serve TLS only on the port (self.url is then rediss:// without a CA)."""
        binary = shutil.which("redis-server")
        if binary is None:
            raise RuntimeError("redis-server is not installed (apt-get install -y redis-server)")
        self.port = free_port()
        scheme = "rediss" if tls else "redis"
        self.url = f"{scheme}://127.0.0.1:{self.port}/0"
        self.workdir = workdir
        ports = ["--port", str(self.port)]
        if tls:
            cert, key = tls
            ports = ["--port", "0", "--tls-port", str(self.port), "--tls-cert-file", str(cert),
                     "--tls-key-file", str(key), "--tls-auth-clients", "no"]  # fmt: skip
        self.args = [
            binary, *ports, "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
            "--pidfile", str(workdir / f"redis-{self.port}.pid"), "--dir", str(workdir), *extra_args,
        ]  # fmt: skip
        self.start()

    def start(self) -> None:
        self.proc = subprocess.Popen(self.args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                    return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("redis-server did not start")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(10)

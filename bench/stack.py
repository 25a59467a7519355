"""The whole stack as local processes on loopback, for the soak and chaos runs (and their tests).

    stack = LocalStack(log_dir, lm_replicas=2)   # redis-server, tokenizer, 2 lm, diffusion, gateway
    stack.lm[0].kill(); stack.lm[0].start()      # SIGKILL, then restart on the same port
    stack.tokenizer.pause(); stack.tokenizer.resume()
    stack.close()

Every service keeps its port across restarts, so the gateway's configured addresses stay valid.
Services run models/tiny-text-fixture (the tests' text model) and models/muestra-image unless others
are given, configured as `muestra up` configures them: an internal token between services, one cache
key, a Redis password (all fresh per stack, passed in the environment and on Redis's standard input).
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

# One record of the ports handed out in this process: the tests start stacks of both kinds side by side.
from tests.harness import free_port

# redis-server's memory limit here (allkeys-lru; docker-compose.yml gives it 1gb unless MUESTRA_REDIS_MAXMEMORY says).
REDIS_MAXMEMORY = 256 * 1024 * 1024

ROOT = Path(__file__).resolve().parents[1]
TEXT_FIXTURE = ROOT / "models" / "tiny-text-fixture"
# The default text model (`make default-model`): its 4-bit layers are where a row's bits could depend on its batch.
DEFAULT_TEXT_MODEL = ROOT / "models" / "smollm2-135m-instruct"
DEFAULT_IMAGE_MODEL = ROOT / "models" / "muestra-image"


def _healthy(address: str) -> bool:
    import grpc

    from muestra.runtime.healthcheck import check

    try:
        return check(address, timeout_s=1) == "SERVING"
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


class Process:
    """One child process with a fixed port: start, SIGKILL, SIGSTOP/SIGCONT, SIGTERM, restart."""

    def __init__(
        self, name: str, command: list[str], log_dir: Path, port: int, grpc_health: bool = True,
        env: dict | None = None, stdin_text: str | None = None,
    ) -> None:  # fmt: skip
        self.name = name
        self.command = command
        self.env = env
        self.stdin_text = stdin_text
        self.port = port
        self.address = f"127.0.0.1:{port}"
        self.log_path = log_dir / f"{name}.log"
        self.grpc_health = grpc_health
        self.proc: subprocess.Popen | None = None
        self.starts = 0
        self.metrics_url = ""  # set by _service when the stack exports metrics

    @property
    def pid(self) -> int:
        return self.proc.pid if self.proc is not None else 0

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self, timeout_s: float = 180.0) -> None:
        self.starts += 1
        with open(self.log_path, "ab") as log_file:
            log_file.write(f"\n==== start {self.starts}: {' '.join(self.command)}\n".encode())
            log_file.flush()
            self.proc = subprocess.Popen(
                self.command, stdout=log_file, stderr=subprocess.STDOUT, env=self.env,
                stdin=subprocess.PIPE if self.stdin_text is not None else subprocess.DEVNULL,
            )  # fmt: skip
        if self.stdin_text is not None:
            self.proc.stdin.write(self.stdin_text.encode())
            self.proc.stdin.close()
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode}:\n{self.log_tail()}")
            if self._ready():
                return
            time.sleep(0.1)
        raise TimeoutError(f"{self.name} not ready after {timeout_s:.0f}s:\n{self.log_tail()}")

    def _ready(self) -> bool:
        if self.grpc_health:
            return _healthy(self.address)
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                return True
        except OSError:
            return False

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

    def terminate(self, timeout_s: float = 30.0) -> int | None:
        """SIGTERM and wait (SIGKILL after timeout_s); the exit code."""
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

    def rss(self) -> int:
        return rss_bytes(self.pid) if self.alive() else 0

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"


def _service(name: str, label: str, args: list[str], log_dir: Path, env: dict, metrics: bool = False) -> Process:
    port = free_port()
    command = [sys.executable, "-m", f"muestra.{name}", "--host", "127.0.0.1", "--port", str(port), *args]
    metrics_port = free_port() if metrics else -1
    command += ["--metrics-port", str(metrics_port)]  # after args: the last flag wins
    process = Process(label, command, log_dir, port, env=env)
    process.metrics_url = f"http://127.0.0.1:{metrics_port}/metrics" if metrics else ""
    return process


class LocalStack:
    """redis-server, tokenizer, `lm_replicas` lm processes, diffusion (optional) and a gateway with HTTP."""

    def __init__(
        self,
        log_dir: Path,
        lm_replicas: int = 1,
        text_model: Path = TEXT_FIXTURE,
        image_model: Path | None = DEFAULT_IMAGE_MODEL,
        redis: bool = True,
        gateway_args: tuple[str, ...] = (),
        lm_args: tuple[str, ...] = (),
        log_level: str = "INFO",
        grace_period_s: float = 20.0,
        metrics: bool = False,
    ) -> None:
        self.log_dir = Path(log_dir)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        common = ["--log-level", log_level, "--grace-period-s", str(grace_period_s)]
        self.internal_token = secrets.token_urlsafe(24)
        env = {
            **os.environ,
            "MUESTRA_INTERNAL_TOKEN": self.internal_token,
            "MUESTRA_CACHE_KEY": secrets.token_urlsafe(24),
        }
        self.redis: Process | None = None
        redis_url: list[str] = []
        if redis:
            binary = shutil.which("redis-server")
            if binary is None:
                raise RuntimeError("redis-server is not installed (apt-get install -y redis-server)")
            port = free_port()
            self.redis_url = f"redis://127.0.0.1:{port}/0"
            self.redis_password = secrets.token_urlsafe(24)
            command = [
                binary, "-", "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                "--maxmemory", str(REDIS_MAXMEMORY), "--maxmemory-policy", "allkeys-lru", "--dir", str(self.log_dir),
                "--pidfile", str(self.log_dir / f"redis-{port}.pid"),
            ]  # fmt: skip
            self.redis = Process(
                "redis",
                command,
                self.log_dir,
                port,
                grpc_health=False,
                stdin_text=f"requirepass {self.redis_password}\n",
            )
            env["MUESTRA_REDIS_PASSWORD"] = self.redis_password
            redis_url = ["--redis-url", self.redis_url]
        self.tokenizer = _service(
            "tokenizer", "tokenizer", ["--models", str(text_model), *common], self.log_dir, env, metrics
        )
        lm_flags = ["--model", str(text_model), "--providers", "cpu", "--intra-op-threads", "1", *redis_url]
        self.lm = [
            _service("lm", f"lm{i}", [*lm_flags, *lm_args, *common], self.log_dir, env, metrics)
            for i in range(lm_replicas)
        ]
        self.diffusion = None
        if image_model is not None:
            self.diffusion = _service(
                "diffusion", "diffusion", ["--model", str(image_model), *redis_url, *common], self.log_dir, env, metrics
            )
        self.http_port = free_port()
        gateway_flags = [
            "--tokenizer-addr", self.tokenizer.address,
            "--lm-addr", ",".join(lm.address for lm in self.lm),
            "--http-port", str(self.http_port), *redis_url, *common,
        ]  # fmt: skip
        if self.diffusion is not None:
            gateway_flags += ["--diffusion-addr", self.diffusion.address]
        self.gateway = _service("gateway", "gateway", [*gateway_flags, *gateway_args], self.log_dir, env, metrics)
        self.base_url = f"http://127.0.0.1:{self.http_port}/v1"
        self.started: list[Process] = []
        try:
            for process in self.processes():
                process.start()
                self.started.append(process)
        except BaseException:
            self.close()
            raise

    def processes(self) -> list[Process]:
        """In start order."""
        return [p for p in (self.redis, self.tokenizer, *self.lm, self.diffusion, self.gateway) if p is not None]

    def services(self) -> list[Process]:
        return [p for p in self.processes() if p is not self.redis]

    def rss(self) -> dict[str, int]:
        return {p.name: p.rss() for p in self.processes()}

    def close(self) -> None:
        for process in reversed(self.started):
            process.terminate()

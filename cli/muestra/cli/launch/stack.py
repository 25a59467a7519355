"""A whole stack as local processes on free loopback ports: redis-server, tokenizer, lm replicas, diffusion, gateway.

    stack = LocalStack(log_dir, text_model, image_model, lm_replicas=2)
    stack.lm[0].kill(); stack.lm[0].start()      # SIGKILL, then restart on the same port
    stack.tokenizer.pause(); stack.tokenizer.resume()
    stack.close()

Every service keeps its port across restarts, so the gateway's configured addresses stay valid. The services are
configured as `muestra up` configures them: an internal token between services, one cache key, a Redis password
(all fresh per stack, passed in the environment and on Redis's standard input).
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

from muestra.cli.launch.process import Process, free_port, service_command
from muestra.cli.launch.redis_server import RedisServer

# redis-server's memory limit here (allkeys-lru; docker-compose.yml gives it 1gb unless MUESTRA_REDIS_MAXMEMORY says).
REDIS_MAXMEMORY = 256 * 1024 * 1024


def _service(name: str, label: str, args: list[str], log_dir: Path, env: dict, metrics: bool = False) -> Process:
    port = free_port()
    metrics_port = free_port() if metrics else -1
    command = [*service_command(name, port, args), "--metrics-port", str(metrics_port)]  # after args: the last wins
    process = Process(label, command, log_dir / f"{label}.log", port, env=env)
    process.metrics_url = f"http://127.0.0.1:{metrics_port}/metrics" if metrics else ""
    return process


class LocalStack:
    """redis-server (optional), tokenizer, `lm_replicas` lm processes, diffusion (optional) and a gateway with HTTP,
    serving once constructed."""

    def __init__(
        self,
        log_dir: Path,
        text_model: Path,
        image_model: Path | None = None,
        lm_replicas: int = 1,
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
        self.redis: RedisServer | None = None
        self.started: list[Process] = []
        try:
            redis_url: list[str] = []
            if redis:
                self.redis_password = secrets.token_urlsafe(24)
                limits = ("--maxmemory", str(REDIS_MAXMEMORY), "--maxmemory-policy", "allkeys-lru")
                self.redis = RedisServer(self.log_dir, limits, password=self.redis_password)
                self.started.append(self.redis)
                self.redis_url = self.redis.url
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
                diffusion_flags = ["--model", str(image_model), *redis_url, *common]
                self.diffusion = _service("diffusion", "diffusion", diffusion_flags, self.log_dir, env, metrics)
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
            for process in self.services():
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
            process.stop()

"""A throwaway redis-server on a free port: no persistence, its password on its standard input."""

from __future__ import annotations

import shutil
from pathlib import Path

from muestra.cli.launch.process import Process, StartFailed, free_port


class RedisServer(Process):
    """redis-server on a free port of `host`, accepting connections once constructed; `start()` restarts it on the
    same port, empty. Its log is <workdir>/redis.log.

    `password` reaches it on its standard input, never its command line. `tls` = (certificate, key): TLS only on
    the port (self.url is then rediss:// without a CA)."""

    def __init__(
        self, workdir: Path, extra_args: tuple[str, ...] = (), tls: tuple[Path, Path] | None = None, *,
        password: str | None = None, host: str = "127.0.0.1", env: dict | None = None, new_session: bool = False,
    ) -> None:  # fmt: skip
        binary = shutil.which("redis-server")
        if binary is None:
            raise RuntimeError("redis-server is not installed (apt-get install -y redis-server)")
        workdir = Path(workdir)
        port = free_port(host)
        ports = ["--port", str(port)]
        if tls:
            cert, key = tls
            ports = ["--port", "0", "--tls-port", str(port), "--tls-cert-file", str(cert),
                     "--tls-key-file", str(key), "--tls-auth-clients", "no"]  # fmt: skip
        # `redis-server -` reads configuration from standard input, after the file it names (none).
        command = [
            binary, "-", *ports, "--bind", host, "--save", "", "--appendonly", "no",
            "--pidfile", str(workdir / "redis.pid"), "--dir", str(workdir), *extra_args,
        ]  # fmt: skip
        stdin_text = f"requirepass {password}\n" if password else ""
        super().__init__(
            "redis", command, workdir / "redis.log", port, host=host, grpc_health=False, env=env,
            stdin_text=stdin_text, new_session=new_session,
        )  # fmt: skip
        self.workdir = workdir
        self.url = f"{'rediss' if tls else 'redis'}://{host}:{port}/0"
        try:
            self.start(timeout_s=10.0)
        except StartFailed:
            self.stop()
            raise

"""`muestra up`: every installed service as a local process on loopback, with the default models.

It starts redis-server on a free port when one is installed and MUESTRA_REDIS_URL is unset,
waits for every service's gRPC health check, prints the endpoints, and stops everything on
Ctrl-C. If a service dies, it shows that service's last log lines and stops the rest.

Secrets are made fresh for each run, unless the environment gives them: the internal token the
services require from each other (MUESTRA_INTERNAL_TOKEN), the key of the cache blocks' MAC
(MUESTRA_CACHE_KEY) and a Redis password. They reach the children through their environment and
Redis through its standard input, never a command line; the internal token is also written to
`<log dir>/internal_token` (mode 0600) for tools that call an internal service directly.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from muestra.cli.endpoints import DEFAULT_BASE_PORT, HTTP_PORT, SERVICE_PORT_OFFSETS

# Services stop by themselves when this process goes away (see muestra.runtime.server). No
# preexec_fn/PR_SET_PDEATHSIG: forking a process that runs gRPC threads can deadlock.
PARENT_ENV = "MUESTRA_EXIT_WITH_PARENT"

START_ORDER = ("tokenizer", "lm", "diffusion", "gateway")
DEFAULT_TEXT_MODEL = "muestra-text"
DEFAULT_IMAGE_MODEL = "muestra-image"


def add_parser(sub) -> None:
    parser = sub.add_parser("up", help="start every service locally on loopback with the default models")
    parser.add_argument("--host", default="127.0.0.1", help="address the services bind (default: loopback)")
    parser.add_argument(
        "--base-port", type=int, default=DEFAULT_BASE_PORT,
        help=f"gateway port; the others follow it (default {DEFAULT_BASE_PORT}; 0: free ports)",
    )  # fmt: skip
    parser.add_argument(
        "--models-dir", default=os.environ.get("MUESTRA_MODELS_DIR"), help="where the default models are"
    )
    parser.add_argument(
        "--text-model", default=os.environ.get("MUESTRA_LM_MODEL"), help="text model folder [MUESTRA_LM_MODEL]"
    )
    parser.add_argument(
        "--image-model",
        default=os.environ.get("MUESTRA_DIFFUSION_MODEL"),
        help="image model folder [MUESTRA_DIFFUSION_MODEL]",
    )
    parser.add_argument(
        "--http-port", type=int, default=HTTP_PORT, help=f"gateway's OpenAI-compatible HTTP port (default {HTTP_PORT})"
    )
    parser.add_argument("--only", default="", help="comma-separated services to start (default: all installed)")
    parser.add_argument("--log-dir", default=None, help="where service logs go (default: a new temporary folder)")
    parser.add_argument("--startup-timeout", type=float, default=300.0, help="seconds to wait for health checks")
    parser.add_argument("--grace-period", type=float, default=10.0, help="seconds services get to finish on stop")
    parser.set_defaults(run=run)


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def default_models_dir() -> Path:
    """./models when it exists, else the models/ folder of the checkout this CLI was installed from."""
    cwd_models = Path.cwd() / "models"
    if cwd_models.is_dir():
        return cwd_models
    return Path(__file__).resolve().parents[3] / "models"


@dataclasses.dataclass
class Child:
    name: str
    address: str
    command: list[str]
    log_path: Path
    proc: subprocess.Popen | None = None

    def log_tail(self, lines: int = 30) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])


def _spawn(command: list[str], log_path: Path, env: dict, stdin_text: str | None = None) -> subprocess.Popen:
    with open(log_path, "wb") as log_file:
        proc = subprocess.Popen(
            command, stdout=log_file, stderr=subprocess.STDOUT,
            stdin=subprocess.PIPE if stdin_text is not None else subprocess.DEVNULL,
            env={**env, PARENT_ENV: str(os.getpid())}, start_new_session=True,
        )  # fmt: skip
    if stdin_text is not None:
        proc.stdin.write(stdin_text.encode())
        proc.stdin.close()
    return proc


def _hide_credentials(url: str) -> str:
    scheme, sep, rest = url.partition("://")
    return f"{scheme}{sep}***@{rest.rpartition('@')[2]}" if "@" in rest else url


def _make_secrets(env: dict, log_dir: Path) -> None:
    """A fresh internal token and cache key for this run, unless the environment sets them."""
    for name in ("MUESTRA_INTERNAL_TOKEN", "MUESTRA_CACHE_KEY"):
        if not env.get(name) and not env.get(name + "_FILE"):
            env[name] = secrets.token_urlsafe(32)
    token = env.get("MUESTRA_INTERNAL_TOKEN", "")
    if token:
        path = log_dir / "internal_token"
        path.touch(mode=0o600)
        path.chmod(0o600)
        path.write_text(token + "\n")


def _stop(procs: list[subprocess.Popen], grace_s: float) -> None:
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + grace_s + 5
    for proc in procs:
        try:
            proc.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _healthy(address: str) -> bool:
    try:
        with grpc.insecure_channel(address) as channel:
            reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=1)
            return reply.status == health_pb2.HealthCheckResponse.SERVING
    except grpc.RpcError:
        return False


def _start_redis(host: str, log_dir: Path, env: dict) -> tuple[subprocess.Popen | None, str]:
    """A local redis-server for the prefix cache, unless one is configured or none is installed."""
    if env.get("MUESTRA_REDIS_URL"):
        return None, f"using MUESTRA_REDIS_URL={_hide_credentials(env['MUESTRA_REDIS_URL'])}"
    binary = shutil.which("redis-server")
    if binary is None:
        return None, "redis-server not installed: the prefix cache falls back to an in-process LRU"
    port = free_port(host)
    password = secrets.token_urlsafe(32)
    # `redis-server -` reads configuration from standard input: the password stays off the command line.
    command = [
        binary, "-", "--port", str(port), "--bind", host, "--save", "", "--appendonly", "no",
        "--maxmemory", "1gb", "--maxmemory-policy", "allkeys-lru", "--dir", str(log_dir),
        "--pidfile", str(log_dir / "redis.pid"),
    ]  # fmt: skip
    proc = _spawn(command, log_dir / "redis.log", env, stdin_text=f"requirepass {password}\n")
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"redis-server exited: {(log_dir / 'redis.log').read_text(errors='replace')[-500:]}")
        try:
            with socket.create_connection((host, port), timeout=0.2):
                break
        except OSError:
            time.sleep(0.05)
    env["MUESTRA_REDIS_URL"] = f"redis://{host}:{port}/0"
    env["MUESTRA_REDIS_PASSWORD"] = password
    return proc, f"redis-server on {host}:{port} (password required; the services have it)"


def plan(args, env: dict) -> tuple[list[Child], list[str]]:
    """The services to start, in order, and a note for each one that is skipped."""
    models_dir = Path(args.models_dir) if args.models_dir else default_models_dir()
    text_model = Path(args.text_model) if args.text_model else models_dir / DEFAULT_TEXT_MODEL
    image_model = Path(args.image_model) if args.image_model else models_dir / DEFAULT_IMAGE_MODEL
    only = {name.strip() for name in args.only.split(",") if name.strip()}
    log_dir = Path(args.log_dir)

    def port(service: str) -> int:
        return free_port(args.host) if args.base_port == 0 else args.base_port + SERVICE_PORT_OFFSETS[service]

    addresses = {name: f"{args.host}:{port(name)}" for name in START_ORDER}
    service_args = {
        "tokenizer": (
            ["--models", str(text_model)],
            (text_model / "tokenizer.json").is_file() or any(text_model.glob("*.model")),
        ),
        "lm": (["--model", str(text_model)], (text_model / "model.onnx").is_file()),
        "diffusion": (["--model", str(image_model)], (image_model / "model_index.json").is_file()),
        "gateway": ([], True),
    }
    children, skipped = [], []
    for name in START_ORDER:
        extra, has_model = service_args[name]
        if only and name not in only:
            continue
        if importlib.util.find_spec(f"muestra.{name}.__main__") is None:
            skipped.append(f"{name}: not installed (pip install -e ./services/{name})")
            continue
        if not has_model:
            skipped.append(f"{name}: no model at {text_model if name != 'diffusion' else image_model}")
            continue
        if name == "gateway":
            started = {c.name: c.address for c in children}
            extra = [f"--{svc}-addr={started[svc]}" for svc in ("tokenizer", "lm", "diffusion") if svc in started]
            http_port = free_port(args.host) if args.base_port == 0 else args.http_port
            extra += [f"--http-port={http_port}"]
        host, _, service_port = addresses[name].rpartition(":")
        command = [sys.executable, "-m", f"muestra.{name}", "--host", host, "--port", service_port, *extra]
        command += ["--grace-period-s", str(args.grace_period), "--metrics-port", "0"]
        children.append(Child(name, addresses[name], command, log_dir / f"{name}.log"))
    return children, skipped


def run(args) -> int:
    args.log_dir = args.log_dir or tempfile.mkdtemp(prefix="muestra-up-")
    log_dir = Path(args.log_dir)
    log_dir.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    stopping = False

    def request_stop(signum, frame):
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGINT, request_stop)
    signal.signal(signal.SIGTERM, request_stop)
    procs: list[subprocess.Popen] = []
    try:
        _make_secrets(env, log_dir)
        redis_proc, redis_note = _start_redis(args.host, log_dir, env)
        if redis_proc is not None:
            procs.append(redis_proc)
        print(f"muestra up: {redis_note}", flush=True)
        children, skipped = plan(args, env)
        for note in skipped:
            print(f"muestra up: skipping {note}", flush=True)
        if not children:
            print("muestra up: nothing to start", file=sys.stderr)
            return 1
        for child in children:
            child.proc = _spawn(child.command, child.log_path, env)
            procs.append(child.proc)
            deadline = time.monotonic() + args.startup_timeout
            while not _healthy(child.address):
                if stopping:
                    return 130
                if child.proc.poll() is not None or time.monotonic() > deadline:
                    why = "exited" if child.proc.poll() is not None else "did not become healthy in time"
                    print(f"muestra up: {child.name} {why}; its last log lines:\n{child.log_tail()}", file=sys.stderr)
                    return 1
                time.sleep(0.2)
            print(f"muestra up: {child.name:<10} serving on {child.address} (pid {child.proc.pid})", flush=True)
            if child.name == "gateway":
                http = next(a.split("=", 1)[1] for a in child.command if a.startswith("--http-port="))
                print(f"muestra up: OpenAI API on http://{args.host}:{http}/v1", flush=True)
        if env.get("MUESTRA_INTERNAL_TOKEN"):
            print(
                f"muestra up: the internal services require the token in {log_dir / 'internal_token'} "
                "(MUESTRA_INTERNAL_TOKEN_FILE for `muestra tokenize --tokenizer`)",
                flush=True,
            )
        print(f"muestra up: all services healthy; logs in {log_dir}; Ctrl-C stops them", flush=True)
        while not stopping:
            for child in children:
                if child.proc.poll() is not None:
                    print(
                        f"muestra up: {child.name} died (exit {child.proc.returncode}); its last log lines:\n"
                        f"{child.log_tail()}",
                        file=sys.stderr,
                    )
                    return 1
            time.sleep(0.5)
        return 0
    finally:
        print("muestra up: stopping", flush=True)
        # Services first (they may write to Redis while draining), Redis last.
        _stop([p for p in reversed(procs)], args.grace_period)
        print("muestra up: stopped", flush=True)

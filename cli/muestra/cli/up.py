"""`muestra up`: every installed service as a local process on loopback, with the default models.

It starts redis-server on a free port when one is installed and MUESTRA_REDIS_URL is unset,
waits for every service's gRPC health check, prints the endpoints, and stops everything on
Ctrl-C. If a service dies, it shows that service's last log lines and stops the rest.

Once every service is healthy it writes the addresses to a state file of its own, keyed by its base
port (see muestra.cli.stacks), so that the other commands find the newest stack without --gateway;
`muestra up --list` shows the running ones.

Each service exports Prometheus metrics on the base port + 10 + its offset (50061 for the gateway by
default), unless MUESTRA_<SERVICE>_METRICS_PORT or MUESTRA_METRICS_PORT sets its port; the URLs are printed.
The gateway's HTTP API is on 8000 at the default base port, else on the base port + 20, so that --base-port
moves every port the stack opens; --http-port and --metrics-base-port, when given, win. A taken port is
one line that names a flag value whose ports are free now.

Secrets are made fresh for each run, unless the environment gives them: the internal token the
services require from each other (MUESTRA_INTERNAL_TOKEN), the key of the cache blocks' MAC
(MUESTRA_CACHE_KEY) and a Redis password. They reach the children through their environment and
Redis through its standard input, never a command line; the internal token is also written to
`<log dir>/internal_token` (mode 0600) for tools that call an internal service directly.
"""

from __future__ import annotations

import argparse
import dataclasses
import errno
import importlib.util
import os
import re
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

from muestra.cli.arguments import PORT_MAX, integer, number
from muestra.cli.endpoints import (
    DEFAULT_BASE_PORT,
    HTTP_PORT,
    HTTP_PORT_OFFSET,
    METRICS_PORT_OFFSET,
    SERVICE_PORT_OFFSETS,
)
from muestra.cli.errors import CliError
from muestra.cli.stacks import describe, remove_stack, running_stacks, write_stack

# Services stop by themselves when this process goes away (see muestra.runtime.server). No
# preexec_fn/PR_SET_PDEATHSIG: forking a process that runs gRPC threads can deadlock.
PARENT_ENV = "MUESTRA_EXIT_WITH_PARENT"

START_ORDER = ("tokenizer", "lm", "diffusion", "gateway")
DEFAULT_TEXT_MODEL = "smollm2-135m-instruct"
DEFAULT_IMAGE_MODEL = "muestra-image"


def add_parser(sub) -> None:
    parser = sub.add_parser("up", help="start every service locally on loopback with the default models")
    parser.add_argument("--host", default="127.0.0.1", help="address the services bind (default: loopback)")
    parser.add_argument("--list", action="store_true", help="list the running stacks (the newest is the default)")
    parser.add_argument(
        "--base-port", type=integer(0, PORT_MAX - HTTP_PORT_OFFSET), default=DEFAULT_BASE_PORT,
        help=f"gateway port; every other port follows it: the services +1 to +3, their metrics +{METRICS_PORT_OFFSET} "
        f"to +{METRICS_PORT_OFFSET + 3}, the HTTP API +{HTTP_PORT_OFFSET} ({HTTP_PORT} at the default) "
        f"(default {DEFAULT_BASE_PORT}; 0: free ports)",
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
        "--http-port", type=integer(-1, PORT_MAX), default=None,
        help=f"gateway's OpenAI-compatible HTTP port (default: {HTTP_PORT} at the default base port, else the base "
        f"port + {HTTP_PORT_OFFSET}; -1: off)",
    )  # fmt: skip
    parser.add_argument(
        "--metrics-base-port", type=integer(-1, PORT_MAX - 3), default=None,
        help="the gateway's /metrics port; the others follow it (default: base port + 10; -1: no metrics)",
    )  # fmt: skip
    parser.add_argument("--only", default="", help="comma-separated services to start (default: all installed)")
    parser.add_argument("--log-dir", default=None, help="where service logs go (default: a new temporary folder)")
    parser.add_argument(
        "--startup-timeout", type=number(0.0, low_open=True), default=300.0, help="seconds to wait for health checks"
    )
    parser.add_argument("--grace-period", type=number(0.0), default=10.0, help="seconds services get to finish on stop")
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


def http_port(base_port: int) -> int:
    """The HTTP API's port when --http-port is not given: 8000 at the default base port (the URL the docs show)."""
    return HTTP_PORT if base_port == DEFAULT_BASE_PORT else base_port + HTTP_PORT_OFFSET


def bind_error(host: str, port: int) -> OSError | None:
    """Why host:port cannot be bound now, or None (SO_REUSEADDR: a recent connection's TIME_WAIT is no owner)."""
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            return exc
    return None


def moving_flag(args, what: str) -> str:
    """The flag that moves the port used for `what` (a Child.ports value)."""
    if what == "gateway HTTP API" and args.http_port is not None:
        return "--http-port"
    if what.endswith(" metrics") and args.metrics_base_port is not None:
        return "--metrics-base-port"
    return "--base-port"


def _free_base_port(args, env: dict) -> int | None:
    """A --base-port, near the one given, whose every port that moves with it is free now."""
    for step in (*range(100, 5001, 100), *range(-100, -5001, -100)):
        candidate = args.base_port + step
        if not 1024 <= candidate <= PORT_MAX - HTTP_PORT_OFFSET:
            continue
        try:
            children, _ = plan(argparse.Namespace(**{**vars(args), "base_port": candidate}), env)
        except CliError:  # its ports would collide with those --http-port or --metrics-base-port give
            continue
        ports = [n for c in children for n, what in c.ports.items() if moving_flag(args, what) == "--base-port"]
        if all(bind_error(args.host, n) is None for n in ports):
            return candidate
    return None


def _free_metrics_base_port(host: str) -> int | None:
    """A --metrics-base-port whose four ports are free now."""
    for _ in range(20):
        first = free_port(host)
        if first + 3 <= PORT_MAX and all(bind_error(host, n) is None for n in range(first, first + 4)):
            return first
    return None


def _instead(args, env: dict, flag: str) -> str:
    """The flag to rerun with so that the port `flag` placed is free: a value checked free now."""
    if flag == "--http-port":
        return f"rerun with --http-port {free_port(args.host)} (free now; -1: no HTTP API)"
    if flag == "--metrics-base-port":
        first = _free_metrics_base_port(args.host)
        if first is None:
            return "rerun with --metrics-base-port -1 (no metrics)"
        return f"rerun with --metrics-base-port {first} (its ports are free now; -1: no metrics)"
    base = _free_base_port(args, env)
    if base is None:
        return "rerun with --base-port 0 (free ports)"
    http = f", the HTTP API on {http_port(base)}" if args.http_port is None else ""
    return f"rerun with --base-port {base} (every port it moves is free now{http}; 0: free ports)"


def check_ports_free(args, children: list[Child], env: dict) -> None:
    """CliError for the first port the stack would bind that cannot be, with flags that would work instead."""
    for child in children:
        for port, what in child.ports.items():
            exc = bind_error(args.host, port)
            if exc is None:
                continue
            where = f"port {port} ({what}) on {args.host}"
            if exc.errno == errno.EADDRNOTAVAIL:
                raise CliError(f"{where} cannot be bound ({exc.strerror}): is --host {args.host} this machine's?")
            why = (
                "is taken; stop what holds it, or"
                if exc.errno == errno.EADDRINUSE
                else f"cannot be bound ({exc.strerror}):"
            )
            raise CliError(f"{where} {why} {_instead(args, env, moving_flag(args, what))}")


@dataclasses.dataclass
class Child:
    name: str
    address: str
    command: list[str]
    log_path: Path
    proc: subprocess.Popen | None = None
    # Ports this child will bind, with what each is for (checked free before anything starts).
    ports: dict[int, str] = dataclasses.field(default_factory=dict)

    def metrics_url(self) -> str | None:
        """The URL the service logged for its /metrics (it logs it before it turns healthy)."""
        try:
            match = re.search(r"metrics on (http://\S+/metrics)", self.log_path.read_text(errors="replace"))
        except OSError:
            return None
        return match.group(1) if match else None

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
            tail = (log_dir / "redis.log").read_text(errors="replace").strip().splitlines()[-1:]
            raise CliError(f"redis-server exited: {tail[0] if tail else '(no log)'} (see {log_dir / 'redis.log'})")
        try:
            with socket.create_connection((host, port), timeout=0.2):
                break
        except OSError:
            time.sleep(0.05)
    env["MUESTRA_REDIS_URL"] = f"redis://{host}:{port}/0"
    env["MUESTRA_REDIS_PASSWORD"] = password
    return proc, f"redis-server on {host}:{port} (password required; the services have it)"


def http_url(host: str, gateway: Child) -> str | None:
    """The gateway's OpenAI-compatible API, unless it is off."""
    port = int(next(a.split("=", 1)[1] for a in gateway.command if a.startswith("--http-port=")))
    return f"http://{host}:{port}/v1" if port > 0 else None


def _metrics_port(args, service: str, env: dict) -> int | None:
    """The --metrics-port muestra up gives a service; None where the environment sets the service's own."""
    if env.get(f"MUESTRA_{service.upper()}_METRICS_PORT") or env.get("MUESTRA_METRICS_PORT"):
        return None
    if args.metrics_base_port is not None and args.metrics_base_port < 0:
        return -1
    if args.metrics_base_port is None and args.base_port == 0:
        return free_port(args.host)
    first = args.metrics_base_port if args.metrics_base_port is not None else args.base_port + METRICS_PORT_OFFSET
    return first + SERVICE_PORT_OFFSETS[service]


def _unservable(what: str, folder: Path, needs: str) -> str:
    """Why `folder`, named by the user, cannot be served, and what to do instead."""
    if not folder.is_dir():
        return f"{what} {folder}: no such folder"
    if what == "--text-model" and (folder / "config.json").is_file():
        export = folder.with_name(folder.name + "-onnx")
        return (
            f"{what} {folder} has no model.onnx: it looks like a transformers folder; the lm serves ONNX. "
            f"Export it first: muestra export-lm {folder} {export} && muestra up --text-model {export}"
        )
    return f"{what} {folder} has no {needs}"


def unbuilt_default_text_model(args) -> Path | None:
    """The default text model's folder, when the stack would serve text from it but it was never built.

    It is built (`make default-model`), not committed: without it the stack would quietly serve no text.
    """
    if args.text_model:
        return None
    only = {name.strip() for name in args.only.split(",") if name.strip()}
    serves_text = any(
        (not only or name in only) and importlib.util.find_spec(f"muestra.{name}.__main__") is not None
        for name in ("tokenizer", "lm")
    )
    folder = (Path(args.models_dir) if args.models_dir else default_models_dir()) / DEFAULT_TEXT_MODEL
    return folder if serves_text and not folder.is_dir() else None


def plan(args, env: dict) -> tuple[list[Child], list[str]]:
    """The services to start, in order, and a note for each one that is skipped.

    CliError when a model folder the user named (or a service --only asks for) cannot be served.
    """
    models_dir = Path(args.models_dir) if args.models_dir else default_models_dir()
    text_model = Path(args.text_model) if args.text_model else models_dir / DEFAULT_TEXT_MODEL
    image_model = Path(args.image_model) if args.image_model else models_dir / DEFAULT_IMAGE_MODEL
    only = {name.strip() for name in args.only.split(",") if name.strip()}
    unknown = only - set(START_ORDER)
    if unknown:
        raise CliError(f"--only: unknown service {sorted(unknown)[0]!r}; the services are {', '.join(START_ORDER)}", 2)
    log_dir = Path(args.log_dir)

    def port(service: str) -> int:
        return free_port(args.host) if args.base_port == 0 else args.base_port + SERVICE_PORT_OFFSETS[service]

    addresses = {name: f"{args.host}:{port(name)}" for name in START_ORDER}
    has_tokenizer = (text_model / "tokenizer.json").is_file() or any(text_model.glob("*.model"))
    service_args = {
        "tokenizer": (["--models", str(text_model)], has_tokenizer, "--text-model", text_model, "tokenizer.json"),
        "lm": (["--model", str(text_model)], (text_model / "model.onnx").is_file(), "--text-model", text_model,
               "model.onnx"),
        "diffusion": (["--model", str(image_model)], (image_model / "model_index.json").is_file(), "--image-model",
                      image_model, "model_index.json"),
        "gateway": ([], True, "", None, ""),
    }  # fmt: skip
    told = {"--text-model": bool(args.text_model), "--image-model": bool(args.image_model)}
    children, skipped = [], []
    claimed: dict[int, str] = {}  # every port of the stack, so that no two uses share one

    def claim(ports: dict[int, str], port: int, what: str) -> None:
        if port in claimed:
            raise CliError(f"port {port} would be both the {claimed[port]} and the {what}; give other ports", 2)
        claimed[port] = ports[port] = what

    for name in START_ORDER:
        extra, has_model, flag, folder, needs = service_args[name]
        if only and name not in only:
            continue
        if importlib.util.find_spec(f"muestra.{name}.__main__") is None:
            if name in only:
                raise CliError(f"--only {name}: muestra-{name} is not installed (pip install -e ./services/{name})")
            skipped.append(f"{name}: not installed (pip install -e ./services/{name})")
            continue
        if not has_model:
            if told.get(flag) or name in only:
                raise CliError(_unservable(flag, folder, needs), 2)
            skipped.append(f"{name}: no model at {folder}")
            continue
        ports = {}
        if name == "gateway":
            started = {c.name: c.address for c in children}
            extra = [f"--{svc}-addr={started[svc]}" for svc in ("tokenizer", "lm", "diffusion") if svc in started]
            if args.http_port is not None:
                http = args.http_port
            else:
                http = free_port(args.host) if args.base_port == 0 else http_port(args.base_port)
            extra += [f"--http-port={http}"]
            if http > 0:
                claim(ports, http, "gateway HTTP API")
        host, _, service_port = addresses[name].rpartition(":")
        claim(ports, int(service_port), name)
        command = [sys.executable, "-m", f"muestra.{name}", "--host", host, "--port", service_port, *extra]
        command += ["--grace-period-s", str(args.grace_period)]
        metrics_port = _metrics_port(args, name, env)
        if metrics_port is not None:
            command += ["--metrics-port", str(metrics_port)]
            if metrics_port > 0:
                claim(ports, metrics_port, f"{name} metrics")
        children.append(Child(name, addresses[name], command, log_dir / f"{name}.log", ports=ports))
    return children, skipped


def run(args) -> int:
    if args.list:
        print("\n".join(describe(running_stacks())))
        return 0
    unbuilt = unbuilt_default_text_model(args)
    if unbuilt:
        print(
            f"muestra up: no default text model at {unbuilt}: build it with `make default-model`, "
            "or serve another with --text-model DIR",
            file=sys.stderr,
        )
        return 1
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
    state_path = None
    try:
        children, skipped = plan(args, env)
        if not children:
            reasons = "; ".join(f"skipping {note}" for note in skipped)
            print(f"muestra up: nothing to start ({reasons})", file=sys.stderr)
            return 1
        if [c.name for c in children] == ["gateway"] and not args.only:
            raise CliError("nothing for the gateway to serve: no text or image model was found; see --models-dir")
        check_ports_free(args, children, env)
        for note in skipped:
            print(f"muestra up: skipping {note}", flush=True)
        _make_secrets(env, log_dir)
        redis_proc, redis_note = _start_redis(args.host, log_dir, env)
        if redis_proc is not None:
            procs.append(redis_proc)
        print(f"muestra up: {redis_note}", flush=True)
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
            if child.metrics_url():
                print(f"muestra up: {child.name:<10} metrics on {child.metrics_url()}", flush=True)
            if child.name == "gateway" and http_url(args.host, child):
                print(f"muestra up: OpenAI API on {http_url(args.host, child)}", flush=True)
                print(f"muestra up: playground on {http_url(args.host, child).removesuffix('/v1')}/", flush=True)
        if env.get("MUESTRA_INTERNAL_TOKEN"):
            print(
                f"muestra up: the internal services require the token in {log_dir / 'internal_token'} "
                "(MUESTRA_INTERNAL_TOKEN_FILE for `muestra tokenize --tokenizer`)",
                flush=True,
            )
        gateway_or_first = next((c for c in children if c.name == "gateway"), children[0])
        state_path = write_stack(
            {
                "pid": os.getpid(),
                "base_port": args.base_port or int(gateway_or_first.address.rpartition(":")[2]),
                "services": {c.name: c.address for c in children},
                "http": next((http_url(args.host, c) for c in children if c.name == "gateway"), None),
                "metrics": {c.name: c.metrics_url() for c in children if c.metrics_url()},
                "log_dir": str(log_dir),
                "internal_token_file": str(log_dir / "internal_token") if env.get("MUESTRA_INTERNAL_TOKEN") else "",
            }
        )
        print(f"muestra up: the other muestra commands find this stack through {state_path}", flush=True)
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
    except CliError as exc:
        print(f"muestra up: {exc}", file=sys.stderr)
        return exc.exit_code
    finally:
        if state_path is not None:
            remove_stack(state_path, os.getpid())
        if procs:  # nothing started (a taken port, say): the error line is all there is to say
            print("muestra up: stopping", flush=True)
            # Services first (they may write to Redis while draining), Redis last.
            _stop([p for p in reversed(procs)], args.grace_period)
            print("muestra up: stopped", flush=True)

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

import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from muestra.cli.arguments import PORT_MAX, integer, number
from muestra.cli.endpoints import (
    DEFAULT_BASE_PORT,
    HTTP_PORT,
    HTTP_PORT_OFFSET,
    METRICS_PORT_OFFSET,
)
from muestra.cli.errors import CliError
from muestra.cli.launch import Process, RedisServer, StartFailed
from muestra.cli.stacks import describe, remove_stack, running_stacks, write_stack
from muestra.cli.up_plan import Child, http_url, plan, unbuilt_default_text_model
from muestra.cli.up_ports import check_ports_free

# Services stop by themselves when this process goes away (see muestra.runtime.server). No
# preexec_fn/PR_SET_PDEATHSIG: forking a process that runs gRPC threads can deadlock.
PARENT_ENV = "MUESTRA_EXIT_WITH_PARENT"


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


def _stop(processes: list[Process], grace_s: float) -> None:
    """SIGTERM to all at once, then wait for each until grace_s + 5 s have passed; SIGKILL the ones left."""
    for process in processes:
        if process.alive():
            process.proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + grace_s + 5
    for process in processes:
        if process.proc is None:  # it failed to spawn
            continue
        try:
            process.proc.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            process.kill()


def _start_redis(host: str, log_dir: Path, env: dict) -> tuple[RedisServer | None, str]:
    """A local redis-server for the prefix cache, unless one is configured or none is installed."""
    if env.get("MUESTRA_REDIS_URL"):
        return None, f"using MUESTRA_REDIS_URL={_hide_credentials(env['MUESTRA_REDIS_URL'])}"
    if shutil.which("redis-server") is None:
        return None, "redis-server not installed: the prefix cache falls back to an in-process LRU"
    password = secrets.token_urlsafe(32)
    limits = ("--maxmemory", "1gb", "--maxmemory-policy", "allkeys-lru")
    try:
        redis = RedisServer(
            log_dir, limits, password=password, host=host, env={**env, PARENT_ENV: str(os.getpid())}, new_session=True
        )
    except StartFailed as exc:
        log = exc.process.log_path
        if not exc.exited:
            raise CliError(f"redis-server did not accept connections in time (see {log})") from None
        last = (exc.process.log_tail(5).strip().splitlines() or ["(no log)"])[-1]
        raise CliError(f"redis-server exited: {last} (see {log})") from None
    env["MUESTRA_REDIS_URL"] = redis.url
    env["MUESTRA_REDIS_PASSWORD"] = password
    return redis, f"redis-server on {host}:{redis.port} (password required; the services have it)"


def logged_metrics_url(child: Child) -> str | None:
    """The URL the service logged for its /metrics (it logs it before it turns healthy)."""
    try:
        match = re.search(r"metrics on (http://\S+/metrics)", child.log_path.read_text(errors="replace"))
    except OSError:
        return None
    return match.group(1) if match else None


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
    procs: list[Process] = []
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
        redis, redis_note = _start_redis(args.host, log_dir, env)
        if redis is not None:
            procs.append(redis)
        print(f"muestra up: {redis_note}", flush=True)
        for child in children:
            child.env = {**env, PARENT_ENV: str(os.getpid())}  # with the secrets and the Redis URL made above
            procs.append(child)
            try:
                if not child.start(args.startup_timeout, cancelled=lambda: stopping):
                    return 130
            except StartFailed as exc:
                why = "exited" if exc.exited else "did not become healthy in time"
                print(f"muestra up: {child.name} {why}; its last log lines:\n{child.log_tail(30)}", file=sys.stderr)
                return 1
            print(f"muestra up: {child.name:<10} serving on {child.address} (pid {child.pid})", flush=True)
            if logged_metrics_url(child):
                print(f"muestra up: {child.name:<10} metrics on {logged_metrics_url(child)}", flush=True)
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
                "metrics": {c.name: logged_metrics_url(c) for c in children if logged_metrics_url(c)},
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
                        f"{child.log_tail(30)}",
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
            _stop(list(reversed(procs)), args.grace_period)
            print("muestra up: stopped", flush=True)

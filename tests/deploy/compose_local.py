"""docker-compose.yml run as local processes, the way Compose would run it, with only addresses rewritten.

What a container would run is read from the files themselves: each service's ENTRYPOINT, ENV and HEALTHCHECK from
its build target's stage of the Dockerfile and the stages it starts `FROM` (the image; other stages only build what
it copies, or belong to other images), then `command`, `environment`
(interpolated like Compose: `${VAR:-default}`), `volumes`, `tmpfs`, `secrets`, `depends_on` and `healthcheck` from
the compose file. The rewrites are only what a machine without containers needs: a wildcard bind address becomes a
loopback one (replica i of a scaled service gets 127.0.0.<i+1>, so replicas share a port as they do in Compose),
each container port becomes a free port, a `service:port` reference becomes the addresses of that service's
replicas, a volume's container path becomes its host source, a folder the image copies from a build stage (the
default text model) becomes the local folder given for it, a tmpfs becomes a temporary folder, a secret's
`/run/secrets/<name>` becomes its file (in the services that list it, and only there), and `python` becomes this
interpreter.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
WILDCARDS = ("0.0.0.0", "::", "[::]")
SECRETS_DIR = "/run/secrets"


@dataclasses.dataclass
class Image:
    """What a Dockerfile's target gives a container."""

    # The stages the image is made of, from the one on a base image to the target.
    stages: list[str]
    env: dict[str, str]
    entrypoint: list[str]
    cmd: list[str]
    healthcheck: list[str]
    user: str
    workdir: str
    instructions: list[tuple[str, str]]
    # Destinations of `COPY --from=<stage>`: what the image carries that a build stage made.
    built_in: list[str]


def dockerfile_instructions(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, continuation lines joined and comments dropped."""
    logical, current = [], ""
    for line in path.read_text().splitlines():
        if line.lstrip().startswith("#"):
            continue  # comments, also those between continued lines, as BuildKit drops them
        if line.rstrip().endswith("\\"):
            current += line.rstrip()[:-1] + " "
            continue
        current += line
        if current.strip():
            logical.append(current.strip())
        current = ""
    pairs = []
    for text in logical:
        word, _, rest = text.partition(" ")
        pairs.append((word.upper(), rest.strip()))
    return pairs


def dockerfile_stages(path: Path) -> list[tuple[str, list[tuple[str, str]]]]:
    """(name, instructions) of every stage, in order; the name is "" for a stage without `AS name`."""
    stages: list[tuple[str, list[tuple[str, str]]]] = []
    for word, rest in dockerfile_instructions(path):
        if word == "FROM":
            words = rest.split()
            stages.append((words[2] if len(words) == 3 and words[1].upper() == "AS" else "", []))
        stages[-1][1].append((word, rest))
    return stages


def target_stages(path: Path, target: str | None = None) -> list[tuple[str, list[tuple[str, str]]]]:
    """The stages of `target` (the last stage when None, as `docker build` without --target): the target and every
    stage it starts `FROM`, the first one on a base image first."""
    stages = dockerfile_stages(path)
    named = {name: (name, instructions) for name, instructions in stages if name}
    if target is not None and target not in named:
        raise ValueError(f"{path}: no stage named {target!r}")
    chain = [named[target] if target is not None else stages[-1]]
    while (parent := chain[0][1][0][1].split()[0]) in named:
        if named[parent] in chain:
            raise ValueError(f"{path}: stage {parent!r} starts FROM itself")
        chain.insert(0, named[parent])
    return chain


def parse_dockerfile(path: Path, target: str | None = None) -> Image:
    """The image: what the target's stages, in order, give a container."""
    env: dict[str, str] = {}
    entrypoint: list[str] = []
    cmd: list[str] = []
    healthcheck: list[str] = []
    user = "root"
    workdir = "/"
    built_in: list[str] = []
    chain = target_stages(path, target)
    instructions = [instruction for _, stage in chain for instruction in stage]
    for word, rest in instructions:
        if word == "ENV":
            for item in shlex.split(rest):
                key, _, value = item.partition("=")
                env[key] = value
        elif word == "ENTRYPOINT":
            entrypoint = json.loads(rest)
        elif word == "CMD":
            cmd = json.loads(rest)
        elif word == "HEALTHCHECK":
            healthcheck = json.loads(rest[rest.index("CMD ") + 4 :])
        elif word == "USER":
            user = rest
        elif word == "WORKDIR":
            workdir = rest if rest.startswith("/") else f"{workdir.rstrip('/')}/{rest}"
        elif word == "COPY" and rest.startswith("--from="):
            built_in.append(rest.split()[-1].rstrip("/"))
    return Image([name for name, _ in chain], env, entrypoint, cmd, healthcheck, user, workdir, instructions, built_in)


_VARIABLE = re.compile(r"\$\$|\$\{(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?:(?P<op>:?-)(?P<default>[^}]*))?\}")


def interpolate(value, variables: dict[str, str]):
    """Compose's interpolation of `${VAR}`, `${VAR:-default}`, `${VAR-default}` and `$$`, through lists and maps."""
    if isinstance(value, dict):
        return {key: interpolate(item, variables) for key, item in value.items()}
    if isinstance(value, list):
        return [interpolate(item, variables) for item in value]
    if not isinstance(value, str):
        return value

    def replace(match: re.Match) -> str:
        if match.group(0) == "$$":
            return "$"
        name, op, default = match.group("name", "op", "default")
        current = variables.get(name)
        if op == ":-" and not current:
            return default
        if op == "-" and current is None:
            return default
        return current or ""

    return _VARIABLE.sub(replace, value)


def load_compose(path: Path, variables: dict[str, str]) -> dict:
    """The compose file, YAML anchors merged and variables interpolated."""
    return interpolate(yaml.safe_load(path.read_text()), variables)


def environment_of(service: dict) -> dict[str, str]:
    env = service.get("environment") or {}
    if isinstance(env, list):
        env = dict(item.partition("=")[::2] for item in env)
    return {key: "" if value is None else str(value) for key, value in env.items()}


def free_port_on(hosts: list[str], taken: set[int] = frozenset()) -> int:
    """A TCP port free on every one of `hosts` and not in `taken` (ports already handed out: each probe socket
    closes, so the kernel may offer the same port twice)."""
    for _ in range(100):
        with socket.socket() as first:
            first.bind((hosts[0], 0))
            port = first.getsockname()[1]
            if port in taken:
                continue
            try:
                for host in hosts[1:]:
                    with socket.socket() as other:
                        other.bind((host, port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no port free on all of {hosts}")


@dataclasses.dataclass
class Container:
    """One replica of a compose service, as a local process."""

    service: str
    replica: int
    host: str
    argv: list[str]
    env: dict[str, str]
    healthcheck: list[str]
    ports: dict[str, int]
    log_path: Path
    proc: subprocess.Popen | None = None

    def start(self) -> None:
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(self.argv, env=self.env, stdout=log, stderr=subprocess.STDOUT)

    def healthy(self) -> bool:
        result = subprocess.run(self.healthcheck, env=self.env, capture_output=True, timeout=30)
        return result.returncode == 0

    def log_tail(self, lines: int = 40) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def stop(self, timeout_s: float) -> int:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


def grace_seconds(text: str) -> float:
    """Compose durations as this file writes them: `20s`, `1m`, `1m30s`."""
    units = {"ms": 0.001, "s": 1, "m": 60, "h": 3600}
    return sum(float(n) * units[u] for n, u in re.findall(r"(\d+(?:\.\d+)?)(ms|s|m|h)", text))


class LocalCompose:
    """Plan and run every service of a compose file as local processes; `scale` gives replica counts.

    `interpreters` maps a service to the Python that stands for its image's (default: this one), e.g. a venv
    holding only what its Dockerfile installs. `secret_values` gives the content of top-level secrets, written to
    files in `workdir` (mode 0600); any other secret is the compose file's own `file:`, as Compose reads it.
    `built_in` maps a folder that images copy from a build stage (Image.built_in) to the local folder standing in
    for it; only services whose image copies that folder see it.
    """

    def __init__(
        self,
        compose: dict,
        workdir: Path,
        scale: dict[str, int] | None = None,
        interpreters: dict[str, str] | None = None,
        secret_values: dict[str, str] | None = None,
        built_in: dict[str, Path] | None = None,
    ) -> None:
        self.compose = compose
        self.built_in = built_in or {}
        self.secret_values = secret_values or {}
        self.secret_files: dict[str, Path] = {}
        self.interpreters = interpreters or {}
        self.services: dict = compose["services"]
        self.workdir = workdir
        self.scale = {name: 1 for name in self.services} | (scale or {})
        self.containers: dict[str, list[Container]] = {}
        # (service, container port) -> host port, the same for every replica of a service.
        self.port_map: dict[tuple[str, str], int] = {}
        for name in self.services:
            self.containers[name] = []

    def hosts(self, name: str) -> list[str]:
        return [f"127.0.0.{i + 1}" for i in range(self.scale[name])]

    def container_ports(self, name: str, env: dict[str, str]) -> list[str]:
        ports = [value for key, value in env.items() if key.endswith("_PORT") and value.isdigit() and value != "0"]
        if "build" not in self.services[name]:  # the official redis image listens on 6379
            ports.append("6379")
        return ports

    def address_of(self, name: str, container_port: str) -> str:
        host_port = self.port_map[(name, container_port)]
        return ",".join(f"{host}:{host_port}" for host in self.hosts(name))

    def materialize_secrets(self) -> None:
        """A file for every top-level secret: the given value in `workdir`, else the compose file's `file:`."""
        folder = self.workdir / "secrets"
        for name, spec in (self.compose.get("secrets") or {}).items():
            if name in self.secret_values:
                folder.mkdir(mode=0o700, exist_ok=True)
                path = folder / name
                path.touch(mode=0o600)
                path.write_text(self.secret_values[name])
            elif "file" in spec:
                path = (REPO / spec["file"]).resolve()
                if not path.is_file():  # as `docker compose up` refuses to start
                    raise FileNotFoundError(f"secret {name}: {path} does not exist")
            else:
                raise ValueError(f"secret {name}: only `file:` secrets (or secret_values) are supported here")
            self.secret_files[name] = path

    def secret_mounts(self, name: str) -> dict[str, Path]:
        """Container path -> host file of every secret service `name` lists (Compose's /run/secrets/<target>)."""
        mounts = {}
        for entry in self.services[name].get("secrets") or []:
            source, target = (entry, entry) if isinstance(entry, str) else (entry["source"], entry.get("target"))
            target = target or source
            path = target if target.startswith("/") else f"{SECRETS_DIR}/{target}"
            mounts[path] = self.secret_files[source]
        return mounts

    def _map_secrets(self, name: str, text: str) -> str:
        for container_path, host_path in self.secret_mounts(name).items():
            replacement = str(host_path).replace("\\", "\\\\")
            text = re.sub(re.escape(container_path) + r"(?![\w.-])", replacement, text)
        return text

    def plan(self) -> None:
        """Decide every replica's command, environment and ports (before anything starts)."""
        self.materialize_secrets()
        planned = {}
        for name, service in self.services.items():
            image = None
            if "build" in service:
                build = service["build"]
                dockerfile = REPO / build.get("context", ".") / build.get("dockerfile", "Dockerfile")
                image = parse_dockerfile(dockerfile, build.get("target"))
            env = {**(image.env if image else {}), **environment_of(service)}
            planned[name] = (image, env)
            for port in self.container_ports(name, env):
                self.port_map[(name, port)] = free_port_on(self.hosts(name), set(self.port_map.values()))
        for name, (image, env) in planned.items():
            for replica, host in enumerate(self.hosts(name)):
                self.containers[name].append(self._container(name, replica, host, image, dict(env)))

    def _rewrite(self, name: str, key: str, value: str, host: str, tmp: Path, image: Image | None) -> str:
        service = self.services[name]
        mapped = self._map_secrets(name, value)
        if mapped != value:  # a host path now: no container path left to rewrite
            return mapped
        if key.endswith("_HOST") and value in WILDCARDS:
            return host
        if key.endswith("_PORT") and (name, value) in self.port_map:
            return str(self.port_map[(name, value)])
        for folder in image.built_in if image else []:
            if folder in self.built_in and (value == folder or value.startswith(folder + "/")):
                return str(self.built_in[folder]) + value[len(folder) :]
        for volume in service.get("volumes", []):
            source, target = volume.split(":")[:2]
            if value == target or value.startswith(target + "/"):
                return str((REPO / source).resolve()) + value[len(target) :]
        for mount in service.get("tmpfs", []):
            if value == mount or value.startswith(mount + "/"):
                return str(tmp) + value[len(mount) :]
        references = re.compile(r"\b(" + "|".join(map(re.escape, self.services)) + r"):(\d+)\b")
        return references.sub(lambda m: self.address_of(m.group(1), m.group(2)), value)

    def _container(self, name: str, replica: int, host: str, image: Image | None, env: dict) -> Container:
        service = self.services[name]
        tmp = self.workdir / f"{name}-{replica}-tmp"
        tmp.mkdir()
        env = {key: self._rewrite(name, key, value, host, tmp, image) for key, value in env.items()}
        inherited = {key: value for key, value in os.environ.items() if not key.startswith("MUESTRA_")}
        full_env = {**inherited, **env}
        command = service.get("command")
        if isinstance(command, str):
            command = shlex.split(command)
        ports = {port: host_port for (svc, port), host_port in self.port_map.items() if svc == name}
        if image is not None:
            argv = [*image.entrypoint, *(command if command is not None else image.cmd)]
            healthcheck = image.healthcheck
        else:  # redis from its official image: the compose command, on this replica's loopback port
            argv = [*command, "--port", str(ports["6379"]), "--bind", host, "--dir", str(tmp)]
            kind, *test = service["healthcheck"]["test"]
            address = ["-h", host, "-p", str(ports["6379"])]
            if kind == "CMD-SHELL":  # Docker runs the string with /bin/sh -c
                (script,) = test
                healthcheck = ["sh", "-c", re.sub(r"\bredis-cli\b", " ".join(["redis-cli", *address]), script)]
            else:
                healthcheck = [test[0], *address, *test[1:]]
        argv = [self._map_secrets(name, word) for word in argv]
        healthcheck = [self._map_secrets(name, word) for word in healthcheck]
        python = self.interpreters.get(name, sys.executable)
        argv = [python if word == "python" else word for word in argv]
        healthcheck = [python if word == "python" else word for word in healthcheck]
        if argv[0] == "redis-server":
            argv[0] = shutil.which("redis-server") or "redis-server"
        log_path = self.workdir / f"{name}-{replica}.log"
        return Container(name, replica, host, argv, full_env, healthcheck, ports, log_path)

    def start_order(self) -> list[list[str]]:
        """Waves of services: each wave depends only on earlier ones (Compose's depends_on order)."""
        done: set[str] = set()
        waves = []
        while len(done) < len(self.services):
            wave = [
                name
                for name, service in self.services.items()
                if name not in done and set(service.get("depends_on", {})) <= done
            ]
            if not wave:
                raise ValueError("depends_on has a cycle")
            waves.append(wave)
            done.update(wave)
        return waves

    def up(self, timeout_s: float = 300.0) -> None:
        """Start wave by wave, each wave healthy (its own health checks) before the next starts."""
        self.plan()
        for wave in self.start_order():
            started = [c for name in wave for c in self.containers[name]]
            for container in started:
                container.start()
            deadline = time.monotonic() + timeout_s
            waiting = list(started)
            while waiting:
                for container in list(waiting):
                    if container.proc.poll() is not None:
                        raise RuntimeError(
                            f"{container.service}[{container.replica}] exited with {container.proc.returncode}:\n"
                            f"{container.log_tail()}"
                        )
                    if container.healthy():
                        waiting.remove(container)
                if waiting and time.monotonic() > deadline:
                    names = ", ".join(f"{c.service}[{c.replica}]" for c in waiting)
                    raise TimeoutError(f"not healthy after {timeout_s}s: {names}")
                if waiting:
                    time.sleep(0.5)

    def down(self) -> dict[str, list[int]]:
        """SIGTERM every replica, dependants first, each given its service's stop_grace_period."""
        codes: dict[str, list[int]] = {}
        for wave in reversed(self.start_order()):
            for name in wave:
                grace = grace_seconds(self.services[name].get("stop_grace_period", "10s"))
                codes[name] = [c.stop(grace) for c in self.containers[name] if c.proc is not None]
        return codes

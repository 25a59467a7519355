"""What `muestra up` starts: each service's command, address and the ports it will bind, in start order, and a
note for each service it skips (not installed, or no model); where the default models are.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from muestra.cli.endpoints import (
    DEFAULT_BASE_PORT,
    HTTP_PORT,
    HTTP_PORT_OFFSET,
    METRICS_PORT_OFFSET,
    SERVICE_PORT_OFFSETS,
)
from muestra.cli.errors import CliError
from muestra.cli.launch import Process, free_port, service_command

START_ORDER = ("tokenizer", "lm", "diffusion", "gateway")
DEFAULT_TEXT_MODEL = "smollm2-135m-instruct"
DEFAULT_IMAGE_MODEL = "muestra-image"


class Child(Process):
    """A service `muestra up` starts, in a session of its own, with the ports it will bind and what each is for
    (checked free before anything starts)."""

    def __init__(
        self, name: str, host: str, port: int, command: list[str], log_path: Path, ports: dict[int, str]
    ) -> None:
        super().__init__(name, command, log_path, port, host=host, new_session=True)
        self.ports = ports


def default_models_dir() -> Path:
    """./models when it exists, else the models/ folder of the checkout this CLI was installed from."""
    cwd_models = Path.cwd() / "models"
    if cwd_models.is_dir():
        return cwd_models
    return Path(__file__).resolve().parents[3] / "models"


def http_port(base_port: int) -> int:
    """The HTTP API's port when --http-port is not given: 8000 at the default base port (the URL the docs show)."""
    return HTTP_PORT if base_port == DEFAULT_BASE_PORT else base_port + HTTP_PORT_OFFSET


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

    ports_of = {name: port(name) for name in START_ORDER}
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
        claim(ports, ports_of[name], name)
        command = [*service_command(name, ports_of[name], extra, args.host), "--grace-period-s", str(args.grace_period)]
        metrics_port = _metrics_port(args, name, env)
        if metrics_port is not None:
            command += ["--metrics-port", str(metrics_port)]
            if metrics_port > 0:
                claim(ports, metrics_port, f"{name} metrics")
        children.append(Child(name, args.host, ports_of[name], command, log_dir / f"{name}.log", ports))
    return children, skipped

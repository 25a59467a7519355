"""Service configuration: a dataclass filled from flags, then MUESTRA_* variables, then defaults.

A field `max_text_bytes` of the tokenizer service is set by `--max-text-bytes`, else by
`MUESTRA_TOKENIZER_MAX_TEXT_BYTES`, else by `MUESTRA_MAX_TEXT_BYTES`, else by its default.

Secrets (fields marked `secret`: API keys, the internal token, the cache key, the Redis password) may
also come from a file, as Docker and Kubernetes secrets are mounted: `--api-keys-file PATH`, or
`MUESTRA_GATEWAY_API_KEYS_FILE` / `MUESTRA_API_KEYS_FILE`. One given as a flag is accepted with a
warning: every user of the machine can read a command line (`ps`).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import typing
from pathlib import Path
from typing import Any, TypeVar

C = TypeVar("C", bound="ServiceConfig")


def setting(default, help_text: str):
    """A config field and its --help text."""
    return dataclasses.field(default=default, metadata={"help": help_text})


def secret(default, help_text: str):
    """A config field holding a secret (also read from --<name>-file or MUESTRA_<NAME>_FILE)."""
    return dataclasses.field(default=default, metadata={"help": help_text, "secret": True})


@dataclasses.dataclass
class ServiceConfig:
    """Settings every service has."""

    host: str = setting("127.0.0.1", "address to bind")
    port: int = setting(0, "gRPC port (0: pick a free one)")
    metrics_port: int = setting(-1, "Prometheus /metrics port (0: pick a free one, -1: off)")
    log_level: str = setting("INFO", "logging level")
    grace_period_s: float = setting(10.0, "seconds in-flight requests get to finish on SIGTERM")
    max_message_bytes: int = setting(64 * 1024 * 1024, "largest gRPC message accepted or sent")
    internal_token: str = secret(
        "",
        "secret shared by the services of one deployment: the tokenizer, lm and diffusion services "
        "require it from callers, and the gateway sends it (empty: no authentication between services)",
    )


@dataclasses.dataclass
class RedisConfig:
    """The Redis settings of a service that caches in Redis (a mixin: `class LmConfig(ServiceConfig, RedisConfig)`)."""

    redis_url: str = setting(
        "",
        "Redis for the service's cache: redis://[:password@]host:port/db, rediss:// for TLS (empty: no "
        "Redis; the gateway and lm then cache prefixes in process, and diffusion caches no text embeddings)",
    )
    redis_password: str = secret("", "Redis password, unless the URL holds one")
    redis_timeout_s: float = setting(0.25, "Redis connect and socket timeout; a slower call is a miss")


REDIS_SCHEMES = ("redis://", "rediss://", "unix://")


def _read_secret(path: str, name: str, parser: argparse.ArgumentParser) -> str:
    try:
        return Path(path).read_text().strip()
    except OSError as exc:
        parser.error(f"{name}: cannot read {path}: {exc.strerror or exc}")


def _parse_bool(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off", ""):
        return False
    raise ValueError(f"not a boolean: {text!r}")


def _converter(tp: Any):
    if tp is bool:
        return _parse_bool
    if tp in (int, float, str):
        return tp
    args = [a for a in typing.get_args(tp) if a is not type(None)]
    if len(args) == 1:
        return _converter(args[0])
    raise TypeError(f"unsupported config field type {tp!r}")


def load_config(cls: type[C], service: str, argv: list[str] | None = None, env: dict | None = None) -> C:
    """Build `cls` from command-line flags and MUESTRA_* environment variables."""
    env = os.environ if env is None else env
    hints = typing.get_type_hints(cls)
    parser = argparse.ArgumentParser(prog=f"muestra-{service}", description=f"muestra {service} service")
    for field in dataclasses.fields(cls):
        flag = "--" + field.name.replace("_", "-")
        convert = _converter(hints[field.name])
        help_text = field.metadata.get("help", "")
        env_names = f"MUESTRA_{service.upper()}_{field.name.upper()}, MUESTRA_{field.name.upper()}"
        parser.add_argument(flag, dest=field.name, type=convert, default=None, help=f"{help_text} [{env_names}]")
        if field.metadata.get("secret"):
            parser.add_argument(
                flag + "-file", dest=field.name + "_file", default=None,
                help=f"file holding {field.name} [{env_names.replace(',', '_FILE,')}_FILE]",
            )  # fmt: skip
    parsed = vars(parser.parse_args(argv))
    values = {}
    for field in dataclasses.fields(cls):
        convert = _converter(hints[field.name])
        is_secret = field.metadata.get("secret", False)
        if parsed[field.name] is not None:
            values[field.name] = parsed[field.name]
            if is_secret and parsed[field.name]:
                flag = "--" + field.name.replace("_", "-")
                print(
                    f"muestra-{service}: warning: {flag} on the command line is visible to every user of this "
                    f"machine; use MUESTRA_{field.name.upper()} or {flag}-file",
                    file=sys.stderr,
                )
            continue
        if is_secret and parsed.get(field.name + "_file"):
            values[field.name] = _read_secret(parsed[field.name + "_file"], field.name, parser)
            continue
        names = (f"MUESTRA_{service.upper()}_{field.name.upper()}", f"MUESTRA_{field.name.upper()}")
        if is_secret:
            names = tuple(n for name in names for n in (name, name + "_FILE"))
        for name in names:
            if name in env:
                if name.endswith("_FILE") and is_secret:
                    values[field.name] = _read_secret(env[name], name, parser)
                    break
                try:
                    values[field.name] = convert(env[name])
                except ValueError as exc:
                    parser.error(f"{name}: {exc}")
                break
    for name, value in values.items():
        if name.endswith("redis_url") and value and not str(value).startswith(REDIS_SCHEMES):
            flag = "--" + name.replace("_", "-")
            shown = str(value).split("@")[-1][:80]  # never a password
            parser.error(f"{flag}: must be a redis://, rediss:// or unix:// URL, got {shown!r}")
    return cls(**values)

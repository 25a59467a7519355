"""The whole stack as local processes on loopback, for the soak and chaos runs (and their tests).

    stack = LocalStack(log_dir, lm_replicas=2)   # redis-server, tokenizer, 2 lm, diffusion, gateway
    stack.lm[0].kill(); stack.lm[0].start()      # SIGKILL, then restart on the same port
    stack.tokenizer.pause(); stack.tokenizer.resume()
    stack.close()

muestra.cli.launch.LocalStack with this checkout's models as defaults: models/tiny-text-fixture (the tests' text
model) and models/muestra-image.
"""

from __future__ import annotations

from pathlib import Path

from muestra.cli.launch import LocalStack as _LocalStack
from muestra.cli.launch import Process
from muestra.cli.launch.stack import REDIS_MAXMEMORY

__all__ = ["DEFAULT_IMAGE_MODEL", "DEFAULT_TEXT_MODEL", "REDIS_MAXMEMORY", "TEXT_FIXTURE", "LocalStack", "Process"]

ROOT = Path(__file__).resolve().parents[1]
TEXT_FIXTURE = ROOT / "models" / "tiny-text-fixture"
# The default text model (`make default-model`): its 4-bit layers are where a row's bits could depend on its batch.
DEFAULT_TEXT_MODEL = ROOT / "models" / "smollm2-135m-instruct"
DEFAULT_IMAGE_MODEL = ROOT / "models" / "muestra-image"


class LocalStack(_LocalStack):
    """redis-server, tokenizer, `lm_replicas` lm processes, diffusion (optional) and a gateway with HTTP."""

    def __init__(
        self, log_dir: Path, text_model: Path = TEXT_FIXTURE, image_model: Path | None = DEFAULT_IMAGE_MODEL, **options
    ) -> None:
        super().__init__(log_dir, text_model, image_model, **options)

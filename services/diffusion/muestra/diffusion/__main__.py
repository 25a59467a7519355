"""`python -m muestra.diffusion --model PATH --port P`"""

from __future__ import annotations

import os
import sys

from muestra.diffusion.config import DiffusionConfig
from muestra.diffusion.model_folder import pipeline_class_name
from muestra.runtime import load_config, run_service
from muestra.runtime.logs import configure_logging


def main(argv: list[str] | None = None) -> None:
    config = load_config(DiffusionConfig, "diffusion", argv)
    configure_logging("diffusion", config.log_level)  # before the model loads, so its lines are kept
    if not config.model:
        raise SystemExit("--model is required (or MUESTRA_DIFFUSION_MODEL): a diffusers text-to-image folder")
    pipeline_class_name(config.model)  # a bad folder fails here, before torch is imported
    # No model hub, ever: the model is a local folder. Set before huggingface_hub is imported.
    os.environ.setdefault("HF_HUB_OFFLINE", "1")

    from muestra.diffusion.server import build_service

    run_service(build_service(config), config)


if __name__ == "__main__":
    main(sys.argv[1:])

"""`python -m muestra.lm --model PATH --port P`."""

from __future__ import annotations

import sys

from muestra.lm.config import LmConfig
from muestra.lm.model import ModelFolderError
from muestra.lm.prefix_cache import open_prefix_cache
from muestra.lm.server import load_engine, service_spec
from muestra.runtime import load_config, run_service
from muestra.runtime.logs import configure_logging


def main(argv: list[str] | None = None) -> None:
    config = load_config(LmConfig, "lm", argv)
    if not config.model:
        raise SystemExit("muestra-lm: --model (or MUESTRA_LM_MODEL) is required")
    configure_logging("lm", config.log_level)
    try:
        engine = load_engine(config)
    except ModelFolderError as exc:
        raise SystemExit(f"muestra-lm: cannot serve {config.model}: {exc}") from None
    run_service(service_spec(engine, open_prefix_cache(config, engine.info), config.batch_idle_s), config)


if __name__ == "__main__":
    main(sys.argv[1:])

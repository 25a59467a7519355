"""`python -m muestra.lm --model PATH --port P`."""

from __future__ import annotations

import sys

from muestra.lm.config import LmConfig
from muestra.lm.hot_tier import HotTier
from muestra.lm.memory import keep_freed_memory
from muestra.lm.model_folder import ModelFolderError
from muestra.lm.prefix_cache import open_prefix_cache
from muestra.lm.server import load_engine, service_spec
from muestra.runtime import load_config, run_service
from muestra.runtime.logs import configure_logging


def main(argv: list[str] | None = None) -> None:
    config = load_config(LmConfig, "lm", argv)
    if not config.model:
        raise SystemExit("muestra-lm: --model (or MUESTRA_LM_MODEL) is required")
    configure_logging("lm", config.log_level)
    keep_freed_memory()
    try:
        engine = load_engine(config)
    except ModelFolderError as exc:
        raise SystemExit(f"muestra-lm: cannot serve {config.model}: {exc}") from None
    prefix_cache = open_prefix_cache(config, engine.info)
    if prefix_cache is not None and config.hot_tier:
        engine.hot = HotTier()
    spec = service_spec(engine, prefix_cache, config.batch_idle_s, config.prefill_chunk_tokens)
    run_service(spec, config)


if __name__ == "__main__":
    main(sys.argv[1:])

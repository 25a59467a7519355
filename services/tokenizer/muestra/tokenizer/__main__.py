"""`python -m muestra.tokenizer --models DIR[,name=DIR] --port P`."""

from __future__ import annotations

import dataclasses
import sys

from muestra.runtime import ServiceConfig, load_config, run_service
from muestra.tokenizer.loader import load_tokenizer, parse_models
from muestra.tokenizer.server import Limits, service_spec


@dataclasses.dataclass
class TokenizerConfig(ServiceConfig):
    models: str = dataclasses.field(
        default="",
        metadata={
            "help": "tokenizer folders, comma-separated, each `name=DIR` or a plain DIR (named after the folder); "
            "the first is the default"
        },
    )
    max_text_bytes: int = dataclasses.field(
        default=1024 * 1024, metadata={"help": "longest text one Encode item may carry, in UTF-8 bytes"}
    )
    max_batch_size: int = dataclasses.field(
        default=4096, metadata={"help": "most texts, sequences or streams in one request"}
    )
    max_sequence_ids: int = dataclasses.field(
        default=262144, metadata={"help": "most ids in one Decode sequence or DetokenizeStep window"}
    )
    max_messages: int = dataclasses.field(default=1024, metadata={"help": "most chat messages in one request"})
    workers: int = dataclasses.field(default=4, metadata={"help": "threads that encode and decode off the event loop"})


def main(argv: list[str] | None = None) -> None:
    config = load_config(TokenizerConfig, "tokenizer", argv)
    if not config.models.strip():
        sys.exit("muestra-tokenizer: no tokenizers given; pass --models DIR or set MUESTRA_TOKENIZER_MODELS")
    for field in ("max_text_bytes", "max_batch_size", "max_sequence_ids", "max_messages", "workers"):
        if getattr(config, field) < 1:
            sys.exit(f"muestra-tokenizer: --{field.replace('_', '-')} must be at least 1")
    tokenizers = []
    try:
        entries = parse_models(config.models)
    except ValueError as exc:
        sys.exit(f"muestra-tokenizer: --models: {exc}")
    for name, path in entries:
        try:
            tokenizers.append(load_tokenizer(name, path))
        except Exception as exc:  # noqa: BLE001 - any load failure ends start-up with its message
            sys.exit(f"muestra-tokenizer: cannot load tokenizer {name!r} from {path}: {type(exc).__name__}: {exc}")
    limits = Limits(
        config.max_text_bytes,
        config.max_batch_size,
        config.max_sequence_ids,
        config.max_messages,
        max_reply_bytes=config.max_message_bytes,
    )
    run_service(service_spec(tokenizers, limits, config.workers), config)


if __name__ == "__main__":
    main()

"""The source an export reads (a transformers folder, maybe unpacked from a GGUF file): its checks, the context
length it is served at, its eval text's ids, the files copied beside the graph, and the GGUF's metadata."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from transformers import AutoTokenizer, GenerationConfig

from muestra.lm.export.errors import ExportError
from muestra.lm.export.families import FAMILIES, context_length
from muestra.lm.export.gguf_file import GGUFSource
from muestra.lm.export.gguf_file import sha256 as gguf_sha256

# Perplexity decodes one token at a time through the KV cache; this bounds the cost of --eval-text.
EVAL_MAX_TOKENS = 512
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "chat_template.jinja",
    "chat_template.json",
    "tokenizer.model",
    "vocab.json",
    "merges.txt",
)
WEIGHT_FILES = (
    "model.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
)


def served_context(family, config, max_context: int) -> tuple[int, str]:
    length, source = context_length(family, config)
    if max_context < 0:
        raise ExportError(f"context length must be > 0, got {max_context}")
    if max_context:
        if length is not None and max_context > length:
            raise ExportError(f"context length {max_context} exceeds the model's {length} ({source})")
        return max_context, "set when exporting"
    if length is None:
        raise ExportError(f"{source}; give the length the model was trained at with --context-length N")
    return length, source


def check_source(src: Path):
    if not src.is_dir():
        raise ExportError(f"source {src} is neither a folder nor a GGUF file")
    config_path = src / "config.json"
    if not config_path.is_file():
        raise ExportError(f"source {src} has no config.json; expected a transformers model folder (save_pretrained)")
    try:
        model_type = json.loads(config_path.read_text()).get("model_type")
    except (json.JSONDecodeError, AttributeError) as exc:
        raise ExportError(f"{config_path} is not a valid JSON object: {exc}") from exc
    if model_type not in FAMILIES:
        raise ExportError(f"model_type {model_type!r} in {config_path} is not supported; supported: {sorted(FAMILIES)}")
    if not any((src / name).is_file() for name in WEIGHT_FILES):
        raise ExportError(f"source {src} has no weights (looked for {', '.join(WEIGHT_FILES)})")
    if not any((src / name).is_file() for name in ("tokenizer.json", "tokenizer.model", "vocab.json")):
        raise ExportError(f"source {src} has no tokenizer (tokenizer.json, tokenizer.model or vocab.json)")
    return FAMILIES[model_type]


def eval_token_ids(src: Path, eval_text: str, context: int) -> list[int]:
    tokenizer = AutoTokenizer.from_pretrained(src)
    ids = tokenizer(eval_text)["input_ids"]
    limit = min(EVAL_MAX_TOKENS, context)
    if len(ids) < 2:
        raise ExportError("eval_text must tokenize to at least two tokens")
    return ids[:limit]


def copy_side_files(src: Path, staging: Path, config) -> None:
    shutil.copy2(src / "config.json", staging / "config.json")
    if (src / "generation_config.json").is_file():
        shutil.copy2(src / "generation_config.json", staging / "generation_config.json")
    else:
        GenerationConfig.from_model_config(config).save_pretrained(staging)
    for name in TOKENIZER_FILES:
        if (src / name).is_file():
            shutil.copy2(src / name, staging / name)


def gguf_metadata(source: GGUFSource) -> dict:
    return {
        "file": source.path.name,
        "sha256": gguf_sha256(source.path),
        "architecture": source.architecture,
        "tensor_types": source.tensor_types,
    }

"""What the lm reads from a model folder's JSON files, whichever layout wrote them, and why it cannot serve one.

Three layouts are served as they come: muestra's exporter (config.json + muestra_export.json),
optimum's text-generation-with-past export (config.json), and onnxruntime-genai's model builder
(genai_config.json, no config.json).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

# Keys of config.json that give the context length, by model family.
_CONTEXT_KEYS = ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length", "n_ctx")
# genai_config.json's "search" keys that are generation_config.json's (the builder copies them from it).
_GENAI_SEARCH_KEYS = (
    "do_sample",
    "temperature",
    "top_k",
    "top_p",
    "repetition_penalty",
    "no_repeat_ngram_size",
    "num_beams",
    "length_penalty",
    "early_stopping",
    "min_length",
)
# Files that make a folder a transformers model (not yet exported).
_TRANSFORMERS_WEIGHTS = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin")


@dataclasses.dataclass(frozen=True)
class FolderConfig:
    """What the service reads from a model folder's JSON files, whichever layout wrote them."""

    # config.json's keys, or the same keys read from genai_config.json's decoder section.
    config: dict
    generation_config: dict
    # The context length and where it was read, or 0 and the keys that were looked for.
    context_length: int
    context_source: str


def read_folder_config(folder: Path) -> FolderConfig:
    """config.json (+ muestra_export.json), or onnxruntime-genai's genai_config.json."""
    config = _read_json(folder / "config.json")
    generation_config = _read_json(folder / "generation_config.json")
    genai_config = _read_json(folder / "genai_config.json")
    genai = genai_config.get("model")
    if not generation_config and isinstance(genai, dict) and isinstance(genai_config.get("search"), dict):
        search = genai_config["search"]
        generation_config = {key: search[key] for key in _GENAI_SEARCH_KEYS if key in search}
        generation_config["eos_token_id"] = genai.get("eos_token_id")
    if not config and isinstance(genai, dict):
        decoder = genai.get("decoder") if isinstance(genai.get("decoder"), dict) else {}
        config = {
            "model_type": genai.get("type"),
            "vocab_size": genai.get("vocab_size"),
            "num_hidden_layers": decoder.get("num_hidden_layers"),
            "num_attention_heads": decoder.get("num_attention_heads"),
            "num_key_value_heads": decoder.get("num_key_value_heads"),
            "head_dim": decoder.get("head_size"),
            "hidden_size": decoder.get("hidden_size"),
            "eos_token_id": genai.get("eos_token_id"),
        }
    if not config:
        raise ModelFolderError(f"{folder} has neither config.json nor genai_config.json")
    export = _read_json(folder / "muestra_export.json")
    candidates = [
        (export.get("context_length"), "muestra_export.json context_length"),
        (genai.get("context_length") if isinstance(genai, dict) else None, "genai_config.json model.context_length"),
        *((config.get(key), f"config.json {key}") for key in _CONTEXT_KEYS),
    ]
    length, source = next(
        ((int(v), where) for v, where in candidates if isinstance(v, int) and not isinstance(v, bool) and v > 0),
        (0, f"none of {', '.join(_CONTEXT_KEYS)} in config.json"),
    )
    return FolderConfig(config, generation_config, length, source)


def no_onnx_message(folder: Path) -> str:
    if (folder / "config.json").is_file() and any((folder / name).is_file() for name in _TRANSFORMERS_WEIGHTS):
        export = folder.with_name(folder.name + "-onnx")
        return (
            f"{folder} has no model.onnx: it looks like a transformers folder; the lm serves ONNX. "
            f"Export it first: muestra export-lm {folder} {export}, then serve {export}"
        )
    return f"{folder} has no model.onnx"


class ModelFolderError(Exception):
    """The folder cannot be served; the message says what is missing or unsupported."""


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        raise ModelFolderError(f"{path.name} is not readable JSON: {exc}") from exc

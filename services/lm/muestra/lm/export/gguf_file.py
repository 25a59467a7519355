"""A GGUF file as the exporter's source: checked up front, then unpacked into a transformers folder.

The `gguf` package reads the file; transformers' own GGUF loader builds the config, the tokenizer and
the dequantized weights, exactly as `from_pretrained(folder, gguf_file=…)` gives them to anyone else.
The file's quantized integers are carried into the graph afterwards by `gguf_weights`.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from muestra.lm.export.errors import ExportError
from muestra.lm.export.gguf_layout import check_layout

# What the gguf package dequantizes (and so transformers loads); anything else is refused up front.
DEQUANTIZABLE = frozenset("F32 F16 BF16 Q4_0 Q4_1 Q5_0 Q5_1 Q8_0 Q2_K Q3_K Q4_K Q5_K Q6_K IQ4_NL IQ4_XS".split())
# A GGUF may carry sampling defaults (llama.cpp's general.sampling.*); they become generation_config.json's.
_SAMPLING_KEYS = {"temp": "temperature", "top_k": "top_k", "top_p": "top_p", "min_p": "min_p"}


@dataclass(frozen=True)
class GGUFSource:
    path: Path
    architecture: str
    tensor_types: dict[str, int]
    context_length: int | None
    sampling: dict[str, float]
    pre_tokenizer: str | None = None


# llama.cpp pre-tokenizer names (tokenizer.ggml.pre) whose regexes split every digit apart before the
# GPT-2 split; transformers' GGUF converter drops that step ("\n\n3" came out as Ċ Ċ 3, not ĊĊ 3).
_DIGITS_FIRST = frozenset({"smollm"})


def find_gguf(src: Path) -> Path | None:
    """`src` when it is a .gguf file; the one .gguf file of a folder without config.json; else None."""
    if src.is_file() and (src.suffix.lower() == ".gguf" or _has_gguf_magic(src)):
        return src
    if src.is_dir() and not (src / "config.json").is_file():
        found = sorted(src.glob("*.gguf"))
        if len(found) > 1:
            raise ExportError(f"{src} holds {len(found)} GGUF files; name the one to export")
        if found:
            return found[0]
    return None


def _has_gguf_magic(path: Path) -> bool:
    with path.open("rb") as f:
        return f.read(4) == b"GGUF"


def inspect_gguf(path: Path, model_types: set[str]) -> GGUFSource:
    """Read the file's header and tensor table; refuse, in one line, what cannot be read or served."""
    import gguf
    from transformers.integrations.ggml import GGUF_CONFIG_MAPPING

    check_layout(path)  # a truncated or corrupt file is refused there, naming where
    try:
        reader = gguf.GGUFReader(path)
    except Exception as exc:  # numpy's words on something the walk let through: chained, not shown
        raise ExportError(f"{path} is a corrupt GGUF file: the gguf package cannot read it") from exc
    architecture = _field(reader, "general.architecture")
    readable = set(GGUF_CONFIG_MAPPING) - {"general", "tokenizer"}
    if architecture not in readable:
        raise ExportError(
            f"{path}: architecture {architecture!r} is not one transformers' GGUF loader reads "
            f"(it reads {', '.join(sorted(readable))})"
        )
    model_type = _model_type(architecture)
    if model_type not in model_types:
        raise ExportError(
            f"{path}: architecture {architecture!r} (model_type {model_type!r}) is not one the exporter serves; "
            f"supported: {', '.join(sorted(model_types))}"
        )
    types = Counter(t.tensor_type.name for t in reader.tensors)
    refused = sorted(set(types) - DEQUANTIZABLE)
    if refused:
        supported = ", ".join(sorted(DEQUANTIZABLE))
        raise ExportError(f"{path}: tensor type {', '.join(refused)} cannot be loaded; supported: {supported}")
    context = _field(reader, f"{architecture}.context_length")
    sampling = {}
    for key, name in _SAMPLING_KEYS.items():
        value = _field(reader, f"general.sampling.{key}")
        if value is not None:
            sampling[name] = value
    pre = _field(reader, "tokenizer.ggml.pre")
    context = int(context) if context is not None else None
    return GGUFSource(path, architecture, dict(types), context, sampling, pre)


def _model_type(architecture: str) -> str:
    # transformers' loader renames a few architectures to their model_type.
    return {"qwen2moe": "qwen2_moe", "gemma3": "gemma3_text", "gemma4": "gemma4_text"}.get(architecture, architecture)


def _field(reader, key: str):
    field = reader.fields.get(key)
    if field is None:
        return None
    return field.contents()


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def to_transformers_folder(source: GGUFSource, folder: Path) -> None:
    """Write config.json, safetensors weights (dequantized), tokenizer files and generation_config.json."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    from muestra.lm.export.chat_template import with_tool_calling

    where, name = source.path.parent, source.path.name
    try:
        config = AutoConfig.from_pretrained(where, gguf_file=name)
        tokenizer = AutoTokenizer.from_pretrained(where, gguf_file=name)
        loaded = AutoModelForCausalLM.from_pretrained(where, gguf_file=name, dtype=torch.float32)
    except Exception as exc:  # transformers, gguf and torch each raise their own kinds
        raise ExportError(f"transformers could not load {source.path}: {type(exc).__name__}: {exc}") from exc
    # A GGUF-loaded model is marked quantized and refuses save_pretrained; its weights are plain float32.
    for target in (config, loaded.config):
        if hasattr(target, "quantization_config"):
            del target.quantization_config
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(loaded.state_dict())
    del loaded
    model.save_pretrained(folder)

    if source.pre_tokenizer in _DIGITS_FIRST:
        from tokenizers import pre_tokenizers

        backend = tokenizer.backend_tokenizer
        backend.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.Digits(individual_digits=True), backend.pre_tokenizer]
        )
    if source.context_length:
        tokenizer.model_max_length = source.context_length
    if tokenizer.chat_template:
        tokenizer.chat_template = with_tool_calling(tokenizer.chat_template)
    tokenizer.save_pretrained(folder)
    special = {
        kind: str(getattr(tokenizer, kind))
        for kind in ("bos_token", "eos_token", "unk_token", "pad_token")
        if getattr(tokenizer, kind, None) is not None
    }
    (folder / "special_tokens_map.json").write_text(json.dumps(special, indent=2) + "\n")

    generation = GenerationConfig.from_model_config(config)
    for key, value in source.sampling.items():
        setattr(generation, key, value)
    if source.sampling:
        generation.do_sample = True
    generation.save_pretrained(folder)

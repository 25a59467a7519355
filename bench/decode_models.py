"""Random-weight models for bench/decode.py, built with transformers and exported once, cached on disk."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path

CACHE = Path(os.environ.get("MUESTRA_BENCH_CACHE", Path.home() / ".cache" / "muestra" / "bench"))
SEED = 0


def _configs() -> dict:
    from transformers import GPT2Config, LlamaConfig

    return {
        # GPT-2 small: 124M parameters.
        "gpt2-124m": GPT2Config(),
        # Llama-style of about the same size (GQA, SwiGLU, RoPE, tied embeddings): 100M parameters.
        "llama-100m": LlamaConfig(
            hidden_size=768,
            intermediate_size=2048,
            num_hidden_layers=12,
            num_attention_heads=12,
            num_key_value_heads=4,
            vocab_size=32000,
            max_position_embeddings=2048,
            tie_word_embeddings=True,
            bos_token_id=1,
            eos_token_id=2,
        ),
        "llama-tiny": LlamaConfig(
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            vocab_size=1024,
            max_position_embeddings=2048,
            bos_token_id=1,
            eos_token_id=2,
        ),
    }


MODELS = ["gpt2-124m", "llama-100m", "llama-tiny"]
# Written into each ONNX folder: an export made by other exporter sources is made again.
EXPORT_KEY_FILE = "bench_export.key"


def _export_key() -> str:
    """The exporter's sources and the torch and transformers versions it traced with."""
    import torch
    import transformers

    from muestra.lm import export

    digest = hashlib.sha256(f"{torch.__version__} {transformers.__version__}".encode())
    for path in sorted(Path(export.__file__).parent.glob("*.py")):
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def _export(hf_dir: Path, onnx_dir: Path, root: Path, **options) -> None:
    """Export hf_dir to onnx_dir (replacing an export made by other sources), stamped with the key."""
    from muestra.lm.export import export_lm

    staging = Path(tempfile.mkdtemp(prefix=".export.", dir=root))
    try:
        export_lm(hf_dir, staging / "onnx", progress=True, **options)
        (staging / "onnx" / EXPORT_KEY_FILE).write_text(_export_key() + "\n")
        shutil.rmtree(onnx_dir, ignore_errors=True)
        (staging / "onnx").rename(onnx_dir)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _save_tokenizer(out: Path, vocab_size: int) -> None:
    """A word-level tokenizer (the bench feeds token ids; the folders only need loadable tokenizer files)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, **{f"w{i}": i for i in range(3, min(vocab_size, 4096))}}
    tokenizer = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, unk_token="<unk>", bos_token="<s>", eos_token="</s>")
    fast.save_pretrained(out)


def build(name: str, layout: str = "fused", quantize: str | None = None, dtype: str = "float32") -> tuple[Path, Path]:
    """(transformers folder, ONNX folder) of a bench model in the exporter's `layout` ("fused" or
    "concat") and precision (`quantize` None, "int8", "int4" or "int8-dynamic"; `dtype` "float32" or "float16"),
    building and exporting it on first use."""
    import torch
    from transformers import AutoModelForCausalLM

    root = CACHE / name
    suffix = f"-{quantize}" if quantize else "-fp16" if dtype == "float16" else ""
    hf_dir, onnx_dir = root / "hf", root / f"onnx-{layout}{suffix}"
    key = onnx_dir / EXPORT_KEY_FILE
    if (onnx_dir / "model.onnx").is_file() and key.is_file() and key.read_text().strip() == _export_key():
        return hf_dir, onnx_dir
    root.mkdir(parents=True, exist_ok=True)
    options = {"layout": layout, "quantize": quantize, "dtype": dtype}
    if not (hf_dir / "config.json").is_file():
        staging = Path(tempfile.mkdtemp(prefix=".build.", dir=root))
        try:
            torch.manual_seed(SEED)
            config = _configs()[name]
            model = AutoModelForCausalLM.from_config(config).eval()
            model.save_pretrained(staging / "hf")
            model.generation_config.save_pretrained(staging / "hf")
            _save_tokenizer(staging / "hf", config.vocab_size)
            params = sum(p.numel() for p in model.parameters())
            (staging / "hf" / "bench.json").write_text(json.dumps({"parameters": params}))
            shutil.rmtree(hf_dir, ignore_errors=True)
            (staging / "hf").rename(hf_dir)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    _export(hf_dir, onnx_dir, root, **options)
    return hf_dir, onnx_dir


def parameters(name: str) -> int:
    return json.loads((CACHE / name / "hf" / "bench.json").read_text())["parameters"]

"""Build the placeholder default text model: a tiny *random* Llama on the muestra-text tokenizer.

It exists so that `muestra up` serves a text model on a fresh clone before a trained default
model ships; its output is noise. Deterministic: the same torch/transformers versions give the
same weights.

    .venv/bin/python models/make_placeholder_text_model.py
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


def main() -> int:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from muestra.lm.export import export_lm

    target = HERE / "muestra-text"
    config_json = json.loads((target / "tokenizer_config.json").read_text())
    vocab = json.loads((target / "tokenizer.json").read_text())["model"]["vocab"]
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(vocab),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=int(config_json.get("model_max_length", 2048)),
        bos_token_id=0,
        eos_token_id=1,
        pad_token_id=2,
        tie_word_embeddings=True,
    )
    model = LlamaForCausalLM(config).eval()
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "hf"
        model.save_pretrained(src)
        for name in TOKENIZER_FILES:
            shutil.copy(target / name, src / name)
        out = Path(tmp) / "onnx"
        export_lm(src, out)
        for path in out.iterdir():
            if path.name not in TOKENIZER_FILES:
                shutil.copy(path, target / path.name)
    print(f"wrote the placeholder model into {target}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

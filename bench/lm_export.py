"""Benchmark the exporter's options on a GPT-2-shaped random model: last-position logits, and int8 weights.

Run from the repository root:  .venv/bin/python -m bench.lm_export [--tokens 1024] [--repeats 5]
Ratios are against the all-positions float32 export measured in the same run.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort
import torch
from transformers import AutoModelForCausalLM, GPT2Config

from bench.builders.lm_tokenizer import save_tiny_tokenizer
from muestra.lm.export import export_lm
from muestra.lm.export.checks import last_position

EVAL_TEXT = " ".join(
    ["Once upon a time, in a land far away, there lived a small robot who loved to count numbers."] * 8
)


def build_source(root: Path) -> Path:
    torch.manual_seed(0)
    # GPT-2's vocabulary, with a small body so the run takes seconds (2048 positions: room to decode after 1024).
    config = GPT2Config(vocab_size=50257, n_positions=2048, n_embd=256, n_layer=4, n_head=4)
    src = root / "hf"
    AutoModelForCausalLM.from_config(config).eval().save_pretrained(src)
    save_tiny_tokenizer(src)
    return src


class Variant:
    """One export, its session and the two inputs it is timed on: a prefill from empty past and one decode step."""

    def __init__(self, onnx_dir: Path, tokens: int, threads: int):
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        self.sess = ort.InferenceSession(str(onnx_dir / "model.onnx"), options, providers=["CPUExecutionProvider"])
        self.names = [o.name for o in self.sess.get_outputs()]
        past = {
            n.name: np.zeros((1, n.shape[1], 0, n.shape[3]), np.float32)
            for n in self.sess.get_inputs()
            if n.name.startswith("past_key_values.")
        }
        ids = np.random.default_rng(0).integers(0, 50257, size=(1, tokens)).astype(np.int64)
        self.prefill = {"input_ids": ids, "attention_mask": np.ones_like(ids), "position_ids": np.arange(tokens)[None]}
        self.prefill.update(past)
        self.prefill.update(last_position(self.sess))
        outputs = dict(zip(self.names, self.sess.run(self.names, self.prefill), strict=True))
        self.decode = {
            "input_ids": ids[:, :1],
            "attention_mask": np.ones((1, tokens + 1), np.int64),
            "position_ids": np.array([[tokens]]),
        }
        self.decode.update({k.replace("present.", "past_key_values."): v for k, v in outputs.items() if k != "logits"})
        self.decode.update(last_position(self.sess))
        self.logits_mb = outputs["logits"].nbytes / 1e6
        self.file_mb = sum(p.stat().st_size for p in onnx_dir.glob("model.onnx*")) / 1e6
        self.perplexity = json.loads((onnx_dir / "muestra_export.json").read_text()).get("perplexity", {})
        self.prefill_s: list[float] = []
        self.decode_s: list[float] = []

    def time_once(self, decode_repeats: int) -> None:
        started = time.perf_counter()
        self.sess.run(self.names, self.prefill)
        self.prefill_s.append(time.perf_counter() - started)
        for _ in range(decode_repeats):
            started = time.perf_counter()
            self.sess.run(self.names, self.decode)
            self.decode_s.append(time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tokens", type=int, default=1024, help="prompt length of the prefill")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--threads", type=int, default=1, help="onnxruntime intra-op threads")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        src = build_source(root)
        variants = {
            "float32, all logits (baseline)": export_lm(src, root / "all", last_logits_only=False, progress=False),
            "float32, last logits (default)": export_lm(src, root / "last", progress=False),
            "int8, last logits": export_lm(src, root / "int8", quantize="int8", eval_text=EVAL_TEXT, progress=False),
        }
        results = {name: Variant(path, args.tokens, args.threads) for name, path in variants.items()}
    # Round-robin, so load from other processes hits every variant alike; the median then drops the outliers.
    for _ in range(args.repeats):
        for variant in results.values():
            variant.time_once(decode_repeats=5)
    for variant in results.values():
        variant.prefill_s, variant.decode_s = statistics.median(variant.prefill_s), statistics.median(variant.decode_s)
    base = next(iter(results.values()))
    print(
        f"GPT-2-shaped random model (vocab 50257, 4 layers, 256 hidden), prefill of {args.tokens} tokens, "
        f"batch 1, onnxruntime CPU, {args.threads} thread(s)\n"
    )
    print(
        "| export | logits output (MB) | prefill (ms) | prefill vs baseline "
        "| decode step (ms) | decode vs baseline | model files (MB) |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name, r in results.items():
        print(
            f"| {name} | {r.logits_mb:.1f} | {r.prefill_s * 1e3:.1f} | {base.prefill_s / r.prefill_s:.2f}x "
            f"| {r.decode_s * 1e3:.2f} | {base.decode_s / r.decode_s:.2f}x | {r.file_mb:.1f} |"
        )
    ppl = results["int8, last logits"].perplexity
    print(
        f"\nexport_lm perplexity on {ppl['tokens']} tokens: float32 {ppl['float32']:.2f}, int8 {ppl['int8']:.2f} "
        f"({(ppl['int8'] / ppl['float32'] - 1) * 100:+.2f}%)"
    )


if __name__ == "__main__":
    main()

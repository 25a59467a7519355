"""Held-out perplexity of the tiny text fixture's exported ONNX graph against a unigram baseline, and samples.

    .venv/bin/python -m bench.text_quality [--model models/tiny-text-fixture ...] [--samples 4] [--speed]

The held-out text is text_corpus.py's evaluation split (whole stdlib modules the model never saw),
tokenized with the model's own tokenizer, documents joined by <|eos|> as in training, cut into
consecutive windows of the context length. Each window is decoded teacher-forced, one token at a
time through the KV cache, with onnxruntime on model.onnx; every token but a window's first is
scored. The baseline, measured in the same run on the same tokens: a unigram model of the training
split's token frequencies with add-one smoothing. Samples use transformers' own logits processors
with the model's generation_config.json. Prints a markdown table, each model's perplexity also
against the first model given (list the float32 export first to compare precisions), how many of
its greedy tokens after each prompt equal the first model's before the first difference, and with
`--speed` each model's batch-1 greedy decode tokens/s through the lm service over gRPC.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "models"))

import text_corpus  # noqa: E402
from train_text_model import token_stream  # noqa: E402

PROMPTS = ("The list", "Return the", "This module provides", "If the file")


def unigram_log_probs(train_ids: np.ndarray, vocab_size: int) -> np.ndarray:
    """log p(token) from training-split frequencies, add-one smoothed over the whole vocabulary."""
    counts = np.bincount(train_ids, minlength=vocab_size).astype(np.float64)
    return np.log((counts + 1) / (counts.sum() + vocab_size))


def windows_of(ids: np.ndarray, length: int) -> list[np.ndarray]:
    """Consecutive windows of `length` tokens; the last may be shorter (kept if it scores at least one token)."""
    return [ids[start : start + length] for start in range(0, len(ids) - 1, length)]


def onnx_window_nll(session, windows: list[np.ndarray], rows: int = 16) -> tuple[float, int]:
    """Sum of -log p(token | earlier tokens of its window) over every window token but the first."""
    from muestra.lm.export.checks import empty_past, run_step

    total, count = 0.0, 0
    groups: dict[int, list[np.ndarray]] = {}
    for window in windows:
        groups.setdefault(len(window), []).append(window)
    for length, same in sorted(groups.items()):
        for start in range(0, len(same), rows):
            batch = np.stack(same[start : start + rows]).astype(np.int64)
            past = empty_past(session, len(batch))
            for position in range(length - 1):
                mask = np.ones((len(batch), position + 1), dtype=np.int64)
                logits, past = run_step(session, batch[:, position : position + 1], mask, past)
                row = logits[:, -1].astype(np.float64)
                top = row.max(axis=1, keepdims=True)
                log_z = top[:, 0] + np.log(np.exp(row - top).sum(axis=1))
                total += float((log_z - row[np.arange(len(batch)), batch[:, position + 1]]).sum())
                count += len(batch)
    return total, count


def sample(session, tokenizer: Tokenizer, generation_config: dict, prompt: str, max_tokens: int, seed: int) -> str:
    """A continuation drawn with transformers' processors for the model's generation_config.json."""
    import torch
    from transformers import RepetitionPenaltyLogitsProcessor, TemperatureLogitsWarper, TopPLogitsWarper

    from muestra.lm.export.checks import empty_past, run_step

    processors = [RepetitionPenaltyLogitsProcessor(generation_config.get("repetition_penalty", 1.0))]
    processors.append(TemperatureLogitsWarper(generation_config.get("temperature", 1.0)))
    processors.append(TopPLogitsWarper(generation_config.get("top_p", 1.0)))
    generator = torch.Generator().manual_seed(seed)
    ids = tokenizer.encode(prompt).ids
    step_ids = np.array([ids], dtype=np.int64)
    past = empty_past(session, 1)
    for _ in range(max_tokens):
        mask = np.ones((1, len(ids)), dtype=np.int64)
        logits, past = run_step(session, step_ids, mask, past)
        scores = torch.from_numpy(logits[:, -1].astype(np.float32))
        for processor in processors:
            scores = processor(torch.tensor([ids]), scores)
        token = int(torch.multinomial(torch.softmax(scores, dim=-1), 1, generator=generator))
        if token in (generation_config.get("eos_token_id"),):
            break
        ids.append(token)
        step_ids = np.array([[token]], dtype=np.int64)
    return tokenizer.decode(ids)


def greedy_ids(session, tokenizer: Tokenizer, prompt: str, steps: int) -> list[int]:
    """`steps` greedy tokens after `prompt` (no stop at <|eos|>, so every model gives as many)."""
    from muestra.lm.export.checks import empty_past, run_step

    ids = tokenizer.encode(prompt).ids
    step_ids, past, out = np.array([ids], dtype=np.int64), empty_past(session, 1), []
    for _ in range(steps):
        logits, past = run_step(session, step_ids, np.ones((1, len(ids) + len(out)), dtype=np.int64), past)
        out.append(int(logits[0, -1].argmax()))
        step_ids = np.array([out[-1:]], dtype=np.int64)
    return out


def shared_prefix(a: list[int], b: list[int]) -> int:
    """How many leading tokens two sequences share."""
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=True)) if x != y), len(a))


def decode_speeds(folders: list[Path], threads: int, ids: np.ndarray) -> dict[Path, float]:
    """Batch-1 greedy decode tokens/s of each folder through the lm over one BatchSteps stream, after a
    64-token prompt of held-out text; the folders take turns in blocks (bench/decode.py's fastest_chunks)."""
    import tempfile

    from bench.decode import fastest_chunks
    from bench.decode_loops import StreamLoop

    chunk, repeats = 32, 8
    with tempfile.TemporaryDirectory(prefix="text-quality-") as logs:
        loops = {folder: StreamLoop(folder, threads, Path(logs)) for folder in folders}
        try:
            seconds = fastest_chunks(loops, ids[None, :64], chunk, repeats)
        finally:
            for loop in loops.values():
                loop.close()
    return {folder: chunk / s for folder, s in seconds.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, action="append", help="model folder(s); default models/tiny-text-fixture")
    parser.add_argument("--samples", type=int, default=len(PROMPTS), help="how many prompts to sample from")
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--threads", type=int, default=1, help="onnxruntime intra-op threads")
    parser.add_argument(
        "--speed", action="store_true", help="also time each model's batch-1 decode through the lm over gRPC"
    )
    args = parser.parse_args()
    folders = args.model or [REPO / "models" / "tiny-text-fixture"]

    import onnxruntime as ort

    started = time.monotonic()
    documents = text_corpus.documents()
    train_docs, held_out_docs = text_corpus.split(documents)
    tokenizer = Tokenizer.from_file(str(folders[0] / "tokenizer.json"))
    eos_id = tokenizer.token_to_id("<|eos|>")
    train_ids = np.array(token_stream(tokenizer, train_docs, eos_id), dtype=np.int64)
    held_out_ids = np.array(token_stream(tokenizer, held_out_docs, eos_id), dtype=np.int64)
    held_out_bytes = sum(len(doc.text.encode()) for doc in held_out_docs)
    context = json.loads((folders[0] / "config.json").read_text())["max_position_embeddings"]
    windows = windows_of(held_out_ids, context)
    scored = np.concatenate([window[1:] for window in windows])
    unigram_nll = float(-unigram_log_probs(train_ids, tokenizer.get_vocab_size())[scored].sum())
    print(
        f"corpus {text_corpus.corpus_sha256(documents)[:12]} (Python {sys.version.split()[0]}): "
        f"train {len(train_ids):,} tokens; held out {len(held_out_docs)} documents, {held_out_bytes:,} bytes, "
        f"{len(held_out_ids):,} tokens in {len(windows)} windows of {context}; {len(scored):,} scored",
        flush=True,
    )

    rows = [("unigram, add-one (baseline)", "-", unigram_nll, len(scored), None, None)]
    sessions = {}
    for folder in folders:
        options = ort.SessionOptions()
        options.intra_op_num_threads = args.threads
        session = ort.InferenceSession(str(folder / "model.onnx"), options, providers=["CPUExecutionProvider"])
        sessions[folder] = session
        begun = time.monotonic()
        nll, count = onnx_window_nll(session, windows)
        assert count == len(scored)
        size = sum(p.stat().st_size for p in folder.iterdir() if p.is_file())
        weights = json.loads((folder / "muestra_export.json").read_text())["weights_dtype"]
        label = f"{folder.name} ({weights}, {size / 1e6:.1f} MB)"
        rows.append((label, "onnxruntime", nll, count, time.monotonic() - begun, folder))
    speeds = decode_speeds(folders, args.threads, held_out_ids) if args.speed else {}
    greedy = {
        folder: [greedy_ids(sessions[folder], tokenizer, prompt, args.max_tokens) for prompt in PROMPTS]
        for folder in folders
    }

    baseline_ppl = math.exp(unigram_nll / len(scored))
    first_ppl = math.exp(rows[1][2] / rows[1][3])
    print(
        f"\n| model | run with | perplexity | vs {folders[0].name} | bits/byte | unigram ppl / model ppl | eval s "
        f"| greedy tokens before leaving {folders[0].name}'s ({len(PROMPTS)} prompts x {args.max_tokens}) |"
        + (" decode tok/s, lm over gRPC |" if speeds else "")
    )
    print("|---|---|---:|---:|---:|---:|---:|---:|" + ("---:|" if speeds else ""))
    for name, engine, nll, count, seconds, folder in rows:
        ppl = math.exp(nll / count)
        bits_per_byte = nll / math.log(2) / held_out_bytes
        timing = "-" if seconds is None else f"{seconds:.0f}"
        versus = "-" if folder is None else f"{100 * (ppl / first_ppl - 1):+.2f}%"
        speed = (f" {speeds[folder]:.0f} |" if folder in speeds else " - |") if speeds else ""
        agree = "-"
        if folder is not None:
            prefixes = [shared_prefix(a, b) for a, b in zip(greedy[folder], greedy[folders[0]], strict=True)]
            agree = " / ".join(str(n) for n in prefixes)
        print(
            f"| {name} | {engine} | {ppl:.2f} | {versus} | {bits_per_byte:.3f} | {baseline_ppl / ppl:.2f}x "
            f"| {timing} | {agree} |{speed}"
        )

    folder = folders[0]
    generation_config = json.loads((folder / "generation_config.json").read_text())
    shown = {k: generation_config.get(k) for k in ("temperature", "top_p", "repetition_penalty")}
    print(f"\nSamples from {folder.name} (onnxruntime, generation_config.json {shown}, seed 0):\n")
    for prompt in PROMPTS[: args.samples]:
        text = sample(sessions[folder], tokenizer, generation_config, prompt, args.max_tokens, seed=0)
        print(f"- {text!r}")
    print(f"\n({time.monotonic() - started:.0f} s in all)")


if __name__ == "__main__":
    main()

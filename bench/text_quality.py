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

With `--gguf FILE`, the --model folders are our imports of FILE (python -m muestra.lm.export FILE DIR ...)
and each is compared with llama.cpp's llama-perplexity on FILE (and on `--llama-types` made from it by
llama-quantize) over the same text and the same ids: see compare_with_llama_cpp.

    .venv/bin/python -m bench.text_quality --gguf FILE.gguf --model DIR_F32 --model DIR_Q4_1 --llama-types F32
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
                total += next_token_nll(logits[:, -1], batch[:, position + 1])
                count += len(batch)
    return total, count


def next_token_nll(logits: np.ndarray, targets: np.ndarray) -> float:
    """Sum over rows of -log softmax(logits[row])[targets[row]], in float64."""
    row = logits.astype(np.float64)
    top = row.max(axis=1, keepdims=True)
    log_z = top[:, 0] + np.log(np.exp(row - top).sum(axis=1))
    return float((log_z - row[np.arange(len(row)), targets]).sum())


def llama_perplexity_chunks(ids: list[int], context: int, chunks: int, bos: int | None) -> np.ndarray:
    """The chunks llama-perplexity evaluates: consecutive runs of `context` ids from the first (at most
    `chunks` of them; -1: all whole ones), each one's first id replaced by BOS if the vocabulary adds one."""
    whole = len(ids) // context
    count = whole if chunks < 0 else min(chunks, whole)
    out = np.array(ids[: count * context], dtype=np.int64).reshape(count, context)
    if bos is not None:
        out[:, 0] = bos
    return out


def onnx_second_half_nll(session, chunks: np.ndarray, rows: int = 16) -> tuple[float, int]:
    """Sum of -log p(token | the chunk's tokens before it) over the positions llama-perplexity scores in a
    chunk of C: C/2 + 1 to C - 1. The first C/2 + 1 tokens go in as one prefill, the rest one a step."""
    from muestra.lm.export.checks import empty_past, run_step

    length = chunks.shape[1]
    first = length // 2
    total, count = 0.0, 0
    for start in range(0, len(chunks), rows):
        batch = chunks[start : start + rows]
        past, step_ids = empty_past(session, len(batch)), batch[:, : first + 1]
        for position in range(first, length - 1):
            mask = np.ones((len(batch), position + 1), dtype=np.int64)
            logits, past = run_step(session, step_ids, mask, past)
            total += next_token_nll(logits[:, -1], batch[:, position + 1])
            count += len(batch)
            step_ids = batch[:, position + 1 : position + 2]
    return total, count


def same_ids_note(ours: list[int], theirs: list[int]) -> str:
    """Whether our tokenizer gives llama.cpp's ids, and where they part if not."""
    if ours == theirs:
        return f"the same {len(ours):,} ids"
    at = next((i for i, (a, b) in enumerate(zip(ours, theirs, strict=False)) if a != b), min(len(ours), len(theirs)))
    return f"DIFFERENT ids ({len(ours):,} against llama.cpp's {len(theirs):,}; the first difference at id {at})"


def compare_with_llama_cpp(args) -> None:
    """Our perplexity next to llama-perplexity's on the same GGUF file, the same text and the same ids.

    The text is text_corpus's held-out split, documents joined by blank lines, in one file that both
    read. llama-perplexity (its defaults: no escape processing, special-token names left as text) cuts
    its ids into consecutive chunks of --context from the first, puts BOS in place of each chunk's first
    id if the vocabulary adds one, and scores each chunk's second half only: the token at position k
    given the k before it, for k = C/2 + 1 .. C - 1. Ours take llama-tokenize's ids for the same file
    (the very ids llama-perplexity scores) and score the same positions of the same chunks; whether our
    tokenizer.json gives those ids too is printed beside.
    """
    import tempfile

    import onnxruntime as ort

    from bench import llama_cpp

    binaries = llama_cpp.build()
    own_type = llama_cpp.file_type(args.gguf)
    kinds = [own_type, *(k for k in args.llama_types.split(",") if k and k != own_type)]
    _, held_out_docs = text_corpus.split(text_corpus.documents())
    text = "\n\n".join(doc.text for doc in held_out_docs).rstrip("\n")  # llama-perplexity's -f drops one
    rows = []
    with tempfile.TemporaryDirectory(prefix="text-quality-") as scratch:
        text_file = Path(scratch) / "held_out.txt"
        text_file.write_bytes(text.encode())
        ids = llama_cpp.tokenize(binaries, args.gguf, ["-f", str(text_file)])
        bos = llama_cpp.bos_id(binaries, args.gguf)
        chunks = llama_perplexity_chunks(ids, args.context, args.chunks, bos)
        if len(ids) < 2 * args.context or len(chunks) == 0:
            raise SystemExit(f"{len(ids)} ids: llama-perplexity needs at least {2 * args.context}")
        scored = len(chunks) * (args.context - args.context // 2 - 1)
        for kind in kinds:
            model = llama_cpp.variant(args.gguf, kind, binaries)
            begun = time.monotonic()
            theirs = llama_cpp.perplexity(binaries, model, text_file, args.context, len(chunks), args.threads)
            if (theirs["chunks"], theirs["context"]) != (len(chunks), args.context):
                raise RuntimeError(f"llama-perplexity ran {theirs['chunks']} chunks of {theirs['context']}")
            name = args.gguf.name if model == args.gguf else f"{kind} by llama-quantize"
            label = f"llama.cpp {kind}"
            rows.append((label, f"{name}, llama-perplexity", theirs["perplexity"], time.monotonic() - begun))
    print(
        f"held-out text: {len(held_out_docs)} documents, {len(text.encode()):,} bytes; llama.cpp's tokenizer "
        f"({args.gguf.name}): {len(ids):,} ids{'' if bos is None else f', BOS {bos} first'}; "
        f"{len(chunks)} chunks of {args.context}, the last {args.context - args.context // 2 - 1} positions of "
        f"each scored ({scored:,} in all), as llama-perplexity does; ours score the same ids at the same positions"
    )
    plain = ids[1:] if bos is not None else ids
    for folder in args.model:
        options = ort.SessionOptions()
        options.intra_op_num_threads = args.threads
        session = ort.InferenceSession(str(folder / "model.onnx"), options, providers=["CPUExecutionProvider"])
        begun = time.monotonic()
        nll, count = onnx_second_half_nll(session, chunks)
        assert count == scored
        tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
        note = same_ids_note(tokenizer.encode(text, add_special_tokens=False).ids, plain)
        print(f"{folder.name}'s tokenizer.json gives {note}")
        export = json.loads((folder / "muestra_export.json").read_text())
        size = sum(p.stat().st_size for p in folder.iterdir() if p.is_file())
        label = f"{folder.name} ({export.get('weights_dtype', '?')}, {size / 1e6:.1f} MB)"
        rows.append((label, "onnxruntime", math.exp(nll / count), time.monotonic() - begun))

    references = rows[: len(kinds)]
    ours_first = rows[len(kinds)][2]
    print(
        "\n| model | run with | perplexity | "
        + " | ".join(f"ours / {label}" for label, *_ in references)
        + f" | vs {args.model[0].name} | eval s |"
    )
    print("|---|---|---:|" + "---:|" * len(references) + "---:|---:|")
    for index, (label, engine, ppl, seconds) in enumerate(rows):
        ours = index >= len(kinds)
        ratios = [f"{ppl / ref:.4f} ({100 * (ppl / ref - 1):+.2f}%)" if ours else "-" for _, _, ref, _ in references]
        versus = f"{100 * (ppl / ours_first - 1):+.2f}%" if ours else "-"
        print(f"| {label} | {engine} | {ppl:.4f} | " + " | ".join(ratios) + f" | {versus} | {seconds:.0f} |")


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
    parser.add_argument("--gguf", type=Path, help="compare the --model imports of this GGUF file with llama.cpp on it")
    parser.add_argument("--llama-types", default="", help="with --gguf: also llama.cpp on these types of it (F32,...)")
    parser.add_argument("--context", type=int, default=512, help="with --gguf: chunk length (llama-perplexity -c)")
    parser.add_argument("--chunks", type=int, default=-1, help="with --gguf: at most this many chunks (-1: all)")
    parser.add_argument(
        "--speed", action="store_true", help="also time each model's batch-1 decode through the lm over gRPC"
    )
    args = parser.parse_args()
    folders = args.model or [REPO / "models" / "tiny-text-fixture"]

    import onnxruntime as ort

    started = time.monotonic()
    if args.gguf:
        if not args.model:
            parser.error("--gguf compares the --model folders (imports of the file) with llama.cpp")
        compare_with_llama_cpp(args)
        print(f"\n({time.monotonic() - started:.0f} s in all)")
        return
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

"""Sampler chains per decode step: candidate selection (np.argpartition) against a full-vocabulary sort.

    .venv/bin/python -m bench.samplers [--rows 8] [--vocab 50257] [--repeats 50]

The baseline is top-p the way transformers' TopPLogitsWarper does it (sort the whole row,
softmax, cumsum, scatter back), in numpy, measured in the same run. Two kinds of logits:
"peaked" (a few tokens hold most of the mass, as a trained model's usually are) and "flat"
(the top_p=0.95 nucleus spans thousands of tokens, so the candidates widen to a full sort).
Prints a markdown table of medians per step, for the whole batch.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from muestra.gateway.engine.sampling import ModelInfo, SamplerRegistry, new_rows, sample_next_tokens, validate_chain
from muestra.plugin import softmax


def full_sort_top_p(logits: np.ndarray, top_p: float) -> np.ndarray:
    """transformers' TopPLogitsWarper in numpy: sort ascending, cumsum, drop mass <= 1 - top_p."""
    order = np.argsort(logits, axis=-1)
    sorted_logits = np.take_along_axis(logits, order, axis=-1)
    cumulative = np.cumsum(softmax(sorted_logits), axis=-1)
    remove_sorted = cumulative <= 1 - top_p
    remove_sorted[:, -1] = False
    remove = np.zeros_like(remove_sorted)
    np.put_along_axis(remove, order, remove_sorted, axis=-1)
    out = logits.copy()
    out[remove] = -np.inf
    return out


def make_logits(kind: str, rows: int, vocab: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if kind == "peaked":  # Zipf-like ranks plus noise
        base = -1.1 * np.log(np.arange(1, vocab + 1)) * 1.5
        return np.stack([rng.permutation(base) + rng.normal(0, 0.5, vocab) for _ in range(rows)]).astype(np.float32)
    return rng.normal(0, 1.0, (rows, vocab)).astype(np.float32)


def median_ms(fn, repeats: int) -> float:
    fn()  # warm up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=8)
    parser.add_argument("--vocab", type=int, default=50257)
    parser.add_argument("--repeats", type=int, default=50)
    args = parser.parse_args()

    registry = SamplerRegistry.load(env={})
    model = ModelInfo(vocab_size=args.vocab)
    top_p_processor = registry.get("top_p")
    params = [top_p_processor.validate({"top_p": 0.95}, model)] * args.rows
    chains = {
        "temperature 0.8, top_p 0.95, sample": [("temperature", {"temperature": 0.8}), ("top_p", {"top_p": 0.95})],
        "temperature, top_k 50, top_p, sample (HF do_sample default)": [
            ("temperature", {"temperature": 0.8}),
            ("top_k", {"top_k": 50}),
            ("top_p", {"top_p": 0.95}),
        ],
        "repetition_penalty, temperature, top_p, sample": [
            ("repetition_penalty", {"repetition_penalty": 1.1}),
            ("temperature", {"temperature": 0.8}),
            ("top_p", {"top_p": 0.95}),
        ],
        "greedy (logits path)": [("greedy", {})],
    }

    print(f"batch {args.rows} x vocab {args.vocab}, median of {args.repeats} steps (ms per step, whole batch)\n")
    print("| logits | what | ms/step | vs full-sort top-p |")
    print("|---|---|---:|---:|")
    for kind in ("peaked", "flat"):
        logits = make_logits(kind, args.rows, args.vocab)
        reference = full_sort_top_p(logits, 0.95)
        ours = top_p_processor.process(logits.copy(), params, [])
        assert np.array_equal(np.isneginf(ours), np.isneginf(reference)), "top_p differs from the full-sort baseline"
        kept = int(np.isfinite(ours).sum(axis=-1).mean())
        baseline = median_ms(lambda logits=logits: full_sort_top_p(logits, 0.95), args.repeats)
        print(f"| {kind} ({kept} tokens kept) | top_p 0.95, full sort (baseline) | {baseline:.2f} | 1.00x |")
        ms = median_ms(lambda logits=logits: top_p_processor.process(logits.copy(), params, []), args.repeats)
        print(f"| {kind} | top_p 0.95, candidates (muestra) | {ms:.2f} | {baseline / ms:.2f}x |")
        for label, specs in chains.items():
            chain = validate_chain(registry, [{"name": n, "params": p} for n, p in specs], model)
            rows = new_rows(chain, list(range(64)), seed=0, n=args.rows)
            ms = median_ms(lambda logits=logits, rows=rows: sample_next_tokens(rows, logits), args.repeats)
            print(f"| {kind} | chain: {label} | {ms:.2f} | {baseline / ms:.2f}x |")


if __name__ == "__main__":
    main()

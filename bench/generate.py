"""End-to-end streaming through the gateway (tokenizer + lm + gateway processes on loopback).

    .venv/bin/python bench/generate.py                      # gpt2-124m and llama-tiny
    .venv/bin/python bench/generate.py --models llama-tiny --tokens 64
    .venv/bin/python bench/generate.py --models llama-100m --precision int8

Reports, per model, against baselines measured in the same run:
- single-stream decode tokens/s through the gateway vs the lm's own decode rate (the lm service
  driven over gRPC with ARGMAX steps, as bench/decode.py does: a Decode per token, and greedy
  bursts of --burst steps per Decode as the gateway runs greedy rows; the ratio is to the faster)
  and a bare in-process onnxruntime greedy loop over the same graph;
- aggregate tokens/s at 1, 4, 8 and 16 concurrent streams (and the ratio to one stream);
- time to first token and inter-token latency, p50 and p95, as the client sees them;
- 8 concurrent streams vs transformers generate serving the same 8 requests one after another;
- with --baseline-gateway CHECKOUT: the gateway of another checkout (say, a worktree of the commit
  before a change) on the same tokenizer and lm processes, 1 and 8 streams, interleaved round by round
  with ours: the ratio shows what the change did to the gateway's cost.
Greedy decoding with ignore_eos, so every stream produces exactly --tokens tokens. The contenders
are interleaved round by round; each figure is the best of --repeats rounds, and the single-stream
ratio is also given as the median of the per-round figures (the bare loop's speed varies more from
round to round than the gateway's on a small machine, so the two statistics can differ).
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:] = [str(ROOT), *(p for p in sys.path if Path(p or ".").resolve() != ROOT / "bench")]

import argparse  # noqa: E402
import json  # noqa: E402
import tempfile  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402

from bench import decode_models  # noqa: E402
from bench.decode_loops import ServiceLoop, SharedBufferLoop, StreamLoop, TorchLoop  # noqa: E402
from muestra.cli.launch import ServiceProcess  # noqa: E402
from muestra.client import Client  # noqa: E402

CONCURRENCY = (1, 4, 8, 16)
PROMPT_WORDS = 16
# Before each single-stream contender: the other sessions' onnxruntime threads stop spinning (see
# bench/decode.py's fastest_chunks: an idle pool's spinning slows the next one by up to 40% on 2 cores).
SETTLE_S = 0.3


def prompt_ids(index: int, vocab: int) -> np.ndarray:
    """PROMPT_WORDS ids that the bench tokenizer spells as words (w3…), different per stream."""
    return np.random.default_rng(index).integers(3, min(vocab, 4096), PROMPT_WORDS)


def prompt_text(index: int, vocab: int) -> str:
    return " ".join(f"w{i}" for i in prompt_ids(index, vocab))


def checkout_env(checkout: Path) -> dict:
    """PYTHONPATH that imports the gateway, runtime, proto and plugin API of another checkout first."""
    folders = ["proto", "services/gateway", "services/runtime", "plugins/api", "plugins/mirostat", "plugins/choice"]
    return {"PYTHONPATH": ":".join(str(checkout.resolve() / folder) for folder in folders)}


class Stack:
    def __init__(
        self, onnx_dir: Path, threads: int, log_dir: Path, vocab: int, burst: int = 8, baseline: Path | None = None
    ) -> None:
        self.vocab = vocab
        quiet = ["--log-level", "WARNING"]
        self.tokenizer = ServiceProcess("tokenizer", ["--models", str(onnx_dir), *quiet], log_dir)
        lm_args = ["--model", str(onnx_dir), "--providers", "cpu", "--intra-op-threads", str(threads)]
        self.lm = ServiceProcess("lm", [*lm_args, "--max-batch-rows", "64", *quiet], log_dir)
        gateway_args = ["--tokenizer-addr", self.tokenizer.address, "--lm-addr", self.lm.address, "--http-port", "-1"]
        gateway_args += ["--max-batch-rows", "64", "--greedy-burst", str(burst)]
        self.gateway = ServiceProcess("gateway", [*gateway_args, *quiet], log_dir)
        self.client = Client(self.gateway.address, timeout=600)
        self.baseline_gateway = self.baseline_client = None
        if baseline is not None:
            env = checkout_env(baseline)
            self.baseline_gateway = ServiceProcess("gateway", [*gateway_args, *quiet], log_dir, env=env)
            self.baseline_client = Client(self.baseline_gateway.address, timeout=600)

    def stream(self, index: int, tokens: int, client: Client | None = None) -> dict:
        """One greedy stream; the arrival time of every delta as the client sees it."""
        started = time.perf_counter()
        stamps = []
        generation = (client or self.client).generate(
            prompt_text(index, self.vocab),
            max_tokens=tokens,
            ignore_eos=True,
            samplers=[{"name": "greedy"}],
            # The plain argmax the lm's own loops and the bare loop compute (the bench models' tokenizers are
            # smaller than their vocabularies: by default the gateway would never pick the ids past them).
            allow_special_tokens=True,
        )
        for delta in generation:
            stamps.extend([time.perf_counter()] * len(delta.token_ids))
        done = generation.completions[0]
        assert done.completion_tokens == tokens, done
        return {"started": started, "stamps": stamps}

    def concurrent(self, streams: int, tokens: int, client: Client | None = None) -> list[dict]:
        results: list[dict] = [{} for _ in range(streams)]

        def run(i: int) -> None:
            results[i] = self.stream(i, tokens, client)

        threads = [threading.Thread(target=run, args=(i,)) for i in range(streams)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        return results

    def close(self) -> None:
        self.client.close()
        if self.baseline_client is not None:
            self.baseline_client.close()
            self.baseline_gateway.stop()
        for process in (self.gateway, self.lm, self.tokenizer):
            process.stop()


def decode_rate(result: dict) -> float:
    """Tokens/s after the first token (what the bare loop's decode steps measure)."""
    stamps = result["stamps"]
    return (len(stamps) - 1) / (stamps[-1] - stamps[0])


def aggregate_rate(results: list[dict]) -> float:
    """All streams' tokens over the wall time from the first request to the last token."""
    start = min(r["started"] for r in results)
    end = max(r["stamps"][-1] for r in results)
    return sum(len(r["stamps"]) for r in results) / (end - start)


def bench_model(name: str, args, log_dir: Path) -> dict:
    quantize = None if args.precision == "fp32" else args.precision
    hf_dir, onnx_dir = decode_models.build(name, "fused", quantize)
    vocab = json.loads((hf_dir / "config.json").read_text())["vocab_size"]
    bare = SharedBufferLoop(onnx_dir, args.threads)
    stack = Stack(onnx_dir, args.threads, log_dir, vocab, args.burst, args.baseline_gateway)
    lm = ServiceLoop(onnx_dir, args.threads, log_dir)
    # The lm as the gateway drives a greedy row: bursts of --greedy-burst steps per Decode, on the same process.
    lm_burst = StreamLoop(onnx_dir, args.threads, log_dir, burst=args.burst, process=lm.process)
    try:
        prompt = prompt_ids(0, vocab)[None]
        stack.stream(0, 8)  # warm up every process
        best: dict = {"bare": 0.0, "lm": 0.0, "lm_burst": 0.0, "single": 0.0, **{c: 0.0 for c in CONCURRENCY}}
        rounds: dict[str, list[float]] = {"bare": [], "lm": [], "lm_burst": [], "single": []}
        # Ours and the baseline checkout's gateway, 1 and 8 streams, round by round (empty without one).
        versus: dict[str, list[float]] = {}
        if stack.baseline_client is not None:
            stack.stream(0, 8, stack.baseline_client)
            versus = {"ours_1": [], "baseline_1": [], "ours_8": [], "baseline_8": []}
        ttft, itl = [], []
        for _ in range(args.repeats):
            for key, loop in (("bare", bare), ("lm", lm), ("lm_burst", lm_burst)):
                time.sleep(SETTLE_S)
                seconds, _, _ = loop.decode(loop.prefill(prompt), args.tokens - 1)
                rounds[key].append((args.tokens - 1) / seconds)
            time.sleep(SETTLE_S)
            rounds["single"].append(decode_rate(stack.stream(0, args.tokens)))
            best.update({key: max(values) for key, values in rounds.items()})
            for streams in CONCURRENCY:
                results = stack.concurrent(streams, args.tokens)
                best[streams] = max(best[streams], aggregate_rate(results))
                for r in results:
                    ttft.append(r["stamps"][0] - r["started"])
                    itl.extend(np.diff(r["stamps"]).tolist())
            if versus:
                for gateway, client in (("ours", stack.client), ("baseline", stack.baseline_client)):
                    time.sleep(SETTLE_S)
                    versus[f"{gateway}_1"].append(decode_rate(stack.stream(0, args.tokens, client)))
                    time.sleep(SETTLE_S)
                    versus[f"{gateway}_8"].append(aggregate_rate(stack.concurrent(8, args.tokens, client)))
        # transformers generate serving 8 requests one after another (same weights, same lengths).
        torch_loop = TorchLoop(hf_dir)
        started = time.perf_counter()
        for i in range(8):
            torch_loop.decode(prompt_ids(i, vocab)[None], args.tokens - 1)
        transformers_8 = 8 * args.tokens / (time.perf_counter() - started)
    finally:
        lm_burst.close()
        lm.close()
        stack.close()
    return {
        "model": name,
        "precision": args.precision,
        "parameters": decode_models.parameters(name),
        "tokens": args.tokens,
        "bare_tokens_per_s": best["bare"],
        "lm_tokens_per_s": best["lm"],
        "lm_tokens_per_s_median": float(np.median(rounds["lm"])),
        "lm_burst_tokens_per_s": best["lm_burst"],
        "lm_burst_tokens_per_s_median": float(np.median(rounds["lm_burst"])),
        "burst": args.burst,
        "gateway_single_tokens_per_s": best["single"],
        "bare_tokens_per_s_median": float(np.median(rounds["bare"])),
        "gateway_single_tokens_per_s_median": float(np.median(rounds["single"])),
        "aggregate_tokens_per_s": {c: best[c] for c in CONCURRENCY},
        "transformers_sequential_8_tokens_per_s": transformers_8,
        "ttft_ms": {"p50": 1000 * float(np.percentile(ttft, 50)), "p95": 1000 * float(np.percentile(ttft, 95))},
        "itl_ms": {"p50": 1000 * float(np.percentile(itl, 50)), "p95": 1000 * float(np.percentile(itl, 95))},
        "versus_baseline": versus,
    }


def markdown(results: list[dict]) -> str:
    burst = results[0].get("burst", 8) if results else 8
    lines = [
        "| model | bare ORT loop tok/s | lm over gRPC, a Decode per token tok/s | lm over gRPC, greedy bursts of "
        f"{burst} tok/s | gateway, 1 stream tok/s | gateway / lm, fastest of both (best) | gateway / lm (median) |"
        " gateway / lm per token (best) | gateway / bare (best) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        single, lm, bare = r["gateway_single_tokens_per_s"], r["lm_tokens_per_s"], r["bare_tokens_per_s"]
        lm_burst = r.get("lm_burst_tokens_per_s", 0.0)
        fastest = max(lm, lm_burst)
        median = r["gateway_single_tokens_per_s_median"] / max(
            r["lm_tokens_per_s_median"], r.get("lm_burst_tokens_per_s_median", 0.0)
        )
        lines.append(
            f"| {r['model']} ({r['parameters'] / 1e6:.1f}M, {r['precision']}) | {bare:.1f} | {lm:.1f} |"
            f" {lm_burst:.1f} | {single:.1f} | {single / fastest:.2f}x | {median:.2f}x | {single / lm:.2f}x |"
            f" {single / bare:.2f}x |"
        )
    lines += [
        "",
        "| model |"
        + "".join(f" {c} streams tok/s |" for c in CONCURRENCY)
        + " 8 vs 1 | transformers, 8 one by one tok/s | gateway 8 vs transformers |",
        "|---|" + "---:|" * len(CONCURRENCY) + "---:|---:|---:|",
    ]
    for r in results:
        agg = r["aggregate_tokens_per_s"]
        lines.append(
            f"| {r['model']} ({r['precision']}) |"
            + "".join(f" {agg[c]:.1f} |" for c in CONCURRENCY)
            + f" {agg[8] / agg[1]:.2f}x | {r['transformers_sequential_8_tokens_per_s']:.1f} |"
            f" {agg[8] / r['transformers_sequential_8_tokens_per_s']:.2f}x |"
        )
    lines += [
        "",
        "| model | TTFT p50 ms | TTFT p95 ms | inter-token p50 ms | inter-token p95 ms |",
        "|---|---:|---:|---:|---:|",
    ]
    for r in results:
        lines.append(
            f"| {r['model']} | {r['ttft_ms']['p50']:.1f} | {r['ttft_ms']['p95']:.1f} | "
            f"{r['itl_ms']['p50']:.1f} | {r['itl_ms']['p95']:.1f} |"
        )
    if any(r.get("versus_baseline") for r in results):
        lines += [
            "",
            "| model | streams | this gateway tok/s, each round | baseline checkout's gateway tok/s, each round |"
            " this / baseline (median of rounds) | (best of rounds) |",
            "|---|---:|---|---|---:|---:|",
        ]
        for r in results:
            versus = r.get("versus_baseline")
            for streams in (1, 8) if versus else ():
                ours, theirs = versus[f"ours_{streams}"], versus[f"baseline_{streams}"]
                lines.append(
                    f"| {r['model']} | {streams} | {', '.join(f'{x:.1f}' for x in ours)} |"
                    f" {', '.join(f'{x:.1f}' for x in theirs)} |"
                    f" {np.median(ours) / np.median(theirs):.3f}x | {max(ours) / max(theirs):.3f}x |"
                )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["gpt2-124m", "llama-tiny"], choices=decode_models.MODELS)
    parser.add_argument("--tokens", type=int, default=64, help="tokens per stream")
    parser.add_argument(
        "--precision", default="fp32", choices=["fp32", "int8", "int4", "int8-dynamic"], help="of the fused export"
    )
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--burst", type=int, default=8, help="greedy steps per Decode of the lm's burst contender")
    parser.add_argument("--threads", type=int, default=0, help="onnxruntime intra-op threads (0: its default)")
    parser.add_argument("--json", type=Path, default=None, help="also write the raw figures here")
    parser.add_argument(
        "--baseline-gateway",
        type=Path,
        default=None,
        metavar="CHECKOUT",
        help="also run another checkout's gateway (e.g. a git worktree of an older commit) on the same lm",
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="muestra-bench-generate-") as log_dir:
        results = [bench_model(name, args, Path(log_dir)) for name in args.models]
    print(markdown(results))
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()

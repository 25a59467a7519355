"""Structured generation: what a JSON Schema constraint costs, through the real stack.

    .venv/bin/python bench/structured.py                          # gpt2-124m and the tiny text fixture
    .venv/bin/python bench/structured.py --models tiny-text-fixture --repeats 2

Per model, with a realistic JSON Schema of ten fields, in one run with the contenders interleaved
round by round (each figure is the best of --repeats rounds; ratios are of figures from one run):
- tokens/s of greedy streams constrained by the schema against the same requests unconstrained
  (max_tokens set to the constrained completion's length, ignore_eos), at 1 and 8 concurrent streams:
  one stream's decode rate after its first token, and the aggregate rate of 8;
- the same constrained requests with the mask applied in the gateway (--constraint-mask gateway: full
  logits shipped every step) against the mask applied in the lm (the default: ARGMAX only);
- sampled streams (temperature 0.8), constrained against unconstrained, at 8 streams;
- the schema's compile time and the time to compute one row's mask and advance it (llguidance, in
  process, replaying the constrained completion's tokens), and the share of fast-forwarded tokens
  (forced by the grammar, taken without sampling; Usage.forced_tokens).
The 124M model is bench/decode_models.py's random GPT-2 with a 50,257-token byte-fallback BPE trained
on the standard library (bench/llama_cpp.py's), since llguidance needs real tokens to match text.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:] = [str(ROOT), *(p for p in sys.path if Path(p or ".").resolve() != ROOT / "bench")]

import argparse  # noqa: E402
import json  # noqa: E402
import re  # noqa: E402
import shutil  # noqa: E402
import tempfile  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
import urllib.request  # noqa: E402

import numpy as np  # noqa: E402

from bench import decode_models  # noqa: E402
from bench.llama_cpp import llama_tokenizer  # noqa: E402
from muestra.cli.launch import ServiceProcess, free_port  # noqa: E402
from muestra.client import Client  # noqa: E402

TEXT_FIXTURE = ROOT / "models" / "tiny-text-fixture"
PROMPT = "Describe the customer as JSON:"
STREAMS = (1, 8)
# Every string and number is bounded: a random model greedily writes a float's digits, or a string, forever.
SCHEMA = {
    "type": "object",
    "properties": {
        "id": {"type": "integer", "minimum": 1, "maximum": 1_000_000},
        "name": {"type": "string", "minLength": 1, "maxLength": 24},
        "email": {"type": "string", "pattern": "^[a-z0-9.]{1,16}@[a-z]{1,12}\\.(com|org|net|es)$"},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "active": {"type": "boolean"},
        "plan": {"enum": ["free", "pro", "enterprise"]},
        "score": {"type": "integer", "minimum": 0, "maximum": 100},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 12}, "maxItems": 4},
        "address": {
            "type": "object",
            "properties": {
                "street": {"type": "string", "maxLength": 32},
                "city": {"type": "string", "maxLength": 20},
                "zip": {"type": "string", "pattern": "^[0-9]{5}$"},
            },
            "required": ["street", "city", "zip"],
            "additionalProperties": False,
        },
        "notes": {"type": "string", "maxLength": 40},
    },
    "required": ["id", "name", "email", "age", "active", "plan", "score", "tags", "address"],
    "additionalProperties": False,
}
CONSTRAINT = {"name": "json_schema", "params": {"schema": SCHEMA}}
GREEDY = [{"name": "greedy"}]
SAMPLED = [{"name": "temperature", "params": {"temperature": 0.8}}, {"name": "sample"}]


def gpt2_folder(work: Path) -> Path:
    """gpt2-124m's fused export beside a byte-fallback BPE of its 50,257 tokens (trained once, cached)."""
    hf_dir, onnx_dir = decode_models.build("gpt2-124m", "fused")
    vocab = json.loads((hf_dir / "config.json").read_text())["vocab_size"]
    tokenizer_dir = decode_models.CACHE / "gpt2-124m" / "bpe-tokenizer"
    if not (tokenizer_dir / "tokenizer.json").is_file():
        staging = Path(tempfile.mkdtemp(prefix=".bpe.", dir=tokenizer_dir.parent))
        llama_tokenizer(staging, vocab)
        shutil.rmtree(tokenizer_dir, ignore_errors=True)
        staging.rename(tokenizer_dir)
    folder = work / "gpt2-124m"
    folder.mkdir()
    for item in onnx_dir.iterdir():
        if not item.name.startswith(("tokenizer", "special_tokens")):
            (folder / item.name).symlink_to(item)
    for item in tokenizer_dir.iterdir():
        shutil.copy(item, folder / item.name)
    return folder


class Stack:
    """Tokenizer and lm for one model, and two gateways over them: the mask in the lm, and in the gateway."""

    def __init__(self, folder: Path, threads: int, log_dir: Path) -> None:
        quiet = ["--log-level", "WARNING"]
        self.tokenizer = ServiceProcess("tokenizer", ["--models", str(folder), *quiet], log_dir)
        self.lm_metrics_port = free_port()
        lm_args = ["--model", str(folder), "--providers", "cpu", "--intra-op-threads", str(threads)]
        lm_args += ["--metrics-port", str(self.lm_metrics_port)]
        self.lm = ServiceProcess("lm", [*lm_args, "--max-batch-rows", "32", *quiet], log_dir)
        common = ["--tokenizer-addr", self.tokenizer.address, "--lm-addr", self.lm.address, "--http-port", "-1"]
        common += ["--prefix-cache-block-size", "0", *quiet]
        self.gateways = {
            mode: ServiceProcess("gateway", [*common, "--constraint-mask", mode], log_dir) for mode in ("lm", "gateway")
        }
        self.clients = {mode: Client(g.address, timeout=600) for mode, g in self.gateways.items()}

    def lm_steps(self) -> int:
        """Decode steps the lm has run (its muestra_lm_decode_step_seconds histogram's count)."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.lm_metrics_port}/metrics", timeout=10) as reply:
            text = reply.read().decode()
        return int(float(re.search(r"^muestra_lm_decode_step_seconds_count (\S+)$", text, re.M).group(1)))

    def stream(self, mode: str, index: int, **request) -> dict:
        """One stream; the arrival time of every token as the client sees it, and its completion."""
        if callable(request.get("max_tokens")):
            request["max_tokens"] = request["max_tokens"](index)
        started = time.perf_counter()
        stamps = []
        generation = self.clients[mode].generate(f"{PROMPT} #{index}", seed=index, **request)
        for delta in generation:
            stamps.extend([time.perf_counter()] * len(delta.token_ids))
        done = generation.completions[0]
        assert not done.error, done.error
        return {"started": started, "stamps": stamps, "done": done, "ids": generation.token_ids[0]}

    def concurrent(self, mode: str, streams: int, **request) -> list[dict]:
        results: list[dict] = [{} for _ in range(streams)]

        def run(i: int) -> None:
            results[i] = self.stream(mode, i, **request)

        threads = [threading.Thread(target=run, args=(i,)) for i in range(streams)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        return results

    def close(self) -> None:
        for client in self.clients.values():
            client.close()
        for process in (*self.gateways.values(), self.lm, self.tokenizer):
            process.stop()


def decode_rate(result: dict) -> float:
    stamps = result["stamps"]
    return (len(stamps) - 1) / (stamps[-1] - stamps[0])


def aggregate_rate(results: list[dict]) -> float:
    start = min(r["started"] for r in results)
    end = max(r["stamps"][-1] for r in results)
    return sum(len(r["stamps"]) for r in results) / (end - start)


def rate(results: list[dict]) -> float:
    return decode_rate(results[0]) if len(results) == 1 else aggregate_rate(results)


def engine_costs(folder: Path, replay: list[int], vocab: int, eos: list[int]) -> dict:
    """Compile time of the schema, and per-token mask and advance times over `replay` (llguidance in process)."""
    import llguidance

    from muestra.gateway.engine.constraints.engine import JSON_OPTIONS, RowConstraint, fill_masks

    tokenizer = llguidance.LLTokenizer((folder / "tokenizer.json").read_text(), n_vocab=vocab, eos_token=eos)
    grammar = llguidance.LLMatcher.grammar_from_json_schema(SCHEMA, defaults=JSON_OPTIONS)
    compiles = []
    for _ in range(5):
        started = time.perf_counter()
        matcher = llguidance.LLMatcher(tokenizer, grammar, log_level=0)
        compiles.append(time.perf_counter() - started)
    masks, advances = [], []
    for _ in range(3):
        row = RowConstraint(matcher.deep_copy(), (vocab + 31) // 32)
        for token in replay:
            started = time.perf_counter()
            fill_masks([row])
            masks.append(time.perf_counter() - started)
            started = time.perf_counter()
            assert row.consume(token), row.error
            advances.append(time.perf_counter() - started)
    ms = 1000.0
    return {
        "compile_ms": ms * min(compiles),
        "mask_ms_p50": ms * float(np.percentile(masks, 50)),
        "mask_ms_p95": ms * float(np.percentile(masks, 95)),
        "advance_ms_p50": ms * float(np.percentile(advances, 50)),
    }


def bench_model(name: str, args, work: Path) -> dict:
    folder = gpt2_folder(work) if name == "gpt2-124m" else TEXT_FIXTURE
    config = json.loads((folder / "config.json").read_text())
    stack = Stack(folder, args.threads, work)
    try:
        # Each constrained stream's length (its prompt and seed fix it) sets the same unconstrained stream's.
        greedy_lengths, sampled_lengths = [], []
        for i in range(max(STREAMS)):
            probe = stack.stream("lm", i, max_tokens=args.max_tokens, samplers=GREEDY, constraint=CONSTRAINT)
            text = stack.clients["lm"].detokenize(probe["ids"])
            if probe["done"].finish_reason != "stop":
                raise SystemExit(f"{name}: the greedy JSON did not finish in {args.max_tokens} tokens: {text!r}")
            json.loads(text)
            greedy_lengths.append(len(probe["ids"]))
            sampled = stack.stream("lm", i, max_tokens=args.max_tokens, samplers=SAMPLED, constraint=CONSTRAINT)
            sampled_lengths.append(len(sampled["ids"]))
        replay, tokens = probe["ids"], greedy_lengths[0]
        # Decode steps of one constrained greedy stream alone (fast-forward feeds forced tokens several at once).
        before = stack.lm_steps()
        alone = stack.stream("lm", 0, max_tokens=args.max_tokens, samplers=GREEDY, constraint=CONSTRAINT)
        steps_alone = stack.lm_steps() - before
        contenders = {
            "free": ("lm", {"max_tokens": greedy_lengths.__getitem__, "ignore_eos": True, "samplers": GREEDY}),
            "json": ("lm", {"max_tokens": args.max_tokens, "samplers": GREEDY, "constraint": CONSTRAINT}),
            "json_mask_in_gateway": (
                "gateway", {"max_tokens": args.max_tokens, "samplers": GREEDY, "constraint": CONSTRAINT}
            ),
            "free_sampled": (
                "lm", {"max_tokens": sampled_lengths.__getitem__, "ignore_eos": True, "samplers": SAMPLED}
            ),
            "json_sampled": ("lm", {"max_tokens": args.max_tokens, "samplers": SAMPLED, "constraint": CONSTRAINT}),
        }  # fmt: skip
        best = {(key, s): 0.0 for key in contenders for s in STREAMS}
        forced, produced, lengths = 0, 0, []
        for _ in range(args.repeats):
            for streams in STREAMS:
                for key, (mode, request) in contenders.items():
                    if key.endswith("sampled") and streams == 1:
                        continue
                    results = stack.concurrent(mode, streams, **request)
                    best[key, streams] = max(best[key, streams], rate(results))
                    if key.startswith("json"):
                        for r in results:
                            assert r["done"].finish_reason == "stop", r["done"]
                            forced += r["done"].forced_tokens
                            produced += r["done"].completion_tokens
                            lengths.append(r["done"].completion_tokens)
    finally:
        stack.close()
    eos = config.get("eos_token_id", [])
    costs = engine_costs(folder, replay, config["vocab_size"], eos if isinstance(eos, list) else [eos])
    return {
        "model": name,
        "vocab_size": config["vocab_size"],
        "greedy_json_tokens": tokens,
        "mean_json_tokens": float(np.mean(lengths)),
        "tokens_per_s": {f"{key}@{s}": value for (key, s), value in best.items() if value},
        "forced_share": forced / produced,
        # One stream alone: its tokens and the lm decode steps they took (the first token comes from the prefill).
        "alone_tokens": len(alone["ids"]),
        "alone_decode_steps": steps_alone,
        **costs,
    }


def markdown(results: list[dict]) -> str:
    lines = [
        "| model | streams | unconstrained tok/s | JSON Schema tok/s | ratio | mask in gateway tok/s |"
        " lm / gateway mask |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        t = r["tokens_per_s"]
        for s in STREAMS:
            free, constrained, in_gateway = t[f"free@{s}"], t[f"json@{s}"], t[f"json_mask_in_gateway@{s}"]
            lines.append(
                f"| {r['model']} | {s} | {free:.1f} | {constrained:.1f} | {constrained / free:.2f}x | "
                f"{in_gateway:.1f} | {constrained / in_gateway:.2f}x |"
            )
    lines += [
        "",
        "| model | sampled, 8 streams: unconstrained tok/s | JSON Schema tok/s | ratio |",
        "|---|---:|---:|---:|",
    ]
    for r in results:
        t = r["tokens_per_s"]
        free, constrained = t["free_sampled@8"], t["json_sampled@8"]
        lines.append(f"| {r['model']} | {free:.1f} | {constrained:.1f} | {constrained / free:.2f}x |")
    lines += [
        "",
        "| model | vocab | compile ms | mask ms p50 | mask ms p95 | advance ms p50 | JSON tokens (greedy) |"
        " forced (all runs) | lm steps for one stream alone |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        lines.append(
            f"| {r['model']} | {r['vocab_size']} | {r['compile_ms']:.2f} | {r['mask_ms_p50']:.3f} | "
            f"{r['mask_ms_p95']:.3f} | {r['advance_ms_p50']:.3f} | {r['greedy_json_tokens']} | "
            f"{100 * r['forced_share']:.0f}% | {r['alone_decode_steps']} for {r['alone_tokens']} tokens |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--models", nargs="+", default=["gpt2-124m", "tiny-text-fixture"], choices=["gpt2-124m", "tiny-text-fixture"]
    )
    parser.add_argument("--max-tokens", type=int, default=400, help="cap of a constrained completion")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=0, help="onnxruntime intra-op threads (0: its default)")
    parser.add_argument("--json", type=Path, default=None, help="also write the raw figures here")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="muestra-bench-structured-") as work:
        results = [bench_model(name, args, Path(work)) for name in args.models]
    print(markdown(results))
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()

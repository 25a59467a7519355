"""Speculative decoding on the default model: tokens/s with and without drafts, in one run, and llama.cpp's
llama-lookup on the same GGUF file and prompts beside it.

    .venv/bin/python bench/speculative.py [--tokens 128] [--rounds 4] [--json out.json]
    .venv/bin/python bench/speculative.py --draft-model [--streams 1]   # draft_model instead of ngram

Prompts: input-grounded ones (summarise a given passage, extract fields as JSON, rewrite a given code
snippet, answer from a given context; the passages are CPython's own documentation and sources, so nothing
is downloaded) and open-ended chat. Each runs greedy and sampled (temperature 0.7, the model card's top-p
0.9), at 1 stream (one request after another) and at 8 streams (8 at once), with the gateway's ngram
proposer ("ngram") and without ("off"). The machine's drift should hit both alike: at 1 stream each prompt
runs in both modes back to back, and each mode goes first in every other round.
Every speculative output is compared with its twin (same prompt, seed and sampler chain, no drafts).

Figures: decode tokens/s (completion tokens after the first, over the time after the first token; prefill is
the same work either way), the ratio ngram/off, the drafts' acceptance rate and tokens per lm step of the
drafting rows. llama.cpp: llama-lookup (its prompt-lookup example: n-gram drafts of up to 8 tokens, greedy
and temperature 0.7) and llama-bench's plain decode (tg) on models/smollm2-135m-instruct/source/*.gguf, the
file muestra's model was imported from. llama.cpp is built by bench/llama_cpp.py (cached).

--draft-model: the target is the same GGUF file imported with its weights dequantized to float32 (built once,
cached under ${MUESTRA_CACHE_DIR:-~/.cache/muestra}/bench/), served as "smollm2-f32"; the default model (its
4-bit blocks as stored) drafts for it with the draft_model proposer, on an lm of its own. The modes are then
"off" and "draft_model", and llama.cpp is not run (its file is the 4-bit one).
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# The repository first, and not bench/ itself (its tokenize.py would shadow the standard library's).
sys.path[:] = [str(ROOT), *(p for p in sys.path if Path(p or ".").resolve() != ROOT / "bench")]

import argparse  # noqa: E402
import inspect  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import platform  # noqa: E402
import pydoc_data.topics  # noqa: E402
import re  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
import textwrap  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402

import grpc  # noqa: E402

from muestra.cli.launch import ServiceProcess  # noqa: E402
from muestra.client.types import build_request  # noqa: E402
from muestra.v1 import gateway_pb2_grpc  # noqa: E402

MODEL = ROOT / "models" / "smollm2-135m-instruct"
CACHE = Path(os.environ.get("MUESTRA_CACHE_DIR", Path.home() / ".cache" / "muestra")) / "bench"
TARGET_F32 = "smollm2-f32"
PROPOSER = {"proposer": "ngram"}
DRAFT_MODEL = {"proposer": "draft_model", "params": {"model": "smollm2"}}
SAMPLED = {"temperature": 0.7, "top_p": 0.9}


def _topic(name: str, chars: int = 1400) -> str:
    text = textwrap.dedent(pydoc_data.topics.topics[name]).strip()
    return text[:chars].rsplit("\n", 1)[0]


def grounded_prompts() -> dict[str, str]:
    """Tasks whose answers quote what they are given."""
    code = inspect.getsource(textwrap.indent)
    return {
        "summarise": f"Summarise the following passage in a few sentences.\n\n{_topic('while')}",
        "extract_json": (
            'Extract from the passage below, as a JSON object, the fields "statement" (its name), "keywords" '
            '(a list of the keywords it uses) and "first_sentence" (copied exactly).\n\n' + _topic("for")
        ),
        "rewrite_code": (
            "Rewrite this Python function with type hints on its parameters and return value. Change nothing "
            f"else and give the whole function.\n\n```python\n{code}```"
        ),
        "answer_from_context": (
            f"Context:\n{_topic('assert')}\n\nUsing only the context above, and quoting it, answer: what does an "
            "assert statement do when __debug__ is false?"
        ),
    }


def chat_prompts() -> dict[str, str]:
    return {
        "story": "Write a short story about a lighthouse keeper who finds a message in a bottle.",
        "advice": "What are some good ways to spend a rainy afternoon at home? Give a few ideas and explain each.",
        "explain": "Explain to a child why the sky is blue.",
        "letter": "Write a friendly letter inviting a neighbour to a garden party next Saturday.",
    }


def prompt_sets() -> dict[str, list[str]]:
    """The bench's texts per set, as the model's chat template gives them to Generate."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(MODEL)
    return {
        "grounded": [chat_text(tokenizer, p) for p in grounded_prompts().values()],
        "chat": [chat_text(tokenizer, p) for p in chat_prompts().values()],
    }


def chat_text(tokenizer, prompt: str) -> str:
    """The prompt as the model's chat template renders one user turn (the text both engines get)."""
    return tokenizer.apply_chat_template(
        [{"role": "user", "content": prompt}], tokenize=False, add_generation_prompt=True
    )


class Stack:
    """tokenizer, lm and gateway over the default model; with `target`, a second lm serves that folder as the
    model requests go to ("smollm2-f32"), and the default model ("smollm2") can draft for it."""

    def __init__(self, log_dir: Path, threads: int, target: Path | None = None) -> None:
        quiet = ["--log-level", "WARNING"]
        self.tokenizer = ServiceProcess("tokenizer", ["--models", str(MODEL), *quiet], log_dir)
        lm = ["--providers", "cpu", "--intra-op-threads", str(threads), *quiet]
        if target is not None:  # two lm processes take turns on the cores: no thread spins while the other works
            lm += ["--intra-op-spinning", "false"]
        self.lms = [ServiceProcess("lm", ["--model", str(MODEL), *lm], log_dir)]
        self.model = ""
        if target is None:
            gateway = ["--tokenizer-addr", self.tokenizer.address, "--lm-addr", self.lms[0].address]
        else:
            self.lms.append(ServiceProcess("lm", ["--model", str(target), *lm], log_dir))
            self.model = TARGET_F32
            models = {
                "smollm2": {"tokenizer": self.tokenizer.address, "lm": [self.lms[0].address]},
                TARGET_F32: {"tokenizer": self.tokenizer.address, "lm": [self.lms[1].address]},
            }
            config = log_dir / "models.json"
            config.write_text(json.dumps({"text": models}))
            gateway = ["--models-config", str(config)]
        self.gateway = ServiceProcess("gateway", [*gateway, "--http-port", "-1", *quiet], log_dir)
        self.channel = grpc.insecure_channel(self.gateway.address)
        self.stub = gateway_pb2_grpc.GatewayStub(self.channel)

    def generate(self, text: str, tokens: int, seed: int, sampled: bool, speculation) -> dict:
        sampling = SAMPLED if sampled else {"samplers": [{"name": "greedy"}]}
        request = build_request(
            text, None, model=self.model, max_tokens=tokens, seed=seed, speculation=speculation, **sampling
        )
        request.disable_prefix_cache = True  # both twins prefill the whole prompt
        ids, done = [], None
        for message in self.stub.Generate(request, timeout=600):
            if message.HasField("done"):
                done = message.done
            else:
                ids.extend(message.delta.token_ids)
        first = done.timings.ttft_ms / 1000
        decode_s = done.timings.total_ms / 1000 - first
        return {
            "ids": ids,
            "tokens": len(ids),
            "decode_s": decode_s,
            "total_s": done.timings.total_ms / 1000,
            "drafted": done.usage.draft_tokens,
            "accepted": done.usage.accepted_draft_tokens,
        }

    def close(self) -> None:
        self.channel.close()
        for service in (self.gateway, *self.lms, self.tokenizer):
            service.stop()


def f32_target() -> Path:
    """The default model's GGUF file imported with its weights dequantized to float32 (built once, cached)."""
    out = CACHE / TARGET_F32
    if not (out / "model.onnx").is_file():
        (gguf,) = (MODEL / "source").glob("*.gguf")
        out.parent.mkdir(parents=True, exist_ok=True)
        partial = Path(tempfile.mkdtemp(prefix=f"{TARGET_F32}-", dir=out.parent)) / "export"
        command = [sys.executable, "-m", "muestra.lm.export", "--dequantize", "--dtype", "float32", str(gguf)]
        subprocess.run([*command, str(partial)], check=True)
        partial.rename(out)
    return out


def run_round(stack: Stack, texts: list[str], streams: int, tokens: int, sampled: bool, modes: dict) -> dict:
    """One round of every mode (name -> speculation) over the texts, the modes in the given order; per mode,
    decode tokens/s over the set.

    1 stream: each text runs in every mode back to back (one request after another), so that the machine's
    drift hits the modes alike. `streams` > 1: the texts (repeated with other seeds to fill the streams) all
    at once, one mode after the other; the rate is then all tokens over the wall time, prefill included (the
    same work in every mode)."""
    jobs = [(texts[i % len(texts)], 100 + i) for i in range(max(streams, len(texts)))]
    results: dict[str, list] = {name: [None] * len(jobs) for name in modes}
    walls: dict[str, float] = {}
    if streams == 1:
        for i, (text, seed) in enumerate(jobs):
            for name, speculation in modes.items():
                results[name][i] = stack.generate(text, tokens, seed, sampled, speculation)
    else:
        for name, speculation in modes.items():

            def work(i: int, name=name, speculation=speculation) -> None:
                text, seed = jobs[i]
                results[name][i] = stack.generate(text, tokens, seed, sampled, speculation)

            started = time.perf_counter()
            threads = [threading.Thread(target=work, args=(i,)) for i in range(len(jobs))]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            walls[name] = time.perf_counter() - started
    out = {}
    for name, runs in results.items():
        if streams == 1:
            rate = sum(r["tokens"] - 1 for r in runs) / sum(r["decode_s"] for r in runs)
        else:
            rate = sum(r["tokens"] for r in runs) / walls[name]
        out[name] = {
            "tokens_per_s": rate,
            "ids": [r["ids"] for r in runs],
            "drafted": sum(r["drafted"] for r in runs),
            "accepted": sum(r["accepted"] for r in runs),
            "tokens": sum(r["tokens"] for r in runs),
        }
    return out


def llama_lookup(binaries: Path, gguf: Path, text: str, tokens: int, sampled: bool, threads: int) -> dict:
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
        f.write(text)
    command = [
        str(binaries / "llama-lookup"), "-m", str(gguf), "-f", f.name, "-n", str(tokens), "-t", str(threads),
        "--spec-draft-n-max", "8", "--seed", "100",
        *(["--temp", "0.7", "--top-p", "0.9"] if sampled else ["--temp", "0"]),
    ]  # fmt: skip
    out = subprocess.run(command, capture_output=True, text=True, timeout=900)
    os.unlink(f.name)
    log = out.stdout + out.stderr
    decoded = re.search(r"decoded\s+(\d+) tokens in\s+([\d.]+) seconds", log)
    drafted = re.search(r"n_drafted\s+=\s+(\d+)", log)
    accepted = re.search(r"n_accept\s+=\s+(\d+)", log)
    if decoded is None:
        raise RuntimeError(f"llama-lookup failed: {log[-2000:]}")
    return {
        "tokens": int(decoded.group(1)),
        "seconds": float(decoded.group(2)),
        "drafted": int(drafted.group(1)) if drafted else 0,
        "accepted": int(accepted.group(1)) if accepted else 0,
    }


def llama_cpp_figures(texts: dict[str, list[str]], tokens: int, threads: int) -> dict:
    from bench import llama_cpp

    binaries = llama_cpp.build()
    lookup = binaries / "llama-lookup"
    if not lookup.is_file():
        source = llama_cpp.source_dir()
        subprocess.run(["cmake", "--build", str(source / "build"), "--target", "llama-lookup"], check=True)
    (gguf,) = (MODEL / "source").glob("*.gguf")
    figures: dict = {"gguf": gguf.name}
    for kind, prompts in texts.items():
        for sampled in (False, True):
            runs = [llama_lookup(binaries, gguf, text, tokens, sampled, threads) for text in prompts]
            key = f"{kind}/{'sampled' if sampled else 'greedy'}"
            figures[key] = {
                "tokens_per_s": sum(r["tokens"] for r in runs) / sum(r["seconds"] for r in runs),
                "acceptance": sum(r["accepted"] for r in runs) / max(1, sum(r["drafted"] for r in runs)),
            }
    bench_rows = llama_cpp.llama_bench(binaries, gguf, threads, (0,), generate=tokens)
    figures["llama-bench tg"] = bench_rows[0]["tokens_per_s"] if bench_rows else None
    return figures


def cpu_name() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return platform.machine()
    name = next((line.split(":", 1)[1].strip() for line in out.splitlines() if line.startswith("Model name")), "")
    flags = next((line for line in out.splitlines() if line.startswith("Flags")), "")
    isa = "AVX-512 VNNI" if "avx512_vnni" in flags else "AVX2" if "avx2" in flags else ""
    return f"{name}, {os.cpu_count()} cores, {isa}".strip(", ")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=128, help="max tokens per completion")
    parser.add_argument("--rounds", type=int, default=4, help="rounds of off and ngram, each first in every other")
    parser.add_argument("--streams", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--threads", type=int, default=0, help="onnxruntime and llama.cpp threads (0: all cores)")
    parser.add_argument("--no-llama-cpp", action="store_true")
    parser.add_argument(
        "--draft-model", action="store_true", help="the default model drafts for its float32 import (draft_model)"
    )
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    sets = prompt_sets()
    threads = args.threads or os.cpu_count() or 1
    log_dir = Path(tempfile.mkdtemp(prefix="bench-speculative-"))
    mode, proposer = ("draft_model", DRAFT_MODEL) if args.draft_model else ("ngram", PROPOSER)
    stack = Stack(log_dir, args.threads, f32_target() if args.draft_model else None)
    rows = []
    try:
        # A warm-up, not measured: the first requests of a fresh stack are slower in either mode.
        run_round(stack, sets["grounded"], 1, 32, False, {"off": "off", mode: proposer})
        for streams in args.streams:
            for kind, texts in sets.items():
                for sampled in (False, True):
                    rates: dict[str, list[float]] = {"off": [], mode: []}
                    outputs: dict[str, list] = {}
                    drafted = accepted = tokens = 0
                    for index in range(args.rounds):
                        # Each mode goes first in every other round: neither gains from the order.
                        modes = {"off": "off", mode: proposer}
                        order = list(modes) if index % 2 == 0 else list(modes)[::-1]
                        results = run_round(
                            stack, texts, streams, args.tokens, sampled, {name: modes[name] for name in order}
                        )
                        for name, result in results.items():
                            rates[name].append(result["tokens_per_s"])
                            # Rounds repeat the seeds: outputs are compared per round, in the same job order.
                            outputs.setdefault(name, []).extend(result["ids"])
                            if name == mode:
                                drafted += result["drafted"]
                                accepted += result["accepted"]
                                tokens += result["tokens"]
                    off, on = statistics.median(rates["off"]), statistics.median(rates[mode])
                    # Every drafted output against its twin (rounds repeat the seeds, so each round must match).
                    identical = sum(a == b for a, b in zip(outputs["off"], outputs[mode], strict=True))
                    row = {
                        "set": kind,
                        "mode": "sampled" if sampled else "greedy",
                        "streams": streams,
                        "off_tokens_per_s": off,
                        "proposer": mode,
                        f"{mode}_tokens_per_s": on,
                        "ratio": on / off,
                        "rounds_off": rates["off"],
                        f"rounds_{mode}": rates[mode],
                        "acceptance": accepted / drafted if drafted else 0.0,
                        "drafted_per_token": drafted / tokens if tokens else 0.0,
                        "identical": f"{identical}/{len(outputs['off'])}",
                    }
                    rows.append(row)
                    print(
                        f"{kind:9} {row['mode']:8} {streams} stream(s): off {off:6.1f} tok/s, {mode} {on:6.1f} tok/s, "
                        f"{row['ratio']:.2f}x; acceptance {row['acceptance']:.0%}; identical {row['identical']}",
                        flush=True,
                    )
    finally:
        stack.close()
    report = {"machine": cpu_name(), "tokens": args.tokens, "rows": rows}
    if not args.no_llama_cpp and not args.draft_model:
        report["llama_cpp"] = llama_cpp_figures(sets, args.tokens, threads)
        for key, value in report["llama_cpp"].items():
            print(f"llama.cpp {key}: {value}", flush=True)
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()

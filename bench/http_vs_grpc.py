"""Streaming through the gateway's OpenAI-compatible HTTP API against its gRPC Generate, in one run.

    .venv/bin/python bench/http_vs_grpc.py                         # llama-tiny and gpt2-124m
    .venv/bin/python bench/http_vs_grpc.py --models llama-tiny --repeats 5

One gateway (with tokenizer and lm processes) per model serves both APIs. The same greedy request
(fixed prompt, `--max-tokens` tokens, EOS ignored) goes, in turn, through gRPC Generate (the baseline,
a plain stub), HTTP SSE read by a bare http.client loop (what the server costs), and HTTP SSE through
the official openai client (what a user sees). Time to first token is from sending the request to the
first chunk with text; tokens/s is (tokens - 1) over the time from that chunk to the completion's end.
Each way runs `--repeats` times, the ways interleaved (each round starts with the next way); a figure
is the way's best run (lowest TTFT, highest tokens/s: the CPUs are shared, so the best run is the best
estimate of an unloaded machine).
Then `--concurrency` streams at once per way, best of `--rounds` interleaved rounds, give the aggregate
tokens/s and the median TTFT of the streams. Ratios are HTTP / gRPC from the same run.

Models come from bench/decode_models.py (random weights, cached under ~/.cache/muestra/bench). Their
tokenizer is replaced by a word-level one covering the whole vocabulary, so every id streams as text.
"""

from __future__ import annotations

import sys
from pathlib import Path

# Run as a script, bench/ would come first on sys.path, where a module may shadow the standard library's.
ROOT = Path(__file__).resolve().parents[1]
sys.path[:] = [str(ROOT), *(p for p in sys.path if Path(p or ".").resolve() != ROOT / "bench")]

import argparse  # noqa: E402
import http.client  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
import tempfile  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402

import grpc  # noqa: E402

from bench import decode_models  # noqa: E402
from muestra.cli.launch import ServiceProcess, free_port  # noqa: E402
from muestra.v1 import gateway_pb2, gateway_pb2_grpc  # noqa: E402

WAYS = {
    "grpc": "gRPC Generate, stub (baseline)",
    "http": "HTTP SSE, http.client reader",
    "openai": "HTTP SSE, openai client",
}
PROMPT = " ".join(f"w{i}" for i in range(10, 26))  # 16 words, 16 tokens


def word_tokenizer(vocab_size: int, out: Path) -> Path:
    """A word-level tokenizer with a word for every id (w0 ... w{vocab-1}), EOS = the model's."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    tokenizer = Tokenizer(models.WordLevel(vocab={f"w{i}": i for i in range(vocab_size)}, unk_token="w0"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.decoder = decoders.WordPiece(prefix="##", cleanup=False)  # joins words with spaces
    out.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "PreTrainedTokenizerFast"}))
    return out


class Stack:
    def __init__(self, name: str, threads: int, log_dir: Path) -> None:
        hf_dir, onnx_dir = decode_models.build(name)
        vocab = json.loads((hf_dir / "config.json").read_text())["vocab_size"]
        tokenizer_dir = word_tokenizer(vocab, log_dir / f"{name}-tokenizer")
        quiet = ["--log-level", "WARNING"]
        self.processes = []
        tokenizer = self._start("tokenizer", ["--models", str(tokenizer_dir), *quiet], log_dir)
        lm = self._start(
            "lm", ["--model", str(onnx_dir), "--providers", "cpu", "--intra-op-threads", str(threads), *quiet], log_dir
        )
        self.http_port = free_port()
        flags = ["--tokenizer-addr", tokenizer.address, "--lm-addr", lm.address, "--http-port", str(self.http_port)]
        gateway = self._start("gateway", [*flags, *quiet], log_dir)
        self.channel = grpc.insecure_channel(gateway.address)
        self.stub = gateway_pb2_grpc.GatewayStub(self.channel)
        self._openai = None

    def openai_client(self):
        """One client for the run (it pools connections and is safe to share between threads)."""
        if self._openai is None:
            import openai

            self._openai = openai.OpenAI(base_url=f"http://127.0.0.1:{self.http_port}/v1", api_key="none")
        return self._openai

    def _start(self, name: str, args: list[str], log_dir: Path) -> ServiceProcess:
        process = ServiceProcess(name, args, log_dir)
        self.processes.append(process)
        return process

    def close(self) -> None:
        self.channel.close()
        for process in reversed(self.processes):
            process.stop()


def run_grpc(stack: Stack, max_tokens: int) -> tuple[float, float, str]:
    """(seconds to first text, tokens/s after it, text) of one greedy stream over gRPC."""
    request = gateway_pb2.GenerateRequest(
        prompt=PROMPT, max_tokens=max_tokens, ignore_eos=True, samplers=[gateway_pb2.SamplerSpec(name="greedy")]
    )
    started = time.perf_counter()
    first = None
    texts = []
    for message in stack.stub.Generate(request):
        if message.HasField("delta") and message.delta.text:
            first = first or time.perf_counter()
            texts.append(message.delta.text)
        elif message.HasField("done"):
            tokens = message.done.usage.completion_tokens
    end = time.perf_counter()
    return first - started, (tokens - 1) / (end - first), "".join(texts)


def _body(max_tokens: int) -> dict:
    return {
        "model": "",
        "prompt": PROMPT,
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
        "ignore_eos": True,
    }


def run_http(stack: Stack, max_tokens: int) -> tuple[float, float, str]:
    connection = http.client.HTTPConnection("127.0.0.1", stack.http_port, timeout=600)
    started = time.perf_counter()
    connection.request(
        "POST", "/v1/completions", body=json.dumps(_body(max_tokens)), headers={"Content-Type": "application/json"}
    )
    response = connection.getresponse()
    first = None
    texts = []
    for line in response:
        if not line.startswith(b"data: ") or line.startswith(b"data: [DONE]"):
            continue
        chunk = json.loads(line[6:])
        if chunk["choices"] and chunk["choices"][0]["text"]:
            first = first or time.perf_counter()
            texts.append(chunk["choices"][0]["text"])
        elif chunk.get("usage"):
            tokens = chunk["usage"]["completion_tokens"]
            end = time.perf_counter()
    connection.close()
    return first - started, (tokens - 1) / (end - first), "".join(texts)


def run_openai(stack: Stack, max_tokens: int) -> tuple[float, float, str]:
    client = stack.openai_client()
    body = _body(max_tokens)
    extra = {"ignore_eos": body.pop("ignore_eos")}
    started = time.perf_counter()
    first = None
    texts = []
    for chunk in client.completions.create(**body, extra_body=extra):
        if chunk.choices and chunk.choices[0].text:
            first = first or time.perf_counter()
            texts.append(chunk.choices[0].text)
        elif chunk.usage is not None:
            tokens = chunk.usage.completion_tokens
            end = time.perf_counter()
    return first - started, (tokens - 1) / (end - first), "".join(texts)


RUNNERS = {"grpc": run_grpc, "http": run_http, "openai": run_openai}


def concurrent(way: str, stack: Stack, streams: int, max_tokens: int) -> tuple[float, float]:
    """(aggregate tokens/s, median time to first token) with `streams` streams at once."""
    results: list = [None] * streams

    def one(i: int) -> None:
        results[i] = RUNNERS[way](stack, max_tokens)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(streams)]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    wall = time.perf_counter() - started
    return streams * max_tokens / wall, statistics.median(r[0] for r in results)


def bench_model(name: str, args, log_dir: Path) -> dict:
    stack = Stack(name, args.threads, log_dir)
    try:
        texts = {way: run(stack, args.max_tokens)[2] for way, run in RUNNERS.items()}  # also warms up
        same = len(set(texts.values())) == 1
        samples: dict[str, list] = {way: [] for way in WAYS}
        order = list(WAYS)
        for i in range(args.repeats):  # each round starts with another way: no way always follows the same one
            for way in order[i % len(order) :] + order[: i % len(order)]:
                samples[way].append(RUNNERS[way](stack, args.max_tokens))
        result = {"model": name, "parameters": decode_models.parameters(name), "same_text": same, "single": {}}
        for way, runs in samples.items():
            result["single"][way] = {
                "ttft_ms": min(r[0] for r in runs) * 1000,
                "tokens_per_s": max(r[1] for r in runs),
            }
        rounds: dict[str, list] = {way: [] for way in WAYS}
        for i in range(args.rounds):
            for way in order[i % len(order) :] + order[: i % len(order)]:
                rounds[way].append(concurrent(way, stack, args.concurrency, args.max_tokens))
        result["concurrent"] = {
            way: {"tokens_per_s": max(r[0] for r in runs), "ttft_ms": min(r[1] for r in runs) * 1000}
            for way, runs in rounds.items()
        }
        return result
    finally:
        stack.close()


def markdown(results: list[dict], args) -> str:
    lines = [
        f"{args.max_tokens} greedy tokens after a 16-token prompt; best of {args.repeats} runs per way "
        f"(single stream) and of {args.rounds} rounds ({args.concurrency} streams); "
        f"lm with {args.threads} intra-op thread(s).",
        "",
        "| model | way | TTFT (ms) | TTFT vs gRPC | tokens/s | tokens/s vs gRPC | "
        f"{args.concurrency} streams: tokens/s | vs gRPC | {args.concurrency} streams: TTFT (ms) |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        base, base_c = r["single"]["grpc"], r["concurrent"]["grpc"]
        label = f"{r['model']} ({r['parameters'] / 1e6:.1f}M)"
        for way, title in WAYS.items():
            one, many = r["single"][way], r["concurrent"][way]
            lines.append(
                f"| {label} | {title} | {one['ttft_ms']:.1f} | {one['ttft_ms'] / base['ttft_ms']:.2f} | "
                f"{one['tokens_per_s']:.0f} | {one['tokens_per_s'] / base['tokens_per_s']:.2f} | "
                f"{many['tokens_per_s']:.0f} | {many['tokens_per_s'] / base_c['tokens_per_s']:.2f} | "
                f"{many['ttft_ms']:.1f} |"
            )
        if not r["same_text"]:
            lines.append(f"| {label} | (the three ways gave different texts!) | | | | | | | |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="llama-tiny,gpt2-124m")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3, help="rounds of concurrent streams per way")
    parser.add_argument("--threads", type=int, default=1, help="lm intra-op threads")
    parser.add_argument("--json", action="store_true", help="print the raw results as JSON too")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="muestra-http-bench-") as tmp:
        results = [bench_model(name, args, Path(tmp)) for name in args.models.split(",")]
    if args.json:
        print(json.dumps(results, indent=1))
    print(markdown(results, args))


if __name__ == "__main__":
    main()

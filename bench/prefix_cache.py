"""The prompt-prefix KV cache: time to first token on a hit, and what the cache costs at a 0% hit rate.

    .venv/bin/python bench/prefix_cache.py                   # gpt2-124m, 7 TTFT rounds, 3 throughput rounds
    .venv/bin/python bench/prefix_cache.py --rounds 3 --throughput-rounds 2

Real processes on loopback: a redis-server (maxmemory + allkeys-lru), a tokenizer, and two lm + gateway
pairs over the same model, one with --redis-url and one with the in-process cache. Prompts are a shared
prefix (GPT-2's context is 1,024 tokens, so 960 = 30 blocks of 32 by default) plus a 32-token suffix.

- TTFT, client-side, greedy with max_tokens 1, per round and in a rotating order: cold with the cache
  off (the baseline), a miss with the cache on (a new prefix; its blocks are then written), a hit from
  Redis, and a hit from the in-process cache (the shared prefix with a new suffix).
- Throughput at a 0% hit rate: batches of distinct prompts (4 in flight) with the cache off, on with the
  defaults (--prefix-cache-min-sightings 2: a one-off prompt is not stored), and on with
  --prefix-cache-min-sightings 1 (every prompt's blocks stored on first sight; timed to the last response,
  and also until its blocks are all in Redis), rotating. Off and the default share one lm + gateway pair
  (the request's disable_prefix_cache switches); first-sight storage is a third pair.

The TTFT pairs store on first sight (--prefix-cache-min-sightings 1), so that a miss can be followed by
its writes; how a hit is served does not depend on when its blocks were stored.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:] = [str(ROOT), *(p for p in sys.path if Path(p or ".").resolve() != ROOT / "bench")]

import argparse  # noqa: E402
import itertools  # noqa: E402
import statistics  # noqa: E402
import tempfile  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402

import grpc  # noqa: E402
import numpy as np  # noqa: E402
import redis  # noqa: E402

from bench import decode_models  # noqa: E402
from muestra.cli.launch import RedisServer, ServiceProcess  # noqa: E402
from muestra.runtime.prefix_hash import block_hashes  # noqa: E402
from muestra.v1 import gateway_pb2, gateway_pb2_grpc, lm_pb2, lm_pb2_grpc  # noqa: E402

BLOCK = 32
KEY_PREFIX = "muestra:bench:"
_counter = itertools.count()


def words(count: int, seed: int) -> list[str]:
    """Words the bench tokenizer encodes as one id each (w3 … w4095)."""
    return [f"w{i}" for i in np.random.default_rng(seed).integers(3, 4096, count)]


class Stack:
    """An lm service and a gateway in front of it (sharing the bench's tokenizer)."""

    def __init__(
        self, onnx_dir: Path, tokenizer: str, log_dir: Path, threads: int, redis_url: str = "", lm_flags=()
    ) -> None:
        quiet = ["--log-level", "WARNING"]
        cache = ["--prefix-cache-key-prefix", KEY_PREFIX] + (["--redis-url", redis_url] if redis_url else [])
        lm_args = ["--model", str(onnx_dir), "--providers", "cpu", "--intra-op-threads", str(threads)]
        self.lm = ServiceProcess("lm", [*lm_args, *cache, *lm_flags, *quiet], log_dir)
        with grpc.insecure_channel(self.lm.address) as channel:
            describe = lm_pb2_grpc.LanguageModelStub(channel).Describe(lm_pb2.DescribeModelRequest())
        self.fingerprint, self.context = describe.fingerprint, describe.context_length
        gateway_args = ["--tokenizer-addr", tokenizer, "--lm-addr", self.lm.address, "--http-port", "-1"]
        block = ["--prefix-cache-block-size", str(BLOCK)]
        self.gateway = ServiceProcess("gateway", [*gateway_args, *cache, *block, *quiet], log_dir)
        self.channel = grpc.insecure_channel(self.gateway.address)
        self.stub = gateway_pb2_grpc.GatewayStub(self.channel)

    def first_token(self, prompt: list[str], max_tokens: int = 1, **fields) -> tuple[float, int]:
        """Seconds to the first streamed token, and Usage.cached_tokens."""
        request = gateway_pb2.GenerateRequest(prompt=" ".join(prompt), max_tokens=max_tokens, ignore_eos=True, **fields)
        request.samplers.append(gateway_pb2.SamplerSpec(name="greedy"))
        started = time.perf_counter()
        first, cached = None, -1
        for message in self.stub.Generate(request, timeout=600):
            if first is None and message.HasField("delta") and message.delta.token_ids:
                first = time.perf_counter() - started
            if message.HasField("done"):
                cached = message.done.usage.cached_tokens
                assert not message.done.error, message.done.error
        return first, cached

    def close(self) -> None:
        self.channel.close()
        self.gateway.stop()
        self.lm.stop()


def wait_stored(client: redis.Redis, fingerprint: str, prompts: list[list[str]], timeout_s: float = 120) -> None:
    """Block until every full block of these prompts is in Redis (the lm writes after responding)."""
    keys = []
    for prompt in prompts:
        ids = [int(w[1:]) for w in prompt]
        keys += [KEY_PREFIX + h.hex() for h in block_hashes(fingerprint, ids, BLOCK)]
    deadline = time.monotonic() + timeout_s
    while client.exists(*keys) != len(keys):
        if time.monotonic() > deadline:
            raise TimeoutError("blocks not stored")
        time.sleep(0.01)


def bench_ttft(redis_stack: Stack, memory_stack: Stack, client: redis.Redis, args) -> dict[str, list[float]]:
    shared = words(args.prefix_tokens, seed=1)
    # Store the shared prefix in both caches, then check that it hits.
    for stack in (redis_stack, memory_stack):
        stack.first_token(shared + words(args.suffix_tokens, seed=2))
    wait_stored(client, redis_stack.fingerprint, [shared + words(args.suffix_tokens, seed=2)])
    time.sleep(1.0)
    for stack in (redis_stack, memory_stack):
        _, cached = stack.first_token(shared + words(args.suffix_tokens, seed=3))
        assert cached == args.prefix_tokens, cached

    def fresh() -> list[str]:
        return words(args.prefix_tokens + args.suffix_tokens, seed=1000 + next(_counter))

    def suffixed() -> list[str]:
        return shared + words(args.suffix_tokens, seed=1000 + next(_counter))

    def cold() -> tuple[float, int]:
        return redis_stack.first_token(fresh(), disable_prefix_cache=True)

    def miss() -> tuple[float, int]:
        prompt = fresh()
        result = redis_stack.first_token(prompt)
        wait_stored(client, redis_stack.fingerprint, [prompt])  # its writes are not the next one's cost
        return result

    ways = {
        "cold, cache off (baseline)": (cold, 0),
        "miss, cache on (Redis)": (miss, 0),
        "hit from Redis": (lambda: redis_stack.first_token(suffixed()), args.prefix_tokens),
        "hit from the in-process cache": (lambda: memory_stack.first_token(suffixed()), args.prefix_tokens),
    }
    times: dict[str, list[float]] = {name: [] for name in ways}
    names = list(ways)
    for r in range(args.rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            run, expected = ways[name]
            seconds, cached = run()
            assert cached == expected, (name, cached)
            times[name].append(seconds)
        time.sleep(0.2)
    return times


def bench_breakdown(stack: Stack, args) -> dict[str, list[float]]:
    """Where a Redis hit's time goes inside the lm: its Prefill call, the forward pass, and the rest."""
    shared = [int(w[1:]) for w in words(args.prefix_tokens, seed=1)]
    hashes = block_hashes(stack.fingerprint, [*shared, 0], BLOCK)
    times: dict[str, list[float]] = {"Prefill call (lm)": [], "forward (32-token suffix)": [], "rest": []}
    with grpc.insecure_channel(stack.lm.address) as channel:
        lm = lm_pb2_grpc.LanguageModelStub(channel)
        for _ in range(args.rounds):
            ids = shared + [int(w[1:]) for w in words(args.suffix_tokens, seed=1000 + next(_counter))]
            prefix = lm_pb2.PrefixBlocks(block_size=BLOCK, block_hashes=hashes, cached_blocks=len(hashes), write=False)
            row = lm_pb2.PrefillRow(input_ids=ids, output=lm_pb2.OutputSpec(kind=lm_pb2.ARGMAX), prefix=prefix)
            started = time.perf_counter()
            reply = lm.Prefill(lm_pb2.PrefillRequest(rows=[row]))
            call = time.perf_counter() - started
            lm.Clear(lm_pb2.ClearRequest(batch_ids=[reply.batch_id]))
            assert reply.output.rows[0].cached_tokens == len(hashes) * BLOCK
            times["Prefill call (lm)"].append(call)
            times["forward (32-token suffix)"].append(reply.timing.forward_us / 1e6)
            times["rest"].append(call - reply.timing.forward_us / 1e6)
    return times


def bench_throughput(stack: Stack, eager: Stack, client: redis.Redis, args) -> dict[str, list[float]]:
    """Seconds per batch of distinct prompts (to the last response, and with first-sight storage also until
    its blocks are stored): cache off, on with the defaults (nothing stored), and on storing on first sight."""
    total = args.prefix_tokens + args.suffix_tokens

    def batch(target: Stack, on: bool, stored: bool) -> tuple[float, float]:
        prompts = [words(total, seed=10**6 + next(_counter)) for _ in range(args.batch)]
        pending = iter(prompts)
        lock = threading.Lock()

        def worker() -> None:
            while True:
                with lock:
                    prompt = next(pending, None)
                if prompt is None:
                    return
                _, cached = target.first_token(prompt, max_tokens=args.tokens, disable_prefix_cache=not on)
                assert cached == 0

        started = time.perf_counter()
        threads = [threading.Thread(target=worker) for _ in range(args.in_flight)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        answered = time.perf_counter() - started
        if stored:
            wait_stored(client, target.fingerprint, prompts)
        return answered, time.perf_counter() - started

    ways = {
        "cache off": (stack, False, False),
        "cache on (defaults: min sightings 2), 0% hits": (stack, True, False),
        "cache on, min sightings 1 (store on first sight), 0% hits": (eager, True, True),
    }
    until_stored = "cache on, min sightings 1, 0% hits, timed until its blocks are stored"
    seconds: dict[str, list[float]] = {name: [] for name in [*ways, until_stored]}
    names = list(ways)
    for r in range(args.throughput_rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            answered, done = batch(*ways[name])
            seconds[name].append(answered)
            if ways[name][2]:
                seconds[until_stored].append(done)
            time.sleep(0.5)
    return seconds


def markdown(model: str, ttft: dict, breakdown: dict, throughput: dict, args) -> str:
    base = statistics.median(ttft["cold, cache off (baseline)"])
    lines = [
        f"TTFT, {model}, {args.prefix_tokens}-token shared prefix + {args.suffix_tokens}-token suffix "
        f"(medians of {args.rounds} interleaved rounds):",
        "",
        "| way | TTFT p50 (ms) | min (ms) | ratio to cold |",
        "|---|---:|---:|---:|",
    ]
    for name, values in ttft.items():
        median = statistics.median(values)
        lines.append(f"| {name} | {median * 1e3:.0f} | {min(values) * 1e3:.0f} | {median / base:.2f} |")
    lines += [
        "",
        "Inside the lm, a hit's Prefill call (lm Timing; the rest is reading, checking and joining the blocks):",
        "",
        "| part | p50 (ms) |",
        "|---|---:|",
    ]
    lines += [f"| {name} | {statistics.median(values) * 1e3:.0f} |" for name, values in breakdown.items()]
    tokens = args.batch * (args.prefix_tokens + args.suffix_tokens + args.tokens)
    off = sum(throughput["cache off"])
    lines += [
        "",
        f"Throughput at a 0% hit rate: {args.throughput_rounds} rounds of {args.batch} distinct prompts "
        f"({args.in_flight} in flight, {args.tokens} tokens generated each), the ways in a rotating order:",
        "",
        "| way | seconds per batch (each round) | tokens/s (prompt + generated) | ratio to cache off |",
        "|---|---|---:|---:|",
    ]
    for name, values in throughput.items():
        rate = tokens * len(values) / sum(values)
        each = ", ".join(f"{v:.2f}" for v in values)
        lines.append(f"| {name} | {each} | {rate:.0f} | {off / sum(values):.3f} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="gpt2-124m", choices=decode_models.MODELS)
    parser.add_argument("--prefix-tokens", type=int, default=0, help="0: 1,024, or less to fit the context")
    parser.add_argument("--suffix-tokens", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=7, help="TTFT rounds")
    parser.add_argument("--throughput-rounds", type=int, default=3)
    parser.add_argument("--batch", type=int, default=8, help="distinct prompts per throughput batch")
    parser.add_argument("--in-flight", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=16, help="tokens generated per throughput request")
    parser.add_argument("--threads", type=int, default=0, help="onnxruntime intra-op threads (0: its default)")
    args = parser.parse_args()
    _, onnx_dir = decode_models.build(args.model)
    with tempfile.TemporaryDirectory(prefix="muestra-bench-prefix-") as tmp:
        tmp = Path(tmp)
        server = RedisServer(tmp, ("--maxmemory", "4gb", "--maxmemory-policy", "allkeys-lru"))
        client = redis.Redis.from_url(server.url)
        tokenizer = ServiceProcess("tokenizer", ["--models", str(onnx_dir), "--log-level", "WARNING"], tmp)
        stacks = []
        first_sight = ("--prefix-cache-min-sightings", "1")
        try:
            stacks.append(Stack(onnx_dir, tokenizer.address, tmp, args.threads, server.url, first_sight))
            stacks.append(Stack(onnx_dir, tokenizer.address, tmp, args.threads, "", first_sight))
            room = stacks[0].context - args.suffix_tokens - args.tokens - 1
            args.prefix_tokens = args.prefix_tokens or min(1024, room // BLOCK * BLOCK)
            ttft = bench_ttft(stacks[0], stacks[1], client, args)
            breakdown = {
                f"{name} ({cache})": values
                for cache, stack in (("Redis", stacks[0]), ("in-process", stacks[1]))
                for name, values in bench_breakdown(stack, args).items()
            }
            for stack in stacks:  # the throughput pairs are fresh, so no sightings carry over
                stack.close()
            stacks = [Stack(onnx_dir, tokenizer.address, tmp, args.threads, server.url)]
            stacks.append(Stack(onnx_dir, tokenizer.address, tmp, args.threads, server.url, first_sight))
            throughput = bench_throughput(stacks[0], stacks[1], client, args)
        finally:
            for stack in stacks:
                stack.close()
            tokenizer.stop()
            client.close()
            server.stop()
    print(markdown(args.model, ttft, breakdown, throughput, args))


if __name__ == "__main__":
    main()

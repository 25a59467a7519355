"""Seeded replays: do seeded requests give the same tokens under load as alone?

    .venv/bin/python -m bench.replays                       # 200 sampled + 50 greedy under 32 streams
    .venv/bin/python -m bench.replays --requests 40 --concurrency 8 --max-tokens 24
    .venv/bin/python -m bench.replays --speculation ngram   # every request drafts with ngram

Starts the stack on loopback (bench.stack, the default text model unless `--text-model`), sends
`--requests` seeded sampled requests (distinct prompts and seeds, half at temperature 1.0 and half with
the model's own chain, `--max-tokens` each, EOS ignored) and `--greedy` greedy ones, `--concurrency` at
a time, then replays every one of them alone, one after another. Prints how many replays differ, where
the first differing token was, and the same for the greedy control, and for each one that differs its
seed, the first differing token and how many prompt tokens each run took from the prefix cache; `--json`
writes the report. `--no-prefix-cache` sends every request with disable_prefix_cache (a control: the
prefix cache leaves at least two prompt tokens to run so that a hit gives a whole prefill's bits,
docs/architecture.md, "Determinism under load").
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:] = [str(ROOT), *(p for p in sys.path if Path(p or ".").resolve() != ROOT / "bench")]

import argparse  # noqa: E402
import asyncio  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
import tempfile  # noqa: E402

import grpc  # noqa: E402

from bench.stack import DEFAULT_TEXT_MODEL, LocalStack  # noqa: E402
from muestra.v1 import gateway_pb2, gateway_pb2_grpc  # noqa: E402

WORDS = "el cielo es azul y la noche cae sobre la ciudad mientras los gatos duermen".split()


def request(
    i: int, max_tokens: int, greedy: bool, prefix_cache: bool = True, speculation: str = ""
) -> gateway_pb2.GenerateRequest:
    """Request i: greedy, or sampled at temperature 1.0 (even i) or with the model's own chain (odd i: no samplers
    given); with `speculation`, it names that proposer."""
    prompt = " ".join(WORDS[(i + k) % len(WORDS)] for k in range(3 + i % 17))
    chain = [gateway_pb2.SamplerSpec(name="greedy")] if greedy else []
    message = gateway_pb2.GenerateRequest(
        prompt=prompt, max_tokens=max_tokens, ignore_eos=True, seed=1000 + i, samplers=chain,
        disable_prefix_cache=not prefix_cache,
    )  # fmt: skip
    if not greedy and i % 2 == 0:
        message.samplers.add(name="temperature").params.update({"temperature": 1.0})
        message.samplers.add(name="sample")
    if speculation:
        message.speculation.proposer = speculation
    return message


class Tokens(list):
    """A request's token ids, and how many of its prompt tokens came from the prefix cache."""

    cached_tokens = 0


async def tokens(stub, message: gateway_pb2.GenerateRequest) -> Tokens:
    ids = Tokens()
    async for reply in stub.Generate(message, timeout=600):
        if reply.HasField("delta"):
            ids.extend(reply.delta.token_ids)
        else:
            ids.cached_tokens = reply.done.usage.cached_tokens
    return ids


def first_difference(a: list[int], b: list[int]) -> int | None:
    for k, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return k
    return None if len(a) == len(b) else min(len(a), len(b))


async def run(address: str, messages: list[tuple[str, gateway_pb2.GenerateRequest]], concurrency: int) -> dict:
    async with grpc.aio.insecure_channel(address) as channel:
        stub = gateway_pb2_grpc.GatewayStub(channel)
        gate = asyncio.Semaphore(concurrency)

        async def under_load(message):
            async with gate:
                return await tokens(stub, message)

        loaded = await asyncio.gather(*(under_load(m) for _, m in messages))
        alone = [await tokens(stub, m) for _, m in messages]
    report: dict = {}
    for kind in ("sampled", "greedy"):
        pairs = [(a, b) for (k, _), a, b in zip(messages, loaded, alone, strict=True) if k == kind]
        firsts = [d for a, b in pairs if (d := first_difference(a, b)) is not None]
        report[kind] = {
            "requests": len(pairs),
            "different": len(firsts),
            "first_difference_median": statistics.median(firsts) if firsts else None,
            # Which ones: their seeds, the first differing token, and the two continuations from there.
            "differing": [
                {
                    "seed": m.seed,
                    "at": d,
                    "under_load": a[d : d + 4],
                    "alone": b[d : d + 4],
                    "cached_tokens": [a.cached_tokens, b.cached_tokens],
                }
                for (k, m), a, b in zip(messages, loaded, alone, strict=True)
                if k == kind and (d := first_difference(a, b)) is not None
            ],
        }
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=200, help="seeded sampled requests")
    parser.add_argument("--greedy", type=int, default=50, help="greedy requests (the control)")
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--json", default=None, help="also write the report here")
    parser.add_argument("--log-dir", default=None, help="keep the services' logs here (default: a temporary folder)")
    parser.add_argument(
        "--no-prefix-cache", action="store_true", help="send every request with disable_prefix_cache (a control)"
    )
    parser.add_argument("--text-model", type=Path, default=DEFAULT_TEXT_MODEL, help="the text model folder")
    parser.add_argument("--speculation", default="", help="a draft proposer every request names (e.g. ngram)")
    args = parser.parse_args()
    cache, spec = not args.no_prefix_cache, args.speculation
    messages = [("sampled", request(i, args.max_tokens, False, cache, spec)) for i in range(args.requests)]
    messages += [("greedy", request(args.requests + i, args.max_tokens, True, cache, spec)) for i in range(args.greedy)]
    with tempfile.TemporaryDirectory(prefix="muestra-replays-") as logs:
        stack = LocalStack(Path(args.log_dir or logs), text_model=args.text_model, image_model=None)
        try:
            report = asyncio.run(run(stack.gateway.address, messages, args.concurrency))
        finally:
            stack.close()
    report.update(
        concurrency=args.concurrency, max_tokens=args.max_tokens, text_model=args.text_model.name, speculation=spec
    )
    for kind in ("sampled", "greedy"):
        r = report[kind]
        where = f", first differing token at {r['first_difference_median']} (median)" if r["different"] else ""
        print(f"{kind}: {r['different']} of {r['requests']} replays alone differ from the run under load{where}")
        for d in r["differing"]:
            print(
                f"  seed {d['seed']}: token {d['at']}, under load {d['under_load']}, alone {d['alone']};"
                f" prompt tokens from the prefix cache: {d['cached_tokens'][0]} under load,"
                f" {d['cached_tokens'][1]} alone"
            )
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()

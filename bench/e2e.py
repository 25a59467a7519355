"""Streamed decode end to end, muestra against llama-server, on the same GGUF file and machine (issue 44).

    .venv/bin/python bench/e2e.py [--rounds 3] [--streams 1 8] [--tokens 200] [--out e2e.json]

muestra runs as `muestra up` runs it (bench.conversations.start_muestra: redis-server, tokenizer, one lm with
--intra-op-threads THREADS, gateway, with their defaults) on models/smollm2-135m-instruct; llama-server (built
by bench/llama_cpp.py) serves models/smollm2-135m-instruct/source/*.gguf with -t THREADS -np STREAMS --jinja,
started again for each number of streams. Every request goes through the official `openai` client,
`chat.completions.create(stream=True)`, with max_tokens TOKENS and ignore_eos (and with `--seeded`, a seed of its
own): every stream must come back with exactly TOKENS completion tokens (usage.completion_tokens), or the bench
stops.

Three sampling configurations:
    greedy  temperature 0 on both.
    model   the model's own chain: nothing sent to muestra (its generation_config.json decides:
            temperature 0.2, top_k 50, top_p 0.9; checked against the model card's default_samplers),
            the same three values sent to llama-server.
    t0.7    temperature 0.7, top_k 40, top_p 0.9 on both.
llama-server also gets min_p 0 when it samples: its default min_p 0.05 would be a step muestra's chain lacks.
The two apply the steps in their own orders (transformers': temperature, top_k, top_p; llama.cpp's: top_k,
top_p, temperature), so the texts differ; the work per token is the same.

A round is STREAMS requests at once on one server; its tokens/s are all their completion tokens over the
round's wall time. The servers alternate round by round (each goes first in every other round); the best
round of --rounds counts, and TTFT is the median over every stream of every round. The machine may be shared:
a round in which other processes took more than --max-foreign-share of the cores (bench.conversations.CpuMeter)
is run again, up to --retries times; the JSON keeps the discarded ones.

The JSON names the checkout the bench ran from ("checkout", "+changes" when its tracked files differ from HEAD)
and the muestra.lm and muestra.gateway the stack ran: to measure a pinned commit while the working tree changes,
extract it (git archive) and put its distributions' folders (cli, proto, services/*, plugins/*) on PYTHONPATH;
the stack's processes inherit it.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# The repository first, and not bench/ itself (its tokenize.py would shadow the standard library's).
sys.path[:] = [str(ROOT), *(p for p in sys.path if Path(p or ".").resolve() != ROOT / "bench")]

import argparse  # noqa: E402
import asyncio  # noqa: E402
import importlib.util  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
import urllib.request  # noqa: E402

from bench import llama_cpp  # noqa: E402
from bench.conversations import MODEL, CpuMeter, Server, gather_all, serve_llama, start_muestra  # noqa: E402
from bench.speculative import cpu_name  # noqa: E402
from muestra.cli.launch import Process  # noqa: E402

# generation_config.json gives temperature and top_p; top_k 50 is transformers' default, which it keeps.
MODEL_CHAIN = {"temperature": 0.2, "top_k": 50, "top_p": 0.9}
CONFIGS = {
    "greedy": {"temperature": 0.0},
    "model": MODEL_CHAIN,
    "t0.7": {"temperature": 0.7, "top_k": 40, "top_p": 0.9},
}
SLOT_CONTEXT = 1024  # llama-server's tokens per slot: a short prompt and TOKENS
STORIES = [
    "a lighthouse keeper", "the history of the bicycle", "a guide to tea", "a journey across the desert",
    "a city under the sea", "the first winter on Mars", "a clockmaker's apprentice", "a long train ride",
]  # fmt: skip
TARGETS = {  # issue 44's bars: each figure must be at least its value
    "model chain / greedy, muestra, 1 stream": 0.95,
    "greedy muestra / llama-server, 1 stream": 0.9,
    "muestra / llama-server, 8 streams, every configuration": 1.3,
}


# -- what each request sends ----------------------------------------------------------------------------


def sampling_fields(config: str, server: str) -> dict:
    """The sampling fields one request of `config` sends to `server` ("muestra" or "llama")."""
    if config == "model" and server == "muestra":
        return {}  # the model's generation_config.json decides
    fields = dict(CONFIGS[config])
    if server == "llama" and fields["temperature"] > 0:
        fields["min_p"] = 0.0
    return fields


def chain_values(specs: list[dict]) -> dict:
    """The temperature, top_k and top_p of a sampler chain as the model card lists it ([{name, params}])."""
    values = {}
    for spec in specs:
        values.update({key: value for key, value in spec.get("params", {}).items() if key in MODEL_CHAIN})
    return values


def messages(tag: str, stream: int) -> list[dict]:
    return [
        {"role": "system", "content": f"Session {tag}-{stream}. You are a storyteller."},
        {"role": "user", "content": f"Write a long story about {STORIES[stream % len(STORIES)]}."},
    ]


# -- one round ------------------------------------------------------------------------------------------


async def stream_story(server: Server, messages: list[dict], fields: dict, seed: int | None, tokens: int) -> dict:
    """One streamed chat completion of `tokens` tokens (ignore_eos): when it was sent and ended, its TTFT,
    its usage's completion tokens and how many content chunks carried them."""
    native = {key: fields[key] for key in ("temperature", "top_p") if key in fields}
    extra = {key: value for key, value in fields.items() if key not in native}
    if seed is not None:
        native["seed"] = seed
    sent = time.perf_counter()
    stream = await server.client.chat.completions.create(
        model=server.model, messages=messages, max_tokens=tokens, stream=True,
        stream_options={"include_usage": True}, extra_body={**extra, "ignore_eos": True}, **native,
    )  # fmt: skip
    first, usage, chunks, finish = None, None, 0, None
    try:
        async for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                first = first or time.perf_counter()
                chunks += 1
            if chunk.choices and chunk.choices[0].finish_reason:
                finish = chunk.choices[0].finish_reason
            usage = chunk.usage or usage
    finally:
        await stream.close()
    return {
        "sent": sent,
        "ended": time.perf_counter(),
        "ttft_s": None if first is None else first - sent,
        "completion_tokens": None if usage is None else usage.completion_tokens,
        "content_chunks": chunks,
        "finish_reason": finish,
    }


def check_streams(replies: list[dict], tokens: int, where: str) -> None:
    """Every stream got exactly `tokens` completion tokens, or a RuntimeError that says which did not."""
    wrong = [
        f"stream {i}: {r['completion_tokens']} tokens in {r['content_chunks']} chunks, finish {r['finish_reason']}"
        for i, r in enumerate(replies)
        if r["completion_tokens"] != tokens or r["ttft_s"] is None
    ]
    if wrong:
        raise RuntimeError(f"{where}: asked for {tokens} tokens each; " + "; ".join(wrong))


async def one_round(server: Server, config: str, streams: int, tag: str, args) -> dict:
    """`streams` requests of `config` at once on `server`: tokens/s over the round, each stream's TTFT."""
    fields = sampling_fields(config, server.name)
    meter = CpuMeter(server.pids)
    started = time.perf_counter()
    tasks = [
        asyncio.ensure_future(
            stream_story(server, messages(tag, i), fields, args.seed + i if args.seeded else None, args.tokens)
        )
        for i in range(streams)
    ]
    replies = await gather_all(tasks)
    seconds = time.perf_counter() - started
    check_streams(replies, args.tokens, f"{server.name} {config} x{streams} ({tag})")
    tokens = sum(r["completion_tokens"] for r in replies)
    return {
        "tokens_per_s": tokens / seconds,
        "seconds": seconds,
        "completion_tokens": tokens,
        "content_chunks": sum(r["content_chunks"] for r in replies),
        "ttft_s": [r["ttft_s"] for r in replies],
        "cpu": meter.read(),
    }


async def run_streams(servers: list[Server], streams: int, args) -> tuple[dict, list[dict]]:
    """Every configuration's rounds at one number of streams: ({config: {server: [round, ...]}}, the rounds run
    again because other processes took more than args.max_foreign_share of the cores)."""
    results: dict = {}
    discarded: list[dict] = []
    for server in servers:
        await server.open()
    try:
        for server in servers:  # warm-up, not measured
            await one_round(server, "greedy", streams, f"warm-{streams}", args)
        for config in CONFIGS:
            results[config] = {server.name: [] for server in servers}
            for round_ in range(args.rounds):
                for server in servers if round_ % 2 == 0 else servers[::-1]:
                    for attempt in range(args.retries + 1):
                        tag = f"{args.seed}-{config}-{streams}-{round_}-{attempt}"
                        result = await one_round(server, config, streams, tag, args)
                        share = result["cpu"]["foreign_share"]
                        print(
                            f"  x{streams} {config:6} round {round_} {server.name:7} {result['tokens_per_s']:6.1f} "
                            f"tokens/s, TTFT median {statistics.median(result['ttft_s']) * 1000:6.1f} ms; "
                            f"other processes took {share:.0%} of the cores",
                            flush=True,
                        )
                        await asyncio.sleep(1)  # let the last stream's work drain before the next round
                        if share <= args.max_foreign_share or attempt == args.retries:
                            results[config][server.name].append(result)
                            break
                        discarded.append({"config": config, "server": server.name, "round": round_, **result})
    finally:
        for server in servers:
            await server.close()
    return results, discarded


# -- the servers ----------------------------------------------------------------------------------------


def start_llama(log_dir: Path, slots: int, threads: int) -> tuple[Process, Server]:
    """llama-server with `slots` slots on the GGUF file muestra's model was imported from, once /health is 200."""
    return serve_llama(log_dir, f"np{slots}", threads, slots, slots * SLOT_CONTEXT, {})


def default_samplers(base_url: str) -> list[dict]:
    """The chain muestra gives a request that names none: its model card's default_samplers."""
    with urllib.request.urlopen(f"{base_url}/models", timeout=10) as reply:
        (card,) = json.load(reply)["data"]
    return card["default_samplers"]


# -- the report -----------------------------------------------------------------------------------------


def summarize(results: dict) -> list[dict]:
    """Per number of streams and configuration: each server's best tokens/s and median TTFT, their ratio, and
    each server's tokens/s over its own greedy figure at that number of streams."""
    rows = []
    for streams, configs in results.items():
        best = {c: {s: max(r["tokens_per_s"] for r in rounds) for s, rounds in by.items()} for c, by in configs.items()}
        for config, by_server in configs.items():
            row = {"streams": int(streams), "config": config}
            for server, rounds in by_server.items():
                row[f"{server}_tokens_per_s"] = round(best[config][server], 1)
                row[f"{server}_ttft_ms"] = round(statistics.median(t for r in rounds for t in r["ttft_s"]) * 1000, 1)
                row[f"{server}_over_greedy"] = round(best[config][server] / best["greedy"][server], 3)
            if "muestra" in by_server and "llama" in by_server:
                row["ratio"] = round(best[config]["muestra"] / best[config]["llama"], 3)
            rows.append(row)
    return rows


def targets(rows: list[dict]) -> list[dict]:
    """Issue 44's bars, each with the figure this run gave and whether it is met (absent figures are left out)."""
    checks = []
    one = {row["config"]: row for row in rows if row["streams"] == 1}
    if "model" in one and "greedy" in one:
        checks.append(("model chain / greedy, muestra, 1 stream", one["model"]["muestra_over_greedy"]))
    if "ratio" in one.get("greedy", {}):
        checks.append(("greedy muestra / llama-server, 1 stream", one["greedy"]["ratio"]))
    eight = [row["ratio"] for row in rows if row["streams"] == 8 and "ratio" in row]
    if eight:
        checks.append(("muestra / llama-server, 8 streams, every configuration", min(eight)))
    return [{"target": t, "value": v, "at_least": TARGETS[t], "met": v >= TARGETS[t]} for t, v in checks]


def markdown_table(rows: list[dict]) -> str:
    def cell(row: dict, key: str, digits: int = 1) -> str:
        return f"{row[key]:,.{digits}f}" if key in row else ""

    lines = [
        "| streams | configuration | muestra tokens/s | llama-server tokens/s | ratio | muestra TTFT ms "
        "| llama-server TTFT ms | muestra / its greedy |",
        "|---:|---|---:|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        cells = [
            str(row["streams"]), row["config"], cell(row, "muestra_tokens_per_s"), cell(row, "llama_tokens_per_s"),
            cell(row, "ratio", 2), cell(row, "muestra_ttft_ms"), cell(row, "llama_ttft_ms"),
            cell(row, "muestra_over_greedy", 2),
        ]  # fmt: skip
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def checkout() -> str:
    """HEAD's short hash, with "+changes" if the working tree differs from it."""
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    changed = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT, capture_output=True)
    return head.stdout.strip() + ("+changes" if changed.stdout.strip() else "")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3, help="rounds per configuration; the best one counts")
    parser.add_argument("--streams", type=int, nargs="+", default=[1, 8], help="concurrent streams per round")
    parser.add_argument("--tokens", type=int, default=200, help="completion tokens per stream (ignore_eos)")
    parser.add_argument("--threads", type=int, default=2, help="llama-server -t and the lm's --intra-op-threads")
    parser.add_argument("--seed", type=int, default=0, help="with --seeded, stream i of a round has seed SEED + i")
    parser.add_argument(
        "--seeded",
        action="store_true",
        help="send every stream a seed (muestra then runs a lone sampled stream row-invariant, ~1.7x its step; "
        "docs/architecture.md, 'Determinism under load'); by default none is sent, as most chats send none",
    )
    parser.add_argument("--max-foreign-share", type=float, default=0.25, help="run a round again above it")
    parser.add_argument("--retries", type=int, default=2, help="most times one round is run again")
    parser.add_argument(
        "--model",
        type=Path,
        default=MODEL,
        help="the folder muestra serves (default: the default model); llama-server always serves the default's "
        "GGUF file, so another export of that file (e.g. --accuracy-level 4) is compared on the same weights",
    )
    parser.add_argument("--out", type=Path, default=None, help="write every figure here (JSON)")
    args = parser.parse_args()
    log_dir = Path(tempfile.mkdtemp(prefix="bench-e2e-"))
    print(f"logs in {log_dir}", flush=True)
    llama_cpp.server_binary()  # built before anything starts (minutes, once)
    report: dict = {
        "machine": cpu_name(),
        "checkout": checkout(),
        # The code the stack runs (PYTHONPATH may put a pinned checkout before the editable install).
        "muestra_lm": importlib.util.find_spec("muestra.lm").origin,
        "muestra_gateway": importlib.util.find_spec("muestra.gateway").origin,
        "llama.cpp": llama_cpp.SDIST,
        "model": args.model.name,
        **{
            key: getattr(args, key)
            for key in ("rounds", "tokens", "threads", "seed", "seeded", "max_foreign_share", "retries")
        },
        "results": {},
        "discarded": {},
    }
    started = time.monotonic()
    stack, muestra = start_muestra(log_dir, args.threads, model=args.model)
    try:
        report["muestra_default_samplers"] = default_samplers(stack.base_url)
        if chain_values(report["muestra_default_samplers"]) != MODEL_CHAIN:
            raise RuntimeError(f"muestra's default chain is not {MODEL_CHAIN}: {report['muestra_default_samplers']}")
        for streams in args.streams:
            llama, server = start_llama(log_dir, streams, args.threads)
            try:
                results, discarded = asyncio.run(run_streams([muestra, server], streams, args))
                report["results"][streams], report["discarded"][streams] = results, discarded
            finally:
                llama.stop()
    finally:
        stack.close()
    report["seconds"] = round(time.monotonic() - started, 1)
    report["summary"] = summarize(report["results"])
    report["targets"] = targets(report["summary"])
    print(f"\n{report['machine']}; {report['llama.cpp']}; checkout {report['checkout']}; {report['seconds']} s\n")
    print(markdown_table(report["summary"]))
    for check in report["targets"]:
        verdict = "met" if check["met"] else "NOT met"
        print(f"  {check['target']}: {check['value']:.2f} (at least {check['at_least']}): {verdict}")
    if args.out:
        args.out.write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()

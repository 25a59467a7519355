"""Many sampled streams at once through the OpenAI API on the default model: what a sampled row costs against a
greedy one, and against another checkout (issue 44).

    .venv/bin/python bench/sampled_load.py [--streams 8 32] [--configs greedy model] [--rounds 2]
    .venv/bin/python bench/sampled_load.py --baseline /tmp/base     # a worktree of the commit before a change

A round is STREAMS streamed chat completions at once through the official `openai` client, TOKENS tokens each with
ignore_eos, on a stack as `muestra up` starts it (redis-server, tokenizer, one lm with --intra-op-threads THREADS,
gateway) over models/smollm2-135m-instruct. **greedy**: temperature 0; **model**: nothing sent (the model's own
chain: temperature 0.2, top_k 50, top_p 0.9); **t0.7**: temperature 0.7, top_p 0.9. Each row of the report is the
best round's tokens/s, the lm's mean forward time a step and rows a Decode over that round (its /metrics), and the
CPU seconds each process took in it (/proc): where a sampled row's work lands.

With --baseline CHECKOUT, a second stack runs that checkout's distributions (its folders first on PYTHONPATH), and
the two alternate round by round (each goes first in every other round).
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# The repository first, and not bench/ itself (its tokenize.py would shadow the standard library's).
sys.path[:] = [str(ROOT), *(p for p in sys.path if Path(p or ".").resolve() != ROOT / "bench")]

import argparse  # noqa: E402
import asyncio  # noqa: E402
import contextlib  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import resource  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
import urllib.request  # noqa: E402

import openai  # noqa: E402

from bench.e2e import checkout  # noqa: E402
from bench.speculative import cpu_name  # noqa: E402
from bench.stack import DEFAULT_TEXT_MODEL, LocalStack  # noqa: E402

CONFIGS = {"greedy": {"temperature": 0}, "model": {}, "t0.7": {"temperature": 0.7, "top_p": 0.9}}
PROMPT = "Tell me a long story about a dragon and the village it guarded."
# The distributions' folders a checkout's stack imports first (cli, proto, services, plugins).
FOLDERS = ("cli", "proto", "services/runtime", "services/tokenizer", "services/lm", "services/gateway", "plugins/api")
FOLDERS += ("plugins/mirostat", "plugins/choice")
# Lines of the lm's and the gateway's /metrics a round reads (sums and counts).
METRICS = ("muestra_lm_decode_step_seconds_", "muestra_lm_decode_batch_rows_", "muestra_lm_sampled_tokens_total")


class Contender:
    """One stack, with what a round needs to measure it."""

    def __init__(self, name: str, log_dir: Path, threads: int, checkout_dir: Path | None) -> None:
        self.name = name
        saved = os.environ.get("PYTHONPATH")
        if checkout_dir is not None:  # the stack's processes inherit it
            os.environ["PYTHONPATH"] = ":".join(str(checkout_dir.resolve() / f) for f in FOLDERS)
        try:
            self.stack = LocalStack(
                log_dir / name, text_model=DEFAULT_TEXT_MODEL, image_model=None,
                lm_args=("--intra-op-threads", str(threads)), metrics=True,
            )  # fmt: skip
        finally:
            if saved is None:
                os.environ.pop("PYTHONPATH", None)
            else:
                os.environ["PYTHONPATH"] = saved
        self.pids = {p.name: p.pid for p in self.stack.processes()}
        self.client = openai.AsyncOpenAI(base_url=self.stack.base_url, api_key="unused", max_retries=0)

    def cpu(self) -> dict[str, float]:
        """CPU seconds each of the stack's processes has taken."""
        out = {}
        for name, pid in self.pids.items():
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            out[name] = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        return out

    def metrics(self) -> dict[str, float]:
        text = ""
        for process in (self.stack.lm[0], self.stack.gateway):
            request = urllib.request.Request(
                process.metrics_url, headers={"Authorization": f"Bearer {self.stack.internal_token}"}
            )
            text += urllib.request.urlopen(request, timeout=10).read().decode()
        values: dict[str, float] = {}
        for line in text.splitlines():
            if (
                line.startswith(METRICS)
                and not line.startswith("#")
                and ("_sum" in line or "_count" in line or "_total" in line)
            ):
                name, value = line.split(" ")[:2]
                values[name] = values.get(name, 0.0) + float(value)
        return values

    async def stream(self, config: str, tokens: int) -> int:
        fields = dict(CONFIGS[config])
        stream = await self.client.chat.completions.create(
            model=DEFAULT_TEXT_MODEL.name, messages=[{"role": "user", "content": PROMPT}], max_tokens=tokens,
            stream=True, stream_options={"include_usage": True}, extra_body={"ignore_eos": True}, **fields,
        )  # fmt: skip
        got = 0
        async for chunk in stream:
            if chunk.usage:
                got = chunk.usage.completion_tokens
        if got != tokens:
            raise RuntimeError(f"{self.name}: a stream returned {got} tokens, not {tokens}")
        return got

    async def round(self, config: str, streams: int, tokens: int) -> dict:
        cpu, metrics = self.cpu(), self.metrics()
        own = resource.getrusage(resource.RUSAGE_SELF)
        started = time.monotonic()
        total = sum(await asyncio.gather(*(self.stream(config, tokens) for _ in range(streams))))
        wall = time.monotonic() - started
        after, moved = self.metrics(), resource.getrusage(resource.RUSAGE_SELF)
        delta = {key: after[key] - metrics.get(key, 0.0) for key in after}
        steps = max(delta.get("muestra_lm_decode_step_seconds_count", 0.0), 1.0)
        forward_s = delta.get("muestra_lm_decode_step_seconds_sum", 0.0)
        used = {name: round(now - cpu[name], 2) for name, now in self.cpu().items()}
        used["client"] = round(moved.ru_utime + moved.ru_stime - own.ru_utime - own.ru_stime, 2)
        return {
            "tokens_per_s": round(total / wall, 1),
            "wall_s": round(wall, 2),
            "lm_forward_ms_a_step": round(1000 * forward_s / steps, 2),
            "lm_rows_a_decode": round(delta.get("muestra_lm_decode_batch_rows_sum", 0.0) / steps, 2),
            # None where the lm has no such counter (a checkout from before it).
            "lm_picked_tokens": delta.get("muestra_lm_sampled_tokens_total"),
            "cpu_s": used,
        }

    def close(self) -> None:
        with contextlib.suppress(Exception):
            asyncio.run(self.client.close())
        self.stack.close()


async def measure(contenders: list[Contender], args) -> dict:
    results: dict = {}
    for streams in args.streams:
        for config in args.configs:
            key = f"{streams} {config}"
            rounds: dict[str, list] = {c.name: [] for c in contenders}
            for c in contenders:
                await c.stream(config, 8)  # warm: the prompt's prefill and its prefix cache
            for number in range(args.rounds):
                order = contenders if number % 2 == 0 else contenders[::-1]
                for c in order:
                    figure = await c.round(config, streams, args.tokens)
                    rounds[c.name].append(figure)
                    print(f"  x{streams} {config:6} round {number} {c.name:8} {json.dumps(figure)}", flush=True)
            results[key] = {name: max(r, key=lambda f: f["tokens_per_s"]) for name, r in rounds.items()}
    return results


def report(results: dict, names: list[str]) -> str:
    lines = [
        "| streams | sampling | stack | tok/s | lm forward ms a step | rows a Decode | tokens the lm picked | "
        "CPU s: lm / gateway / tokenizer / client |",
        "|---:|---|---|---:|---:|---:|---:|---|",
    ]
    for key, by_name in results.items():
        streams, config = key.split(" ")
        for name in names:
            f = by_name[name]
            cpu = f["cpu_s"]
            cpus = " / ".join(str(cpu.get(p, "")) for p in ("lm0", "gateway", "tokenizer", "client"))
            picked = "n/a" if f["lm_picked_tokens"] is None else f"{f['lm_picked_tokens']:.0f}"
            lines.append(
                f"| {streams} | {config} | {name} | {f['tokens_per_s']} | {f['lm_forward_ms_a_step']} | "
                f"{f['lm_rows_a_decode']} | {picked} | {cpus} |"
            )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--streams", type=int, nargs="+", default=[8, 32], help="concurrent streams per round")
    parser.add_argument("--configs", nargs="+", default=["greedy", "model"], choices=sorted(CONFIGS))
    parser.add_argument("--rounds", type=int, default=2, help="rounds per configuration; the best one counts")
    parser.add_argument("--tokens", type=int, default=200, help="completion tokens per stream (ignore_eos)")
    parser.add_argument("--threads", type=int, default=2, help="the lm's --intra-op-threads")
    parser.add_argument("--baseline", type=Path, default=None, help="another checkout's stack, alternated with ours")
    parser.add_argument("--out", type=Path, default=None, help="write every figure here (JSON)")
    args = parser.parse_args()
    log_dir = Path(tempfile.mkdtemp(prefix="bench-sampled-load-"))
    print(f"logs in {log_dir}", flush=True)
    contenders = [Contender("ours", log_dir, args.threads, None)]
    try:
        if args.baseline is not None:
            contenders.append(Contender("baseline", log_dir, args.threads, args.baseline))
        results = asyncio.run(measure(contenders, args))
    finally:
        for c in contenders:
            c.close()
    names = [c.name for c in contenders]
    print(f"\n{cpu_name()}; checkout {checkout()}" + (f", baseline {args.baseline}" if args.baseline else "") + "\n")
    print(report(results, names))
    if args.out:
        args.out.write_text(json.dumps({"machine": cpu_name(), "checkout": checkout(), "results": results}, indent=1))


if __name__ == "__main__":
    main()

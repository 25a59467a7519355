"""Soak: the whole stack on loopback under a mixed workload for a given time; every response is checked.

    .venv/bin/python -m bench.soak --concurrency 64 --seconds 600        # the issue's run
    .venv/bin/python -m bench.soak --concurrency 32 --seconds 60 --lm-replicas 2
    .venv/bin/python -m bench.soak --text-model models/tiny-text-fixture   # faster; verifies no drafts

It starts redis-server, the tokenizer, the lm replica(s), the diffusion service and the gateway (gRPC and
HTTP) with the default models (text: models/smollm2-135m-instruct), runs bench.workload at the given
concurrency, then checks every gRPC completion's text against the tokenizer's decode of its ids and every
replay against its original.
It prints counts by outcome and by kind, hung streams (no progress for --hang-s), TTFT and inter-token
latency percentiles, each service's RSS at the start, after --rss-after seconds and at the end, and exits
non-zero on any failed, refused, lost, hung or wrong request, or (runs of at least 3 x --rss-after) on an
RSS growth over --max-rss-growth from the first half of the time after --rss-after seconds to the second (a
leak climbs on; memory kept once used levels off), or redis-server past its maxmemory (it fills up to it).
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:] = [str(ROOT), *(p for p in sys.path if Path(p or ".").resolve() != ROOT / "bench")]

import argparse  # noqa: E402
import asyncio  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
import urllib.request  # noqa: E402

from bench.stack import DEFAULT_IMAGE_MODEL, DEFAULT_TEXT_MODEL, REDIS_MAXMEMORY, LocalStack  # noqa: E402
from bench.workload import Workload, check_text, summarize  # noqa: E402

BAD = ("failed", "refused", "lost", "hung")


# The lm's metrics of the KV it holds on purpose: its batches' and its hot tier's.
HELD = ("muestra_lm_kv_cache_bytes", "muestra_lm_hot_tier_bytes")


def held_bytes(process, token: str) -> int:
    """KV an lm process holds on purpose (its batches and hot tier), from its metrics; 0 when it cannot say."""
    if not process.metrics_url or not process.alive():
        return 0
    request = urllib.request.Request(process.metrics_url, headers={"Authorization": f"Bearer {token}"})
    try:
        with urllib.request.urlopen(request, timeout=5) as reply:
            text = reply.read().decode()
    except OSError:
        return 0
    return int(sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(HELD)))


class RssSampler:
    """Each process's RSS at the start, at `mark_s`, at its highest after `mark_s`, and at the end (every second).

    Growth is judged on the highest RSS after the mark, so a peak that the end no longer shows still counts. An
    lm's RSS is judged less the most KV it has held on purpose so far (its batches and its hot tier, which fills
    the KV budget's free room by design, and whose memory the lm keeps once used): what is left is the memory
    nothing explains.
    """

    def __init__(self, stack: LocalStack, mark_s: float) -> None:
        self.stack = stack
        self.mark_s = mark_s
        self.held_peak: dict[str, int] = {}
        self.start = self.sample()
        self.mark: dict[str, int] | None = None
        self.peak: dict[str, int] = {}
        self.end: dict[str, int] = {}
        self.timeline: list[dict[str, int]] = []  # every sample after the mark

    def sample(self) -> dict[str, int]:
        """Each process's RSS; an lm's less the most KV it has held so far."""
        rss = self.stack.rss()
        for lm in self.stack.lm:
            held = held_bytes(lm, self.stack.internal_token)
            self.held_peak[lm.name] = max(self.held_peak.get(lm.name, 0), held)
            rss[lm.name] = max(rss[lm.name] - self.held_peak[lm.name], 0)
        return rss

    async def run(self, started: float) -> None:
        while True:
            await asyncio.sleep(1.0)
            now = await asyncio.to_thread(self.sample)
            if self.mark is None:
                if time.monotonic() - started >= self.mark_s:
                    self.mark = now
                continue
            self._note_peak(now)

    def _note_peak(self, now: dict[str, int]) -> None:
        self.timeline.append(now)
        for name, value in now.items():
            self.peak[name] = max(self.peak.get(name, 0), value)

    def finish(self) -> None:
        self.end = self.sample()
        if self.mark is not None:
            self._note_peak(self.end)

    def growth(self) -> dict[str, float]:
        """Highest RSS after the mark against RSS at the mark (shown, not judged)."""
        base = self.mark or self.start
        top = self.peak if self.mark is not None else self.end
        return {name: top[name] / base[name] - 1 for name in top if base.get(name) and top.get(name)}

    def late_growth(self) -> dict[str, float]:
        """Highest RSS in the second half of the time after the mark against the highest in the first half
        (judged): a leak keeps climbing, while memory a service keeps once used (the lm's freed heap, kept on
        purpose; redis-server filling to its maxmemory) levels off."""
        half = len(self.timeline) // 2
        if half == 0:
            return self.growth()
        early, late = self.timeline[:half], self.timeline[half:]
        growth = {}
        for name in late[-1]:
            first = max(sample.get(name, 0) for sample in early)
            if first:
                growth[name] = max(sample.get(name, 0) for sample in late) / first - 1
        return growth


async def soak(stack: LocalStack, args) -> tuple[dict, RssSampler]:
    workload = Workload(
        stack.gateway.address, stack.base_url, args.concurrency, seed=args.seed, hang_s=args.hang_s,
        images=stack.diffusion is not None,
    )  # fmt: skip
    rss = RssSampler(stack, args.rss_after)
    started = time.monotonic()
    sampler = asyncio.ensure_future(rss.run(started))
    try:
        outcomes = await workload.run(args.seconds)
    finally:
        sampler.cancel()
    rss.finish()
    checked = await check_text(outcomes, stack.tokenizer.address, stack.internal_token)
    report = summarize(outcomes)
    report["texts_checked"] = checked
    report["replay_counts"] = dict(workload.replays)
    report["seconds"] = round(time.monotonic() - started, 1)
    return report, rss


def print_report(report: dict, rss: RssSampler, args) -> None:
    mib = 1024 * 1024
    print(f"\n== soak: {args.concurrency} concurrent streams for {report['seconds']} s")
    print(f"requests: {report['requests']}  by outcome: {report['by_status']}  wrong: {report['wrong']}")
    print(f"texts checked against the tokenizer: {report['texts_checked']}; replays: {report['replay_counts']}")
    print(f"prefix-cache hits (requests with cached tokens): {report['prefix_cache_hits']}")
    spec = report.get("speculation")
    if spec:
        rate = spec["accepted_tokens"] / spec["draft_tokens"] if spec["draft_tokens"] else 0.0
        print(
            f"speculation: {spec['drafts']:.0f} drafts verified, {spec['draft_tokens']:.0f} draft tokens, "
            f"{spec['accepted_tokens']:.0f} accepted ({rate:.0%})"
        )
    ttft, itl = report["ttft_ms"], report["itl_ms"]
    print("TTFT ms p50/p95/p99: " + "/".join(f"{ttft[p]:.0f}" for p in (50, 95, 99)))
    print("inter-token ms p50/p95/p99: " + "/".join(f"{itl[p]:.1f}" for p in (50, 95, 99)))
    print("by kind: " + ", ".join(f"{k} {n}" for k, n in report["by_kind"].items()))
    after = f"{args.rss_after:.0f} s"
    print(
        f"RSS MiB (start / after {after} / highest after {after} / end; growth: highest against after {after}; "
        "late: highest in the second half after it against the first half, judged; "
        "an lm's less the most KV it held on purpose, batches and hot tier):"
    )
    for name, held in rss.held_peak.items():
        print(f"  {name}: the most KV it held on purpose (batches and hot tier): {held / mib:.1f} MiB")
    growth, late = rss.growth(), rss.late_growth()
    for name, start in rss.start.items():
        mark = (rss.mark or {}).get(name, 0)
        print(
            f"  {name:<10} {start / mib:7.1f} / {mark / mib:7.1f} / {rss.peak.get(name, 0) / mib:7.1f}"
            f" / {rss.end.get(name, 0) / mib:7.1f}  {growth.get(name, float('nan')) * 100:+.1f}%"
            f"  late {late.get(name, float('nan')) * 100:+.1f}%"
        )
    for example in report["examples"]:
        print("  !", example)


def verdict(report: dict, rss: RssSampler, args) -> list[str]:
    reasons = [f"{report['by_status'].get(s, 0)} {s}" for s in BAD if report["by_status"].get(s)]
    if report["wrong"]:
        reasons.append(f"{report['wrong']} wrong")
    if args.seconds >= 3 * args.rss_after:
        reasons += [
            f"{name} RSS grew {g * 100:.1f}% from the first half of the run after {args.rss_after:.0f} s to the second"
            for name, g in rss.late_growth().items()
            if g > args.max_rss_growth and name != "redis"
        ]
        # redis-server is a cache that fills to the limit it was given (the blocks of every chat turn go there):
        # at its maxmemory it is not leaking; past it (with the allocator's slack) it is.
        redis_peak = max(rss.peak.get("redis", 0), rss.end.get("redis", 0))
        if redis_peak > REDIS_MAXMEMORY * 1.25:
            reasons.append(
                f"redis RSS reached {redis_peak / 2**20:.0f} MiB, past its maxmemory of {REDIS_MAXMEMORY / 2**20:.0f}"
            )
    return reasons


def speculation_counts(stack: LocalStack) -> dict[str, float]:
    """The gateway's speculative-decoding counters (the gateway drafts by default: its --speculation)."""
    request = urllib.request.Request(
        stack.gateway.metrics_url, headers={"Authorization": f"Bearer {stack.internal_token}"}
    )
    with urllib.request.urlopen(request, timeout=10) as reply:
        text = reply.read().decode()
    counts = {"drafts": 0.0, "draft_tokens": 0.0, "accepted_tokens": 0.0}
    for line in text.splitlines():
        for key in counts:
            if line.startswith(f"muestra_spec_decode_num_{key}_total{{"):
                counts[key] += float(line.rsplit(" ", 1)[1])
    return counts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--seconds", type=float, default=600)
    parser.add_argument("--lm-replicas", type=int, default=1)
    parser.add_argument("--no-images", action="store_true", help="no diffusion service, no image requests")
    parser.add_argument("--hang-s", type=float, default=30.0, help="a stream with no progress this long is hung")
    parser.add_argument("--rss-after", type=float, default=60.0)
    parser.add_argument("--max-rss-growth", type=float, default=0.10)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--log-dir", default=None)
    parser.add_argument("--json", default=None, help="also write the report here")
    parser.add_argument(
        "--speculation", default="ngram", help="the gateway's default draft proposer (--speculation; off: none)"
    )
    parser.add_argument("--speculation-params", default="", help="its params, a JSON object (--speculation-params)")
    parser.add_argument(
        "--text-model",
        type=Path,
        default=DEFAULT_TEXT_MODEL,
        help="the text model folder (default: the default model, models/smollm2-135m-instruct; the tests' fixture, "
        "models/tiny-text-fixture, is faster but quantizes activations to int8 and so verifies no drafts)",
    )
    args = parser.parse_args()
    os.environ["MUESTRA_GATEWAY_SPECULATION"] = args.speculation  # the stack's processes inherit it
    os.environ["MUESTRA_GATEWAY_SPECULATION_PARAMS"] = args.speculation_params
    log_dir = Path(args.log_dir or tempfile.mkdtemp(prefix="muestra-soak-"))
    print(f"logs in {log_dir}", flush=True)
    image_model = None if args.no_images else DEFAULT_IMAGE_MODEL
    stack = LocalStack(
        log_dir, lm_replicas=args.lm_replicas, text_model=args.text_model, image_model=image_model, metrics=True
    )
    try:
        report, rss = asyncio.run(soak(stack, args))
        report["speculation"] = speculation_counts(stack)
    finally:
        stack.close()
    print_report(report, rss, args)
    reasons = verdict(report, rss, args)
    if args.json:
        out = {
            **report,
            "rss_start": rss.start,
            "rss_mark": rss.mark,
            "rss_peak": rss.peak,
            "rss_end": rss.end,
            "rss_growth": rss.growth(),
            "rss_late_growth": rss.late_growth(),
            "failures": reasons,
        }
        Path(args.json).write_text(json.dumps(out, indent=2))
    if reasons:
        print("FAIL: " + ", ".join(reasons))
        sys.exit(1)
    print("PASS: 0 failed, refused, lost, hung or wrong")


if __name__ == "__main__":
    main()

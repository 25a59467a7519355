"""Chaos: the soak's workload while parts of the stack are killed, paused, filled and corrupted.

    .venv/bin/python -m bench.chaos                                 # every fault, two lm replicas
    .venv/bin/python -m bench.chaos --faults lm_kill,redis_kill     # the short run of the test suite

Faults, one after another, with --settle seconds of plain traffic around each:
- lm_kill:         SIGKILL lm replica 0, restart it after 5 s, wait until the gateway routes to it again.
                   Streams that had begun there end UNAVAILABLE naming it; the rest move to or run on the
                   other replica. Each failed seeded request is sent again afterwards: its new text must
                   start with what the failed stream had shown.
- tokenizer_stop:  SIGSTOP the tokenizer for 20 s (--pause-s), then SIGCONT. Text stalls and resumes
                   (the gateway's tokenizer deadline is longer); images keep being served.
- redis_kill:      SIGKILL redis-server, restart it after 5 s. Nothing may fail (the cache misses) but stored
                   conversations (/v1/responses): 503 while Redis is down, 404 for one stored before it.
- redis_full:      Redis's maxmemory set just above what it uses, with noeviction, and filled until it
                   refuses writes, for 10 s. Nothing may fail but storing a response (503).
- redis_corrupt:   every cached KV block has bytes flipped. Nothing may fail; texts stay right.
- gateway_term:    SIGTERM the gateway: it drains (every stream in flight then finishes), exits 0, and is
                   started again. Requests sent while it is down fail to connect.
It reports per fault what the clients saw, and exits non-zero on any hung stream, any failure outside
what a fault explains, or a part of the stack that stopped serving.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:] = [str(ROOT), *(p for p in sys.path if Path(p or ".").resolve() != ROOT / "bench")]

import argparse  # noqa: E402
import asyncio  # noqa: E402
import collections  # noqa: E402
import dataclasses  # noqa: E402
import json  # noqa: E402
import random  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402

import grpc  # noqa: E402

from bench.stack import DEFAULT_IMAGE_MODEL, LocalStack  # noqa: E402
from bench.workload import Outcome, Workload, check_text, summarize  # noqa: E402
from muestra.v1 import diffusion_pb2, gateway_pb2, gateway_pb2_grpc  # noqa: E402

# The workload's gRPC channel retries a refused connection within this long (bench.workload).
RECONNECT_S = 1.5
FAULTS = ("lm_kill", "tokenizer_stop", "redis_kill", "redis_full", "redis_corrupt", "gateway_term")


@dataclasses.dataclass
class Fault:
    name: str
    start: float = 0.0
    end: float = 0.0
    notes: list[str] = dataclasses.field(default_factory=list)
    problems: list[str] = dataclasses.field(default_factory=list)
    seen: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    drained_at: float = 0.0  # gateway_term: when the old gateway had exited


def _redis(stack: LocalStack):
    import redis

    # The stack's redis-server requires its password (bench/stack.py); the URL does not carry it.
    return redis.Redis.from_url(stack.redis_url, password=stack.redis_password, socket_timeout=5)


async def _serving_text(stack: LocalStack, within_s: float) -> float:
    """Seconds until a short greedy request through the gateway succeeds (raises past within_s)."""
    started = time.monotonic()
    async with grpc.aio.insecure_channel(stack.gateway.address) as channel:
        stub = gateway_pb2_grpc.GatewayStub(channel)
        request = gateway_pb2.GenerateRequest(
            prompt="Return the", max_tokens=4, samplers=[gateway_pb2.SamplerSpec(name="greedy")]
        )
        while True:
            try:
                async for message in stub.Generate(request, timeout=10):
                    if message.HasField("done") and message.done.finish_reason == gateway_pb2.ERROR:
                        raise RuntimeError(message.done.error)
                return time.monotonic() - started
            except (grpc.aio.AioRpcError, RuntimeError):
                if time.monotonic() - started > within_s:
                    raise
                await asyncio.sleep(0.5)


async def _image_served(stack: LocalStack, timeout_s: float) -> float:
    """Seconds one small image takes through the gateway."""
    started = time.monotonic()
    async with grpc.aio.insecure_channel(stack.gateway.address) as channel:
        stub = gateway_pb2_grpc.GatewayStub(channel)
        request = diffusion_pb2.ImageRequest(prompt="a handwritten two", steps=2, seed=5)
        async for _ in stub.GenerateImage(request, timeout=timeout_s):
            pass
    return time.monotonic() - started


async def _replicas_serving(stack: LocalStack, count: int, within_s: float) -> float:
    """Seconds until the gateway lists `count` healthy replicas of the text model."""
    started = time.monotonic()
    async with grpc.aio.insecure_channel(stack.gateway.address) as channel:
        stub = gateway_pb2_grpc.GatewayStub(channel)
        while True:
            reply = await stub.ListModels(gateway_pb2.ListModelsRequest(), timeout=5)
            if any(m.kind == "text" and m.replicas >= count for m in reply.models):
                return time.monotonic() - started
            if time.monotonic() - started > within_s:
                raise TimeoutError(f"fewer than {count} healthy replicas after {within_s:.0f} s")
            await asyncio.sleep(0.5)


async def lm_kill(stack: LocalStack, fault: Fault, args) -> None:
    victim = stack.lm[0]
    fault.notes.append(f"SIGKILL {victim.name} at {victim.address}")
    victim.kill()
    await asyncio.sleep(5)
    await asyncio.to_thread(victim.start)
    back = await _replicas_serving(stack, len(stack.lm), 30)
    fault.notes.append(f"restarted; back in rotation {back:.1f} s after its restart")


async def tokenizer_stop(stack: LocalStack, fault: Fault, args) -> None:
    fault.notes.append(f"SIGSTOP tokenizer for {args.pause_s:.0f} s")
    stack.tokenizer.pause()
    try:
        await asyncio.sleep(min(5.0, args.pause_s / 2))
        # Images need no tokenizer: the gateway must go on serving them while text waits.
        try:
            seconds = await _image_served(stack, timeout_s=max(1.0, args.pause_s / 2))
            fault.notes.append(f"an image during the pause took {seconds:.1f} s")
        except grpc.aio.AioRpcError as exc:
            fault.problems.append(f"no image while the tokenizer was stopped: {exc.code().name} {exc.details()}")
        await asyncio.sleep(max(0.0, args.pause_s - (time.monotonic() - fault.start)))
    finally:
        stack.tokenizer.resume()


async def redis_kill(stack: LocalStack, fault: Fault, args) -> None:
    fault.notes.append("SIGKILL redis-server, restart after 5 s")
    stack.redis.kill()
    await asyncio.sleep(5)
    await asyncio.to_thread(stack.redis.start)


async def redis_full(stack: LocalStack, fault: Fault, args) -> None:
    import redis

    client = _redis(stack)
    maxmemory = client.config_get("maxmemory")["maxmemory"]
    policy = client.config_get("maxmemory-policy")["maxmemory-policy"]
    used = client.info("memory")["used_memory"]
    client.config_set("maxmemory", used + 4 * 1024 * 1024)
    client.config_set("maxmemory-policy", "noeviction")
    junk = 0
    try:
        while True:
            client.set(f"chaos:junk:{junk}", b"x" * 65536)
            junk += 1
    except redis.ResponseError as exc:
        fault.notes.append(f"filled with {junk} junk keys until Redis said {str(exc)[:60]!r}")
    try:
        await asyncio.sleep(10)
    finally:
        for start in range(0, junk, 500):
            client.delete(*(f"chaos:junk:{i}" for i in range(start, min(junk, start + 500))))
        client.config_set("maxmemory", maxmemory)
        client.config_set("maxmemory-policy", policy)


async def redis_corrupt(stack: LocalStack, fault: Fault, args) -> None:
    client = _redis(stack)
    rng = random.Random(0)
    corrupted = 0
    for key in client.scan_iter(match="muestra:kv:*", count=500):
        value = client.get(key)
        if not value:
            continue
        data = bytearray(value)
        for _ in range(8):
            position = rng.randrange(len(data))
            data[position] ^= 0xFF
        client.set(key, bytes(data), keepttl=True)
        corrupted += 1
    fault.notes.append(f"flipped bytes in {corrupted} cached blocks")
    await asyncio.sleep(10)


async def gateway_term(stack: LocalStack, fault: Fault, args) -> None:
    started = time.monotonic()
    code = await asyncio.to_thread(stack.gateway.terminate, args.grace_s + 10)
    fault.notes.append(f"SIGTERM: the gateway drained and exited {code} in {time.monotonic() - started:.1f} s")
    if code != 0:
        fault.problems.append(f"the gateway exited {code} on SIGTERM")
    fault.drained_at = time.monotonic()
    await asyncio.to_thread(stack.gateway.start)


ACTIONS = {f.__name__: f for f in (lm_kill, tokenizer_stop, redis_kill, redis_full, redis_corrupt, gateway_term)}


def _overlaps(outcome: Outcome, fault: Fault) -> bool:
    # A gateway that was down is reached again within the client's reconnect backoff.
    tail = RECONNECT_S if fault.name == "gateway_term" else 0.0
    return outcome.started <= fault.end + tail and outcome.ended >= fault.start


def _explained(outcome: Outcome, fault: Fault, stack: LocalStack) -> bool:
    """Whether a failed request is what this fault should cause."""
    if outcome.kind == "http_responses" and fault.name in ("redis_kill", "redis_full"):
        # Stored responses live in the stack's Redis (a cache without persistence): while it is down or full a
        # store or read is a 503, and a conversation stored before a Redis restart is gone (404).
        lost = outcome.code == "HTTP 404 not_found" and fault.name == "redis_kill" and outcome.started <= fault.end
        return outcome.code in ("HTTP 503 store_unavailable", "store_unavailable") or lost  # whole, or a stream's
    if outcome.kind == "http_responses" and fault.name == "gateway_term":
        # A conversation's later turn (its last one is the one that failed) sent while the gateway was down.
        return fault.start <= outcome.ended <= fault.end + RECONNECT_S
    if fault.name == "lm_kill":
        # The gateway fails only the requests that had streamed there (it moves the others), naming the replica.
        return stack.lm[0].address in outcome.error
    if fault.name == "tokenizer_stop":
        return "tokenizer" in outcome.error and not outcome.kind.startswith("image")
    if fault.name == "gateway_term":
        # Sent while it drained or was down (or within the client's 1 s reconnect backoff after): refused.
        return fault.start <= outcome.started <= fault.end + RECONNECT_S
    return False


def judge(outcomes: list[Outcome], faults: list[Fault], stack: LocalStack) -> list[str]:
    """Per fault: what clients saw; the problems (unexplained failures, hangs) of the whole run."""
    problems = []
    for outcome in outcomes:
        during = [f for f in faults if _overlaps(outcome, f)]
        for fault in during:
            fault.seen[f"{outcome.status} {outcome.code}".strip()] += 1
        if outcome.status == "hung":
            problems.append(f"hung: {outcome.describe()}")
        elif outcome.status in ("failed", "lost", "refused"):
            if not any(_explained(outcome, f, stack) for f in during):
                where = ", ".join(f.name for f in during) or "no fault"
                after = [f"{outcome.started - f.end:+.1f} s after {f.name}" for f in faults if f.end <= outcome.started]
                problems.append(f"{outcome.status} during {where} ({(after or ['-'])[-1]}): {outcome.describe()}")
        if outcome.problems:
            problems.append(f"wrong: {outcome.describe()} | {'; '.join(outcome.problems)[:300]}")
    for fault in faults:
        problems += [f"{fault.name}: {p}" for p in fault.problems]
    return problems


async def retry_failed(workload: Workload, outcomes: list[Outcome], fault: Fault) -> tuple[int, list[str]]:
    """Send every seeded text request that a replica's death failed once more: same seed, same text."""
    failed = [o for o in outcomes if o.status == "failed" and o.spec is not None and o.first_at is not None]
    failed = [o for o in failed if _overlaps(o, fault)]
    problems = []
    for original, again in zip(failed, await workload.resend([o.spec for o in failed]), strict=True):
        if again.status != "ok":
            problems.append(f"retry of a request failed by {fault.name}: {again.describe()}")
            continue
        same = all(again.texts.get(i, "").startswith(shown) for i, shown in original.texts.items())
        fault.seen[f"retried {'argmax' if original.spec.argmax else 'sampled'} {'same' if same else 'different'}"] += 1
        if not original.spec.argmax:
            continue  # counted: see Workload._compare_replay
        for i, shown in original.texts.items():
            if not again.texts.get(i, "").startswith(shown):
                seed = original.spec.seed
                problems.append(f"retry with seed {seed} gave {again.texts.get(i)!r:.80}, not {shown!r:.80}…")
    return len(failed), problems


async def chaos(stack: LocalStack, args) -> tuple[dict, list[Fault], list[str]]:
    workload = Workload(stack.gateway.address, stack.base_url, args.concurrency, seed=args.seed, hang_s=args.hang_s)
    run = asyncio.ensure_future(workload.run(10**9))
    faults = []
    try:
        await asyncio.sleep(args.settle_s)
        for name in args.faults:
            fault = Fault(name, start=time.monotonic())
            print(f"-- {name}", flush=True)
            await ACTIONS[name](stack, fault, args)
            fault.end = time.monotonic()
            try:
                recovered = await _serving_text(stack, 60)
                fault.notes.append(f"text served again {recovered:.1f} s after the fault ended")
            except (grpc.aio.AioRpcError, RuntimeError) as exc:
                fault.problems.append(f"text not served within 60 s after the fault: {exc}")
            faults.append(fault)
            await asyncio.sleep(args.settle_s)
    finally:
        workload.stopping = True
        outcomes = await run
    for fault in faults:
        if fault.name == "lm_kill":
            count, problems = await retry_failed(workload, outcomes, fault)
            fault.notes.append(f"{count} request(s) failed by the kill sent again with their seeds")
            fault.problems += problems
    await check_text(outcomes, stack.tokenizer.address, stack.internal_token)
    problems = judge(outcomes, faults, stack)
    return summarize(outcomes), faults, problems


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--faults", default=",".join(FAULTS), help=f"comma-separated, from {', '.join(FAULTS)}")
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--lm-replicas", type=int, default=2)
    parser.add_argument("--settle-s", type=float, default=10.0, help="plain traffic before and after each fault")
    parser.add_argument("--pause-s", type=float, default=20.0, help="how long the tokenizer is stopped")
    parser.add_argument("--grace-s", type=float, default=20.0, help="the services' grace period on SIGTERM")
    parser.add_argument("--hang-s", type=float, default=30.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--log-dir", default=None)
    parser.add_argument("--json", default=None, help="also write the report here")
    args = parser.parse_args()
    args.faults = [f.strip() for f in args.faults.split(",") if f.strip()]
    unknown = [f for f in args.faults if f not in ACTIONS]
    if unknown:
        parser.error(f"unknown faults {unknown}; known: {', '.join(FAULTS)}")
    if args.lm_replicas < 2 and "lm_kill" in args.faults:
        parser.error("lm_kill needs --lm-replicas 2 or more")
    log_dir = Path(args.log_dir or tempfile.mkdtemp(prefix="muestra-chaos-"))
    print(f"logs in {log_dir}", flush=True)
    stack = LocalStack(
        log_dir, lm_replicas=args.lm_replicas, image_model=DEFAULT_IMAGE_MODEL, grace_period_s=args.grace_s
    )
    try:
        report, faults, problems = asyncio.run(chaos(stack, args))
    finally:
        stack.close()
    print(f"\n== chaos: {args.concurrency} concurrent streams, {args.lm_replicas} lm replicas")
    print(f"requests: {report['requests']}  by outcome: {report['by_status']}  wrong: {report['wrong']}")
    for fault in faults:
        print(f"{fault.name}: {'; '.join(fault.notes)}")
        print(f"  clients saw (requests overlapping it): {dict(fault.seen)}")
    if args.json:
        out = {
            "verdict": "FAIL" if problems else "PASS", **report, "problems": problems,
            "faults": [
                {"fault": f.name, "notes": f.notes, "seen": dict(f.seen), "problems": f.problems} for f in faults
            ],
        }  # fmt: skip
        Path(args.json).write_text(json.dumps(out, indent=2))
    if problems:
        print("FAIL:")
        for problem in problems[:30]:
            print("  !", problem)
        sys.exit(1)
    print("PASS: every fault survived as described; 0 hung, 0 unexplained failures, 0 wrong")


if __name__ == "__main__":
    main()

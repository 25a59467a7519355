"""Multi-turn conversations end to end, muestra against llama-server, on the same GGUF file and machine.

    .venv/bin/python bench/conversations.py [--scenario a|b|c|all] [--only muestra|llama] [--rounds 2]
        [--out conversations.json]

muestra runs as `muestra up` runs it (bench.stack.LocalStack: redis-server, tokenizer, lm, gateway, with the
stack's defaults: the Redis prefix cache, the gateway's ngram drafts) on models/smollm2-135m-instruct;
llama-server (built by bench/llama_cpp.py) serves models/smollm2-135m-instruct/source/*.gguf, the file that
folder was imported from, with -t THREADS -np N -c N x (context per slot) --jinja. Both stay up; the same
requests go to one, then the other (each goes first in every other round), through the OpenAI HTTP API with
the official client: streamed, temperature 0, usage included.

(a) document chat: a system prompt, a ~2,870-token document (CPython's pydoc topics) and a question, then
    four follow-ups; every turn sends the whole history, answers as returned. TTFT and cached tokens per turn.
    llama-server -np 8.
(b) 16 users x 8 turns at once, each its own short conversation, 0.5-2 s of seeded think time before each
    turn. TTFT p50/p99 per turn and overall, completion tokens/s over the run, cached tokens per turn. -np 16.
(c) bystanders: 3 streams decode (ignore_eos) while a ~5.5k-token prompt arrives: their largest gap between
    content deltas during its prefill, and its TTFT, against its TTFT alone (a prompt of its own, so nothing
    is cached; llama-server also gets cache_prompt false). -np 4.

The JSON names the muestra.lm the stack ran ("muestra_lm"): to measure a pinned commit while the working tree
changes, extract it (git archive) and put its distributions' folders (cli, proto, services/*, plugins/*) on
PYTHONPATH; the stack's processes inherit it.

The machine may be shared: a round in which other processes took more than --max-foreign-share of the cores
(the machine's busy CPU time less the servers' and this script's) is run again, up to --retries times.
Every round's prompts carry a session tag, so no round reuses another's cache on either server. Cached tokens
are usage.prompt_tokens_details.cached_tokens on both (llama-server's equals its timings.cache_n, also kept).
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# The repository first, and not bench/ itself (its tokenize.py would shadow the standard library's).
sys.path[:] = [str(ROOT), *(p for p in sys.path if Path(p or ".").resolve() != ROOT / "bench")]

import argparse  # noqa: E402
import asyncio  # noqa: E402
import dataclasses  # noqa: E402
import importlib.util  # noqa: E402
import itertools  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import pydoc_data.topics  # noqa: E402
import random  # noqa: E402
import statistics  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
import urllib.request  # noqa: E402

import openai  # noqa: E402

from bench import llama_cpp  # noqa: E402
from bench.speculative import cpu_name  # noqa: E402
from bench.stack import LocalStack  # noqa: E402
from bench.workload import percentiles  # noqa: E402
from muestra.cli.launch import Process, free_port  # noqa: E402

MODEL = ROOT / "models" / "smollm2-135m-instruct"
SLOTS = {"a": 8, "b": 16, "c": 4}  # llama-server -np per scenario
SLOT_CONTEXT = {"a": 4096, "b": 2048, "c": 8192}  # tokens per slot: -c is their sum
DOCUMENT_TOKENS = 2870
LONG_PROMPT_TOKENS = 5500
QUESTIONS = [
    "Using the document, explain what an augmented assignment statement does.",
    "Can you give a short example?",
    "How is that different from a plain assignment?",
    "What happens when the target is a list?",
    "Summarize all of that in two sentences.",
]
TOPICS = [
    "gardening", "chess", "baking bread", "learning Spanish", "running", "astronomy", "photography", "jazz",
    "hiking", "woodworking", "birdwatching", "cycling", "knitting", "sailing", "pottery", "origami",
]  # fmt: skip
NAMES = ["Ana", "Ben", "Chen", "Dana", "Eli", "Fatima", "Goran", "Hana", "Ivan", "Jun", "Kofi", "Lea", "Mia", "Nils"]
USER_TURNS = [
    "I want to get started with {topic}. Where do I begin?",
    "What do I need to buy first?",
    "How much time should I spend on it each week?",
    "What is a common beginner mistake?",
    "Can you suggest a first small project?",
    "How do I know that I am improving?",
    "Is there a good book about it?",
    "Thanks! One last tip?",
]
BYSTANDER_TASKS = ["a long story about a lighthouse", "a long history of the bicycle", "a long guide to tea"]


@dataclasses.dataclass
class Server:
    """One OpenAI endpoint under test, with the extra body fields that keep a prompt out of its cache."""

    name: str
    base_url: str
    no_cache: dict
    pids: list[int]  # its processes, whose CPU time is its own
    model: str = ""
    client: openai.AsyncOpenAI | None = None

    async def open(self) -> None:
        self.client = openai.AsyncOpenAI(base_url=self.base_url, api_key="none", max_retries=0, timeout=900)
        self.model = (await self.client.models.list()).data[0].id

    async def close(self) -> None:
        await self.client.close()


# -- the servers --------------------------------------------------------------------------------------


def start_muestra(
    log_dir: Path, threads: int, extra: tuple[str, ...] = (), model: Path = MODEL
) -> tuple[LocalStack, Server]:
    """The stack as `muestra up` starts it on `model` (the default text model unless named; no image service:
    nothing asks for one); `extra` flags go to the lm (--muestra-lm-args)."""
    lm_args = ("--intra-op-threads", str(threads), *extra)  # after LocalStack's own 1: the last flag wins
    stack = LocalStack(log_dir / "muestra", text_model=model, image_model=None, lm_args=lm_args)
    return stack, Server("muestra", stack.base_url, no_cache={}, pids=[p.pid for p in stack.processes()])


def start_llama(log_dir: Path, scenario: str, threads: int) -> tuple[Process, Server]:
    """llama-server for a scenario: its slots and context, without its prompt cache where the scenario says."""
    slots = SLOTS[scenario]
    return serve_llama(log_dir, scenario, threads, slots, slots * SLOT_CONTEXT[scenario], {"cache_prompt": False})


def serve_llama(
    log_dir: Path, label: str, threads: int, slots: int, context: int, no_cache: dict
) -> tuple[Process, Server]:
    """llama-server on the GGUF file muestra's model was imported from, once its /health answers 200."""
    (gguf,) = (MODEL / "source").glob("*.gguf")
    port = free_port()
    command = [str(llama_cpp.server_binary()), "-m", str(gguf), "--host", "127.0.0.1", "--port", str(port)]
    command += ["-t", str(threads), "-np", str(slots), "-c", str(context), "--jinja"]
    name = f"llama-server-{label}"
    process = Process(name, command, log_dir / f"{name}.log", port, grpc_health=False)
    process.start()
    deadline = time.monotonic() + 120
    while True:  # the port opens before the model is loaded (503 until then)
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as reply:
                if reply.status == 200:
                    break
        except OSError:
            if time.monotonic() > deadline or not process.alive():
                process.stop()
                raise RuntimeError(f"llama-server not healthy:\n{process.log_tail()}") from None
        time.sleep(0.2)
    server = Server("llama", f"http://127.0.0.1:{port}/v1", no_cache=no_cache, pids=[process.pid])
    return process, server


# -- one request ---------------------------------------------------------------------------------------


async def stream_chat(
    server: Server, messages: list[dict], max_tokens: int, extra: dict | None = None,
    times: list[float] | None = None, stop: asyncio.Event | None = None,
) -> dict:  # fmt: skip
    """One streamed chat completion: its text, TTFT, usage; each content delta's time goes to `times`.

    With `stop`, the stream is closed at the first delta after it is set (the server then stops decoding).
    """
    times = [] if times is None else times
    text, usage, timings, finished = [], None, {}, None
    sent = time.perf_counter()
    stream = await server.client.chat.completions.create(
        model=server.model, messages=messages, max_tokens=max_tokens, temperature=0, stream=True,
        stream_options={"include_usage": True}, extra_body=extra or None,
    )  # fmt: skip
    try:
        async for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                times.append(time.perf_counter())
                text.append(chunk.choices[0].delta.content)
            if chunk.choices and chunk.choices[0].finish_reason and finished is None:
                finished = time.perf_counter()
            usage = chunk.usage or usage
            timings = (chunk.model_extra or {}).get("timings") or timings  # llama-server's own figures
            if stop is not None and stop.is_set():
                break
    finally:
        await stream.close()
    details = usage.prompt_tokens_details if usage is not None else None
    first = times[0] if times else finished  # an answer without content: the end is its first token
    return {
        "text": "".join(text),
        "sent": sent,
        "ttft_s": first - sent if first is not None else None,
        "prompt_tokens": usage.prompt_tokens if usage else None,
        "completion_tokens": usage.completion_tokens if usage else len(times),
        "cached_tokens": details.cached_tokens if details else None,
        "cache_n": timings.get("cache_n"),
    }


def turn_record(reply: dict) -> dict:
    """What the JSON keeps of one turn."""
    keys = ("ttft_s", "prompt_tokens", "completion_tokens", "cached_tokens", "cache_n")
    return {key: reply[key] for key in keys}


# -- the texts -----------------------------------------------------------------------------------------


def tokenizer():
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(MODEL / "tokenizer.json"))


def cut_to_tokens(text: str, offsets: list[tuple[int, int]], limit: int) -> str:
    """`text` up to the line break before its token number `limit` (offsets: each token's character span)."""
    if len(offsets) <= limit:
        raise ValueError(f"the text has {len(offsets)} tokens, fewer than {limit}")
    end = text.rfind("\n", 0, offsets[limit][0])
    return text[: end if end > 0 else offsets[limit][0]]


def topics_text(first: str, limit: int) -> str:
    """CPython's pydoc topics from `first` on, in sorted order, cut to about `limit` tokens of the model."""
    names = sorted(pydoc_data.topics.topics)
    text = "\n\n".join(pydoc_data.topics.topics[name] for name in names[names.index(first) :])
    return cut_to_tokens(text, tokenizer().encode(text, add_special_tokens=False).offsets, limit)


def long_prompt(document: str, tag: str) -> list[dict]:
    """Scenario (c)'s prompt; the tag comes first, so two tags share no cached prefix past the template."""
    return [
        {"role": "system", "content": f"Session {tag}. You answer questions about Python's documentation."},
        {"role": "user", "content": f"{document}\n\nWhich topics does this text cover?"},
    ]


def user_script(seed: int, round_: int, user: int, session: str) -> dict:
    """One user of scenario (b): system prompt (which begins with the session tag), turns, think times (seconds
    before each turn); all but the tag drawn from the seed, the round and the user."""
    rng = random.Random(f"{seed}:{round_}:{user}")
    topic = TOPICS[(user + rng.randrange(len(TOPICS))) % len(TOPICS)]
    name = rng.choice(NAMES)
    system = f"Session {session}-{user}. You are a friendly assistant helping {name}. Keep answers short."
    return {
        "system": system,
        "turns": [turn.format(topic=topic) for turn in USER_TURNS],
        "think_s": [rng.uniform(0.5, 2.0) for _ in USER_TURNS],
    }


# -- the scenarios -------------------------------------------------------------------------------------


async def document_chat(server: Server, document: str, tag: str) -> list[dict]:
    """(a): one conversation over the document; per turn, its TTFT and cached tokens."""
    system = f"Session {tag}. You are a helpful assistant. Answer from the document the user gives."
    messages = [{"role": "system", "content": system}]
    turns = []
    for index, question in enumerate(QUESTIONS):
        content = f"Document:\n{document}\n\n{question}" if index == 0 else question
        messages.append({"role": "user", "content": content})
        reply = await stream_chat(server, messages, max_tokens=64)
        messages.append({"role": "assistant", "content": reply["text"]})
        turns.append({**turn_record(reply), "answer": reply["text"]})
    return turns


async def chat_user(server: Server, script: dict) -> list[dict]:
    """(b): one user's conversation, thinking before each turn."""
    messages = [{"role": "system", "content": script["system"]}]
    turns = []
    for question, think_s in zip(script["turns"], script["think_s"], strict=True):
        await asyncio.sleep(think_s)
        messages.append({"role": "user", "content": question})
        reply = await stream_chat(server, messages, max_tokens=48)
        messages.append({"role": "assistant", "content": reply["text"]})
        turns.append(turn_record(reply))
    return turns


async def gather_all(tasks: list[asyncio.Future]) -> list:
    """The tasks' results; if one fails, the others are cancelled and reaped before its error is raised."""
    try:
        return await asyncio.gather(*tasks)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def many_users(server: Server, seed: int, round_: int, session: str, users: int = 16) -> dict:
    """(b): `users` conversations at once; every turn, and completion tokens/s over the whole run."""
    started = time.perf_counter()
    tasks = [asyncio.ensure_future(chat_user(server, user_script(seed, round_, u, session))) for u in range(users)]
    conversations = await gather_all(tasks)
    seconds = time.perf_counter() - started
    completion = sum(turn["completion_tokens"] for turns in conversations for turn in turns)
    tokens_per_s = completion / seconds
    return {"seconds": seconds, "completion_tokens": completion, "tokens_per_s": tokens_per_s, "users": conversations}


def largest_gap(times: list[float], start: float, end: float) -> tuple[float, float]:
    """The longest wait between consecutive deltas that overlaps [start, end], as (earlier, later); (start, start)
    if none does."""
    gaps = [(earlier, later) for earlier, later in itertools.pairwise(times) if later > start and earlier < end]
    return max(gaps, key=lambda gap: gap[1] - gap[0], default=(start, start))


async def bystanders(server: Server, document: str, tag: str, streams: int = 3) -> dict:
    """(c): the long prompt's TTFT alone; then with `streams` decoding, its TTFT and their largest gap."""
    alone = await stream_chat(server, long_prompt(document, f"{tag}-alone"), 8, extra=server.no_cache)
    stop = asyncio.Event()
    times: list[list[float]] = [[] for _ in range(streams)]
    extra = {"ignore_eos": True}
    tasks = []
    for i in range(streams):
        messages = [
            {"role": "system", "content": f"Session {tag}-{i}. You are a storyteller."},
            {"role": "user", "content": f"Write {BYSTANDER_TASKS[i % len(BYSTANDER_TASKS)]}."},
        ]
        tasks.append(asyncio.ensure_future(stream_chat(server, messages, 2000, extra, times[i], stop)))
    try:
        while min(len(t) for t in times) < 16:  # every bystander decoding steadily first
            if any(task.done() for task in tasks):
                raise RuntimeError("a bystander ended before its 16th delta")  # gather_all raises its error first
            await asyncio.sleep(0.05)
        busy = await stream_chat(server, long_prompt(document, f"{tag}-busy"), 8, extra=server.no_cache)
        first = busy["sent"] + busy["ttft_s"]
        await asyncio.sleep(0.5)  # a few deltas after it, so the gap that ends the prefill is seen
    finally:
        stop.set()
        await gather_all(tasks)
    gap = max((largest_gap(t, busy["sent"], first) for t in times), key=lambda gap: gap[1] - gap[0])
    before = [b - a for t in times for a, b in itertools.pairwise(t) if b < busy["sent"]]
    return {
        "ttft_alone_s": alone["ttft_s"],
        "ttft_busy_s": busy["ttft_s"],
        "prompt_tokens": busy["prompt_tokens"],
        "cached_tokens_alone": alone["cached_tokens"],
        "cached_tokens_busy": busy["cached_tokens"],
        "largest_gap_s": gap[1] - gap[0],
        # Where it lies: from and to, in seconds after the long prompt was sent.
        "largest_gap_from_s": gap[0] - busy["sent"],
        "largest_gap_to_s": gap[1] - busy["sent"],
        "median_gap_before_s": statistics.median(before) if before else None,
    }


def process_cpu_s(pids: list[int]) -> float:
    """CPU seconds (user + system) the live ones of `pids` have used so far."""
    ticks = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        ticks += int(fields[11]) + int(fields[12])  # utime and stime, the line's 14th and 15th fields
    return ticks / os.sysconf("SC_CLK_TCK")


def machine_busy_s() -> float:
    """CPU seconds the whole machine has spent busy (not idle, not waiting for I/O) since boot."""
    ticks = [int(field) for field in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    user, nice, system, _idle, _iowait, irq, softirq, steal = ticks[:8]
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


class CpuMeter:
    """What else ran while one server was measured: the machine's busy CPU seconds less the server's and ours.

    The machine is shared; a run where other processes took a good part of the cores is not a fair figure.
    """

    def __init__(self, pids: list[int]) -> None:
        self.pids = [*pids, os.getpid()]
        self.wall, self.busy, self.ours = time.perf_counter(), machine_busy_s(), process_cpu_s(self.pids)

    def read(self) -> dict:
        wall = time.perf_counter() - self.wall
        ours = process_cpu_s(self.pids) - self.ours
        foreign = max(0.0, machine_busy_s() - self.busy - ours)
        return {
            "wall_s": round(wall, 1),
            "ours_cpu_s": round(ours, 1),
            "foreign_cpu_s": round(foreign, 1),
            "foreign_share": round(foreign / (wall * (os.cpu_count() or 1)), 3),
        }


async def measure(scenario: str, server: Server, seed: int, round_: int, texts: dict, attempt: int):
    """One round of `scenario` on `server`; a repeated attempt gets prompts of its own (nothing cached)."""
    tag = f"{seed}-{scenario}-{round_}" + (f"-again{attempt}" if attempt else "")
    if scenario == "a":
        return await document_chat(server, texts["document"], tag)
    if scenario == "b":
        return await many_users(server, seed, round_, tag)
    return await bystanders(server, texts["long"], tag)


async def run_scenario(scenario: str, servers: list[Server], texts: dict, args) -> dict:
    """Every round of one scenario on each server in turn (each first in every other round). A round in which
    other processes took more than args.max_foreign_share of the cores is run again (args.retries times at
    most); the JSON keeps the discarded ones."""
    report = {key: {server.name: [] for server in servers} for key in ("rounds", "cpu", "discarded")}
    for server in servers:
        await server.open()
        await stream_chat(server, [{"role": "user", "content": "Hello!"}], 8)  # warm-up, not measured
    try:
        for round_ in range(args.rounds):
            for server in servers if round_ % 2 == 0 else servers[::-1]:
                for attempt in range(args.retries + 1):
                    meter = CpuMeter(server.pids)
                    result, failure = None, None
                    try:
                        result = await measure(scenario, server, args.seed, round_, texts, attempt)
                    except openai.APIError as error:  # a refused or broken request fails the attempt, not the run
                        failure = f"{type(error).__name__}: {error}"
                    others = meter.read()
                    print(
                        f"  ({scenario}) round {round_} {server.name} {'FAILED: ' + failure if failure else 'done'} in "
                        f"{others['wall_s']} s; other processes took {others['foreign_cpu_s']} CPU-s "
                        f"({others['foreign_share']:.0%} of the cores)",
                        flush=True,
                    )
                    await asyncio.sleep(2)  # let a closed stream's work drain before the next measurement
                    fair = others["foreign_share"] <= args.max_foreign_share
                    if failure is None and (fair or attempt == args.retries):
                        report["rounds"][server.name].append(result)
                        report["cpu"][server.name].append(others)
                        break
                    discarded = {"round": round_, "cpu": others, "failure": failure, "result": result}
                    report["discarded"][server.name].append(discarded)
    finally:
        for server in servers:
            await server.close()
    return report


# -- the report ----------------------------------------------------------------------------------------


def ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 1)


def summarize_a(rounds: list[list[dict]]) -> list[dict]:
    """Per turn: median TTFT over rounds, prompt and cached tokens (as in every round)."""
    return [
        {
            "turn": index + 1,
            "prompt_tokens": [r[index]["prompt_tokens"] for r in rounds],
            "ttft_ms": ms(statistics.median(r[index]["ttft_s"] for r in rounds)),
            "cached_tokens": [r[index]["cached_tokens"] for r in rounds],
        }
        for index in range(len(rounds[0]))
    ]


def summarize_b(rounds: list[dict]) -> dict:
    """TTFT p50/p99 per turn index and overall (all users, all rounds), mean cached tokens per turn, tokens/s."""
    turns = [turn for r in rounds for user in r["users"] for turn in user]
    per_turn = {}
    for index in range(len(USER_TURNS)):
        at = [user[index] for r in rounds for user in r["users"]]
        ttft = percentiles([t["ttft_s"] for t in at], (50, 99))
        per_turn[index + 1] = {
            "ttft_p50_ms": ms(ttft[50]), "ttft_p99_ms": ms(ttft[99]),
            "cached_tokens_mean": statistics.mean(t["cached_tokens"] or 0 for t in at),
            "prompt_tokens_mean": statistics.mean(t["prompt_tokens"] or 0 for t in at),
        }  # fmt: skip
    overall = percentiles([t["ttft_s"] for t in turns], (50, 99))
    return {
        "per_turn": per_turn,
        "ttft_p50_ms": ms(overall[50]),
        "ttft_p99_ms": ms(overall[99]),
        "tokens_per_s": [round(r["tokens_per_s"], 1) for r in rounds],
        "seconds": [round(r["seconds"], 1) for r in rounds],
    }


def summarize_c(rounds: list[dict]) -> dict:
    """Medians over rounds."""
    keys = ("ttft_alone_s", "ttft_busy_s", "largest_gap_s", "median_gap_before_s")
    summary = {key.replace("_s", "_ms"): ms(statistics.median(r[key] for r in rounds)) for key in keys}
    summary["prompt_tokens"] = rounds[0]["prompt_tokens"]
    summary["largest_gap_from_to_s"] = [
        [round(r["largest_gap_from_s"], 2), round(r["largest_gap_to_s"], 2)] for r in rounds
    ]
    summary["cached_tokens_busy"] = [r["cached_tokens_busy"] for r in rounds]
    return summary


SUMMARIES = {"a": summarize_a, "b": summarize_b, "c": summarize_c}


def print_summary(scenario: str, summaries: dict) -> None:
    names = list(summaries)
    if scenario == "a":
        print("\n(a) document chat: turn | prompt tokens | " + " | ".join(f"{n} TTFT ms, cached" for n in names))
        for index, row in enumerate(summaries[names[0]]):
            cells = [f"{summaries[n][index]['ttft_ms']:8.1f}, {summaries[n][index]['cached_tokens']}" for n in names]
            print(f"  {row['turn']} | {row['prompt_tokens'][0]:5} | " + " | ".join(cells))
    elif scenario == "b":
        print("\n(b) 16 users x 8 turns: turn | " + " | ".join(f"{n} TTFT p50/p99 ms, mean cached" for n in names))
        for turn in summaries[names[0]]["per_turn"]:
            rows = [summaries[n]["per_turn"][turn] for n in names]
            cells = [f"{r['ttft_p50_ms']:7.1f}/{r['ttft_p99_ms']:7.1f}, {r['cached_tokens_mean']:6.1f}" for r in rows]
            print(f"  {turn} | " + " | ".join(cells))
        for n in names:
            s = summaries[n]
            print(f"  {n}: overall TTFT p50/p99 {s['ttft_p50_ms']}/{s['ttft_p99_ms']} ms; "
                  f"completion tokens/s per round {s['tokens_per_s']} over {s['seconds']} s")  # fmt: skip
    else:
        print("\n(c) 3 bystanders decoding while a long prompt arrives (medians over rounds, ms):")
        for n in names:
            s = summaries[n]
            print(
                f"  {n}: {s['prompt_tokens']}-token prompt TTFT alone {s['ttft_alone_ms']}, with bystanders "
                f"{s['ttft_busy_ms']}; bystanders' largest gap {s['largest_gap_ms']} (their median gap before "
                f"{s['median_gap_before_ms']}); the gap per round, from/to s after the prompt was sent: "
                f"{s['largest_gap_from_to_s']}"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenario", choices=["a", "b", "c", "all"], default="all")
    parser.add_argument("--only", choices=["muestra", "llama"], default=None, help="run one side only")
    parser.add_argument("--rounds", type=int, default=2, help="rounds per scenario; each server first in every other")
    parser.add_argument("--threads", type=int, default=2, help="llama-server -t and the lm's --intra-op-threads")
    parser.add_argument("--seed", type=int, default=0, help="seeds the users of (b) and every session tag")
    parser.add_argument("--max-foreign-share", type=float, default=0.1, help="run a round again above it")
    parser.add_argument("--retries", type=int, default=3, help="most times one round is run again")
    parser.add_argument("--out", type=Path, default=None, help="write every figure here (JSON)")
    parser.add_argument(
        "--muestra-lm-args", default="", help='more flags for muestra\'s lm, e.g. "--hot-tier false" (Redis alone)'
    )
    args = parser.parse_args()
    scenarios = ["a", "b", "c"] if args.scenario == "all" else [args.scenario]
    texts = {
        "document": topics_text("assignment", DOCUMENT_TOKENS),
        "long": topics_text("typesseq", LONG_PROMPT_TOKENS),
    }
    counts = {name: len(tokenizer().encode(text, add_special_tokens=False).ids) for name, text in texts.items()}
    print(f"document {counts['document']} tokens, long prompt's text {counts['long']} tokens", flush=True)
    log_dir = Path(tempfile.mkdtemp(prefix="bench-conversations-"))
    print(f"logs in {log_dir}", flush=True)
    if args.only != "muestra":
        llama_cpp.server_binary()  # built before anything starts (minutes, once)
    started = time.monotonic()
    report: dict = {
        "machine": cpu_name(),
        "llama.cpp": llama_cpp.SDIST,
        "model": MODEL.name,
        # The code the stack runs (PYTHONPATH may put a pinned checkout before the editable install).
        "muestra_lm": importlib.util.find_spec("muestra.lm").origin,
        "threads": args.threads,
        "rounds": args.rounds,
        "seed": args.seed,
        "text_tokens": counts,
        "scenarios": {},
    }
    extra = tuple(args.muestra_lm_args.split())
    stack, muestra = start_muestra(log_dir, args.threads, extra) if args.only != "llama" else (None, None)
    try:
        for scenario in scenarios:
            llama, server = start_llama(log_dir, scenario, args.threads) if args.only != "muestra" else (None, None)
            try:
                servers = [s for s in (muestra, server) if s is not None]
                report["scenarios"][scenario] = asyncio.run(run_scenario(scenario, servers, texts, args))
            finally:
                if llama is not None:
                    llama.stop()
            rounds = report["scenarios"][scenario]["rounds"]
            summaries = {name: SUMMARIES[scenario](results) for name, results in rounds.items() if results}
            for name in rounds.keys() - summaries.keys():
                print(f"  ({scenario}) {name}: no round completed (see the JSON's discarded rounds)")
            report["scenarios"][scenario]["summary"] = summaries
            print_summary(scenario, summaries)
            for name, meters in report["scenarios"][scenario]["cpu"].items():
                shares = ", ".join(f"{m['foreign_share']:.0%}" for m in meters)
                print(f"  {name}: other processes took {shares} of the cores in the rounds kept")
    finally:
        if stack is not None:
            stack.close()
    report["seconds"] = round(time.monotonic() - started, 1)
    print(f"\n{report['machine']}; {report['llama.cpp']}; {report['seconds']} s")
    if args.out:
        args.out.write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()

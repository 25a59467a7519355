"""Decode speed of the lm service against a bare onnxruntime loop, transformers and onnxruntime-genai.

    .venv/bin/python bench/decode.py            # everything; models and the genai venv are cached
    .venv/bin/python bench/decode.py --no-genai --models gpt2-124m
    .venv/bin/python bench/decode.py --gguf FILE.gguf --ours q4_1=DIR --ours f32=DIR --threads 2 --rounds 3

Each contender runs a prompt once, then `--chunk` decode steps `--repeats` times, the contenders
taking turns in blocks (see fastest_chunks); a figure is the contender's fastest chunk (the CPUs are shared, so the
fastest chunk is the best estimate of an unloaded machine), and every ratio is against the bare
onnxruntime loop over the concat export measured in the same run. Models have random weights,
built with transformers and exported with muestra's exporter (fp32) in both layouts (fused: the
default, GroupQueryAttention over a shared buffer; concat), cached under ~/.cache/muestra/bench
(MUESTRA_BENCH_CACHE). onnxruntime-genai runs in its own venv (MUESTRA_GENAI_VENV, default
.venv-genai, made by `make dev` or on first use) because it needs the CPU onnxruntime package,
which breaks onnxruntime-gpu in .venv. With --gguf, only the llama.cpp comparison runs: each --ours
folder (our import of FILE, python -m muestra.lm.export FILE DIR ...) against llama.cpp on FILE in
that folder's llama.cpp type, batch 1 and 8 (versus_rounds).
"""

from __future__ import annotations

import sys
from pathlib import Path

# Run as a script, bench/ would come first on sys.path, where a module may shadow the standard library's.
ROOT = Path(__file__).resolve().parents[1]
sys.path[:] = [str(ROOT), *(p for p in sys.path if Path(p or ".").resolve() != ROOT / "bench")]

import argparse  # noqa: E402
import itertools  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import os  # noqa: E402
import signal  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402

from bench import decode_models, llama_cpp  # noqa: E402
from bench.decode_loops import (  # noqa: E402
    BareLoop,
    IoBindingLoop,
    ServiceLoop,
    SharedBufferLoop,
    StreamLoop,
    TorchLoop,
)
from muestra.v1 import lm_pb2  # noqa: E402

GENAI_VENV = Path(os.environ.get("MUESTRA_GENAI_VENV", ROOT / ".venv-genai"))
PROMPT_TOKENS = 16
PASTS = (64, 512, 1024)
BATCHES = (1, 4, 8, 16)
SETTLE_S = 0.3  # before a contender's block: the other sessions' spinning threads have gone to sleep
NAMES = {
    "bare": "bare ORT loop (concat export)",
    "service": "lm over gRPC (concat export)",
    "iobinding": "bare + IO binding (concat export)",
    "fused": "bare, shared buffer (fused export)",
    "service_fused": "lm over gRPC (fused export)",
    "service_shared": "lm over gRPC, shared buffer (genai graph)",
    "shared": "bare, shared buffer (genai graph)",
    "genai": "onnxruntime-genai",
    "transformers": "transformers generate",
}


def fastest_chunks(loops: dict, prompts: np.ndarray, chunk: int, repeats: int) -> dict[str, float]:
    """Seconds of each loop's fastest `chunk` decode steps after `prompts`.

    The contenders take turns in blocks, not chunk by chunk. onnxruntime's worker threads spin for
    tens of milliseconds after a run, so on 2 cores an idle session's pool slows the next session
    by up to 40% (int4 100M Llama: 340 tok/s alone, 200 interleaved chunk by chunk with a second
    session; with spinning off, 275 either way). A block starts after `SETTLE_S`, long enough for
    the others' threads to sleep, and one untimed chunk; two rounds, the second in reverse order,
    spread a noisy moment of the machine over every contender.
    """
    states = {key: loop.prefill(prompts) for key, loop in loops.items()}
    best = dict.fromkeys(loops, math.inf)
    order = list(loops)
    for round_order in (order, order[::-1]):
        for key in round_order:
            time.sleep(SETTLE_S)
            _, _, states[key] = loops[key].decode(states[key], chunk)
            for _ in range(max(1, repeats // 2)):
                seconds, _, states[key] = loops[key].decode(states[key], chunk)
                best[key] = min(best[key], seconds)
    return best


def genai_model(name: str, hf_dir: Path) -> Path:
    """onnxruntime-genai's own export of the same weights (its venv is created on first use)."""
    python = GENAI_VENV / "bin" / "python"
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(GENAI_VENV)], check=True)
        # `make dev` makes it; the same pins (requirements-genai.txt) when the bench runs first.
        requirements = str(ROOT / "requirements-genai.txt")
        subprocess.run([str(python), "-m", "pip", "install", "-q", "-r", requirements], check=True)
    out = decode_models.CACHE / name / "genai"
    if not (out / "genai_config.json").exists():
        builder = [str(python), "-P", "-m", "onnxruntime_genai.models.builder"]
        with tempfile.TemporaryDirectory(prefix="genai-build-") as cache:
            options = ["-i", str(hf_dir), "-o", str(out), "-p", "fp32", "-e", "cpu", "-c", cache]
            subprocess.run([*builder, *options], check=True, capture_output=True)
    # The lm service serves genai's folder as it comes (genai_config.json).
    return out


def genai_run(model_dir: Path, job: dict) -> dict:
    """bench/decode_genai.py in the genai venv (-P: bench/ must not shadow the standard library)."""
    done = subprocess.run(
        [str(GENAI_VENV / "bin" / "python"), "-P", str(ROOT / "bench" / "decode_genai.py")],
        input=json.dumps({**job, "model": str(model_dir)}),
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def bench_model(name: str, args, log_dir: Path) -> dict:
    hf_dir, fused_dir = decode_models.build(name, "fused")
    _, onnx_dir = decode_models.build(name, "concat")
    config = json.loads((hf_dir / "config.json").read_text())
    vocab = config["vocab_size"]
    prompt = np.random.default_rng(0).integers(3, vocab, (1, PROMPT_TOKENS))
    result: dict = {"model": name, "parameters": decode_models.parameters(name)}
    genai_dir = None
    if name.startswith("llama") and not args.no_genai:
        try:
            genai_dir = genai_model(name, hf_dir)
        except (subprocess.CalledProcessError, OSError) as exc:
            result["genai_error"] = f"{exc}: {str(getattr(exc, 'stderr', ''))[-400:]}"
    service = ServiceLoop(onnx_dir, args.threads, log_dir)
    loops = {
        "bare": BareLoop(onnx_dir, args.threads),
        "service": service,
        "iobinding": IoBindingLoop(onnx_dir, args.threads),
        "fused": SharedBufferLoop(fused_dir, args.threads),
        "service_fused": ServiceLoop(fused_dir, args.threads, log_dir),
    }
    services = [service, loops["service_fused"]]
    if genai_dir is not None:
        loops["shared"] = SharedBufferLoop(genai_dir, args.threads)
        loops["service_shared"] = ServiceLoop(genai_dir, args.threads, log_dir)
        services.append(loops["service_shared"])
    torch_loop = TorchLoop(hf_dir)
    try:
        # Same weights, same greedy tokens? (Random weights leave near-ties, so float noise may flip one.)
        tokens = {k: loop.decode(loop.prefill(prompt), args.check_steps)[1][0] for k, loop in loops.items()}
        tokens["transformers"] = torch_loop.decode(prompt, args.check_steps)[1][0]
        result["tokens_equal"] = {k: t == tokens["bare"] for k, t in tokens.items() if k != "bare"}
        seconds = fastest_chunks(loops, prompt, args.chunk, args.repeats)
        # Apart: torch's OpenMP threads spin after each call and would slow whoever runs next.
        seconds.update(fastest_chunks({"transformers": torch_loop}, prompt, args.chunk, args.repeats))
        result["tokens_per_s"] = {k: args.chunk / s for k, s in seconds.items()}

        if not name.endswith("tiny"):
            batch_loops = {k: loops[k] for k in ("bare", "service", "service_fused", "service_shared") if k in loops}
            result["batch_tokens_per_s"] = {}
            for b in BATCHES:
                seconds = fastest_chunks(batch_loops, np.repeat(prompt, b, 0), args.chunk, args.repeats)
                result["batch_tokens_per_s"][b] = {k: b * args.chunk / s for k, s in seconds.items()}

        studied = config.get("max_position_embeddings", 0) > max(PASTS) + args.chunk * args.repeats
        if studied:
            result.update(past_study(loops, vocab, args))
        if genai_dir is not None:
            job = {
                "prompt": prompt[0].tolist(),
                "check_steps": args.check_steps,
                "chunk": args.chunk,
                "repeats": args.repeats,
                "vocab": vocab,
                "pasts": list(PASTS) if studied else [],
                "batches": list(BATCHES),
                "prefill": 1024 if studied else 0,
            }
            try:
                result["genai"] = genai_run(genai_dir, job)
                result["tokens_per_s"]["genai"] = result["genai"]["tokens_per_s"]
                result["tokens_equal"]["genai"] = result["genai"]["tokens"] == tokens["bare"]
            except (subprocess.CalledProcessError, OSError, ValueError) as exc:
                result["genai_error"] = f"{exc}: {str(getattr(exc, 'stderr', ''))[-400:]}"
    finally:
        for running in services:
            running.close()
    return result


# Our precisions beside the llama.cpp type of the same weights.
LLAMA_CPP_TYPES = {"fp32": "F32", "int8": "Q8_0", "int4": "Q4_0"}
VERSUS_PASTS = (64, 1000)
VERSUS_BATCHES = (1, 8)


def versus_llama_cpp(name: str, args, log_dir: Path) -> dict:
    """Our fused export of a bench model in each precision against llama.cpp on the same weights (versus_rounds)."""
    hf_dir, _ = decode_models.build(name, "fused")
    vocab = json.loads((hf_dir / "config.json").read_text())["vocab_size"]
    rows: list[dict] = []
    for precision in args.precisions.split(","):
        quantize = None if precision == "fp32" else precision
        _, onnx_dir = decode_models.build(name, "fused", quantize)
        kind = LLAMA_CPP_TYPES[precision]

        def theirs(kind: str = kind) -> dict:
            return llama_cpp.run(name, args.threads, VERSUS_PASTS, VERSUS_BATCHES[1:], kinds=(kind,))[kind]

        rows += versus_rows(precision, kind, *versus_rounds(onnx_dir, vocab, theirs, args, log_dir))
    return {"llama_cpp": llama_cpp.SDIST, "rows": rows, "rounds": args.rounds}


def parse_ours(spec: str) -> tuple[str, Path]:
    """--ours TYPE=DIR -> ("Q4_1", Path(DIR)): our export beside llama.cpp's TYPE of the --gguf file."""
    kind, equals, folder = spec.partition("=")
    if not equals or not kind or not folder:
        raise argparse.ArgumentTypeError(f"--ours takes TYPE=DIR (e.g. q4_1=out/smollm2), not {spec!r}")
    return kind.upper(), Path(folder)


def versus_gguf(args, log_dir: Path) -> dict:
    """Each --ours folder against llama.cpp on the --gguf file in that folder's type (versus_rounds): the
    file itself where it is of that type, else llama-quantize's variant of it (llama_cpp.variant)."""
    binaries = llama_cpp.build()
    rows: list[dict] = []
    for kind, folder in args.ours:
        model = llama_cpp.variant(args.gguf, kind, binaries)
        vocab = json.loads((folder / "config.json").read_text())["vocab_size"]

        def theirs(model: Path = model) -> dict:
            return llama_cpp.speeds(binaries, model, args.threads, VERSUS_PASTS, VERSUS_BATCHES[1:])

        rows += versus_rows(folder.name, kind, *versus_rounds(folder, vocab, theirs, args, log_dir))
    return {"llama_cpp": llama_cpp.SDIST, "rows": rows, "rounds": args.rounds}


def versus_rounds(onnx_dir: Path, vocab: int, theirs, args, log_dir: Path) -> tuple[list[dict], list[dict]]:
    """Our fused export through the lm and as a bare loop, and llama.cpp (`theirs()`: one llama_cpp.speeds
    result of llama-bench at batch 1, llama-batched-bench at batch 8), on the same weights, in one run.

    The machine's memory bandwidth drifts by tens of percent over minutes (a 400 MB fp32 step reads
    29-42 GB/s from one minute to the next), so the two sides alternate: llama.cpp, ours, llama.cpp,
    ours, ..., llama.cpp, `--rounds` times ours; versus_rows compares each round with its neighbours.
    Prompts are random ids: greedy decoding never stops early, as no stop ids are sent.
    """
    rng = np.random.default_rng(2)
    theirs_runs = [theirs()]
    ours_runs = []
    service, stream = ServiceLoop(onnx_dir, args.threads, log_dir), StreamLoop(onnx_dir, args.threads, log_dir)
    # Greedy rows as the gateway runs them: args.burst steps per Decode over the stream.
    burst = StreamLoop(onnx_dir, args.threads, log_dir, burst=args.burst)
    loops = {
        "burst": burst, "stream": stream, "service": service, "bare": SharedBufferLoop(onnx_dir, args.threads),
    }  # fmt: skip
    try:
        for _ in range(args.rounds):
            ours = {}
            for batch in VERSUS_BATCHES:
                for past in VERSUS_PASTS if batch == 1 else VERSUS_PASTS[:1]:
                    prompts = np.repeat(rng.integers(3, vocab, (1, past)), batch, 0)
                    seconds = fastest_chunks(loops, prompts, args.chunk, args.repeats)
                    ours[batch, past] = {k: batch * args.chunk / s for k, s in seconds.items()}
            ours_runs.append(ours)
            # Our sessions stay loaded but idle while llama.cpp runs (their pools sleep after SETTLE_S).
            time.sleep(SETTLE_S)
            theirs_runs.append(theirs())
    finally:
        service.close()
        stream.close()
        burst.close()
    return ours_runs, theirs_runs


def versus_rows(precision: str, kind: str, ours_runs: list[dict], theirs_runs: list[dict]) -> list[dict]:
    """Rows of the llama.cpp table from rounds of ours (`ours_runs[i][batch, past][contender]`: tokens/s)
    and the llama.cpp runs around them (`theirs_runs[i]`: llama_cpp.run's result; one more than ours:
    run i came before our round i, run i + 1 after it)."""

    def reference(run: dict, batch: int, past: int) -> float:
        return run["tg"][past] if batch == 1 else run["batched"][batch]

    rows = []
    for batch, past in ours_runs[0]:
        round_refs = [
            max(reference(before, batch, past), reference(after, batch, past))
            for before, after in itertools.pairwise(theirs_runs)
        ]
        rows.append(
            {
                "precision": precision,
                "llama_cpp_type": kind,
                "batch": batch,
                "past": past,
                "llama_cpp": max(reference(run, batch, past) for run in theirs_runs),
                **{k: max(run[batch, past][k] for run in ours_runs) for k in ours_runs[0][batch, past]},
                **{
                    f"{key}_round_ratios": [
                        run[batch, past][key] / ref for run, ref in zip(ours_runs, round_refs, strict=True)
                    ]
                    for key in ("burst", "stream")
                    if key in ours_runs[0][batch, past]
                },
            }
        )
    return rows


def past_study(loops: dict, vocab: int, args) -> dict:
    """Decode step time after prompts of several lengths, and the prefill of a 1,024-token prompt."""
    rng = np.random.default_rng(1)
    step_ms: dict[str, dict[int, float]] = {k: {} for k in loops}
    for past in PASTS:
        seconds = fastest_chunks(loops, rng.integers(3, vocab, (1, past)), args.chunk, args.repeats)
        for k, s in seconds.items():
            step_ms[k][past] = s / args.chunk * 1000
    prompt = rng.integers(3, vocab, (1, 1024))
    bare, service = loops["bare"], loops["service"]
    runs: dict[str, float] = {"bare": math.inf, "service": math.inf, "service forward": math.inf}
    for _ in range(max(2, args.repeats // 2)):
        started = time.perf_counter()
        bare.prefill(prompt)
        runs["bare"] = min(runs["bare"], time.perf_counter() - started)
        started = time.perf_counter()
        reply = service.prefill_reply(prompt)
        runs["service"] = min(runs["service"], time.perf_counter() - started)
        runs["service forward"] = min(runs["service forward"], reply.timing.forward_us / 1e6)
        service.stub.Clear(lm_pb2.ClearRequest(batch_ids=[reply.batch_id]))
    return {"step_ms": step_ms, "prefill_ms": {k: v * 1000 for k, v in runs.items()}}


def markdown(results: list[dict], args) -> str:
    columns = [k for k in NAMES if k != "bare"]
    if args.only_versus or args.gguf:
        return _versus_markdown(results, args, [])
    lines = [
        f"### Single stream, greedy: decode tokens/s (fastest {args.chunk}-step chunk; ratio to the bare loop)",
        "",
    ]
    lines += ["| model | params | bare ORT loop | " + " | ".join(NAMES[k] for k in columns) + " | same tokens |"]
    lines += ["|---|---|---|" + "---|" * (len(columns) + 1)]
    for r in (r for r in results if "tokens_per_s" in r):
        t = r["tokens_per_s"]
        cells = [f"{t[k]:.1f} ({t[k] / t['bare']:.2f}x)" if k in t else "n/a" for k in columns]
        same = ", ".join(f"{k}: {'yes' if v else 'NO'}" for k, v in r["tokens_equal"].items())
        row = [r["model"], f"{r['parameters'] / 1e6:.1f}M", f"{t['bare']:.1f}", *cells, same]
        lines.append("| " + " | ".join(row) + " |")

    lines += ["", "### Batch decode: tokens/s summed over rows (ratio to batch 1 of the same loop)", ""]
    lines += ["| model | loop | " + " | ".join(f"batch {b}" for b in BATCHES) + " |"]
    lines += ["|---|---|" + "---|" * len(BATCHES)]
    for r in results:
        rows = r.get("batch_tokens_per_s")
        if not rows:
            continue
        for key in [k for k in ("service", "service_fused", "service_shared", "bare") if k in rows[1]]:
            cells = [f"{rows[b][key]:.1f} ({rows[b][key] / rows[1][key]:.2f}x)" for b in BATCHES]
            lines.append(f"| {r['model']} | {NAMES[key]} | " + " | ".join(cells) + " |")
        genai_batches = r.get("genai", {}).get("batch_tokens_per_s")
        if genai_batches:
            one = genai_batches["1"]
            cells = [f"{genai_batches[str(b)]:.1f} ({genai_batches[str(b)] / one:.2f}x)" for b in BATCHES]
            lines.append(f"| {r['model']} | {NAMES['genai']} | " + " | ".join(cells) + " |")

    for r in results:
        if "step_ms" not in r:
            continue
        g, s = r.get("genai", {}), r["step_ms"]
        keys = [k for k in NAMES if k in s]
        lines += ["", f"### {r['model']}: decode step ms after a prompt of N tokens (batch 1)", ""]
        lines += ["| N | " + " | ".join(NAMES[k] for k in keys) + " | onnxruntime-genai |"]
        lines += ["|---|" + "---|" * (len(keys) + 1)]
        for past in PASTS:
            genai_ms = f"{g['step_ms'][str(past)]:.1f}" if g.get("step_ms") else "n/a"
            lines.append(f"| {past} | " + " | ".join(f"{s[k][past]:.1f}" for k in keys) + f" | {genai_ms} |")
        p = r["prefill_ms"]
        genai_prefill = f", onnxruntime-genai {g['prefill_ms']:.0f} ms" if g.get("prefill_ms") else ""
        lines += [
            "",
            f"Prefill of a 1,024-token prompt ({r['model']}): bare {p['bare']:.0f} ms, lm over gRPC "
            f"{p['service']:.0f} ms (forward {p['service forward']:.0f} ms){genai_prefill}.",
        ]
    return _versus_markdown(results, args, lines)


def _versus_markdown(results: list[dict], args, lines: list[str]) -> str:
    for r in results:
        if "versus" not in r:
            continue
        lines += [
            "",
            f"### {r['model']}: against llama.cpp on the same weights ({r['versus']['llama_cpp']} vendor, "
            f"{args.threads} threads; decode tokens/s summed over rows, ratio to llama.cpp; ours: fastest "
            f"{args.chunk}-step chunk, llama.cpp: fastest llama-bench repetition; {args.rounds} round(s) of ours "
            "between llama.cpp runs, each side's fastest over all)",
            "",
        ]
        lines += [
            f"| ours | llama.cpp | batch | past | llama.cpp | lm over gRPC, greedy bursts of {args.burst} | "
            "lm over gRPC, BatchSteps stream | lm over gRPC, unary Decode | bare loop | "
            "bursts / llama.cpp, each round | stream / llama.cpp, each round |",
            "|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for row in r["versus"]["rows"]:
            ref = row["llama_cpp"]
            cells = [
                f"{row[k]:.1f} ({row[k] / ref:.2f}x)" if k in row else ""
                for k in ("burst", "stream", "service", "bare")
            ]
            for key in ("burst", "stream"):
                cells.append(", ".join(f"{ratio:.2f}x" for ratio in row.get(f"{key}_round_ratios", [])))
            lines.append(
                f"| {row['precision']} | {row['llama_cpp_type']} | {row['batch']} | {row['past']} | "
                f"{ref:.1f} | " + " | ".join(cells) + " |"
            )
    for r in results:
        if "genai_error" in r:
            lines += ["", f"{r['model']}: onnxruntime-genai did not run: {r['genai_error']}"]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default=",".join(decode_models.MODELS), help="comma-separated")
    parser.add_argument("--chunk", type=int, default=16, help="decode steps per timed chunk")
    parser.add_argument("--repeats", type=int, default=8, help="timed chunks per contender (the fastest counts)")
    parser.add_argument("--check-steps", type=int, default=32, help="greedy steps compared across contenders")
    parser.add_argument("--threads", type=int, default=0, help="onnxruntime intra-op threads (0: its default)")
    parser.add_argument("--no-genai", action="store_true")
    parser.add_argument("--only-versus", action="store_true", help="only the llama.cpp comparison")
    parser.add_argument("--llama-cpp", action="store_true", help="also time llama.cpp (builds it once: minutes)")
    parser.add_argument("--precisions", default="fp32,int8,int4", help="ours against llama.cpp, comma-separated")
    parser.add_argument("--burst", type=int, default=8, help="greedy steps per Decode of the burst contender")
    parser.add_argument("--rounds", type=int, default=1, help="versus: rounds of ours, each between two llama.cpp runs")
    parser.add_argument(
        "--gguf", type=Path, help="a GGUF file: only each --ours export against llama.cpp on it (no bench models)"
    )
    parser.add_argument(
        "--ours",
        type=parse_ours,
        action="append",
        default=[],
        metavar="TYPE=DIR",
        help="with --gguf: our export of the file, timed against llama.cpp's TYPE of it (F32, Q8_0, Q4_0, the "
        "file's own type...; other than the file's own, made with llama-quantize); repeat per precision",
    )
    parser.add_argument("--json", type=Path, help="also write the raw figures here")
    args = parser.parse_args()
    if bool(args.gguf) != bool(args.ours):
        parser.error("--gguf and --ours go together")
    # Stopped with SIGTERM, the bench still runs its cleanups (the lm processes it started end with it).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    results = []
    with tempfile.TemporaryDirectory(prefix="muestra-bench-") as log_dir:
        if args.gguf:
            print(f"[bench] {args.gguf.name} ...", file=sys.stderr, flush=True)
            results.append({"model": args.gguf.name, "versus": versus_gguf(args, Path(log_dir))})
        for name in [] if args.gguf else args.models.split(","):
            print(f"[bench] {name} ...", file=sys.stderr, flush=True)
            result = {"model": name} if args.only_versus else bench_model(name, args, Path(log_dir))
            if (args.llama_cpp or args.only_versus) and name.startswith("llama") and not name.endswith("tiny"):
                result["versus"] = versus_llama_cpp(name, args, Path(log_dir))
            results.append(result)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2, default=str))
    print(markdown(results, args))


if __name__ == "__main__":
    main()

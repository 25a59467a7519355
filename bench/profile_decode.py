"""Where a decode step's time goes: onnxruntime's profiler on the fused export, per precision.

    .venv/bin/python bench/profile_decode.py                      # llama-100m, fp32, int8, int4
    .venv/bin/python bench/profile_decode.py --models gpt2-124m --precisions fp32
    .venv/bin/python bench/profile_decode.py --model-dirs models/smollm2-135m-instruct,OTHER --repeats 5 --no-service

For each precision of the bench model (bench/decode_models.py, fused layout, batch 1, a 64-token
past) it reports, from one run:
- the step's wall time in a bare shared-buffer loop and the sum of the kernels onnxruntime timed;
- the time per operator type (MatMul, MatMulNBits, GroupQueryAttention, ...), its share, and the
  number of kernel calls per step: what is left between the kernels' sum and the wall time is
  dispatch (onnxruntime's executor between kernels);
- the bytes of weights one step reads and the bandwidth that takes, against this machine's memory
  bandwidth measured in the same run (numpy reading a 1 GiB array on `--threads` threads): how close the matrix
  multiplications are to the bandwidth limit;
- the lm over gRPC: its round trip per step, the call's time inside the lm and the forward time
  the lm reports (the lm's bookkeeping between them, gRPC and the client outside).

`--model-dirs` profiles exported folders as they are instead (the default model, a rebuilt one beside
an old copy); `--repeats` runs them in turn that many times, so that a busy machine slows each alike,
and reports each figure's median with the step wall time also measured with the profiler off. A GGUF
import's Q4_1 offsets (gguf_weights.OFFSET_NODES) get a line of their own: their time and share.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:] = [str(ROOT), *(p for p in sys.path if Path(p or ".").resolve() != ROOT / "bench")]

import argparse  # noqa: E402
import collections  # noqa: E402
import json  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from concurrent.futures import ThreadPoolExecutor  # noqa: E402

import numpy as np  # noqa: E402
import onnx  # noqa: E402
import onnxruntime as ort  # noqa: E402

from bench import decode_models  # noqa: E402
from bench.decode_loops import ServiceLoop, SharedBufferLoop  # noqa: E402
from muestra.lm.export.gguf_weights import OFFSET_NODES  # noqa: E402
from muestra.v1 import lm_pb2  # noqa: E402

PAST = 64


def memory_bandwidth_gbs(threads: int = 1, repeats: int = 5) -> float:
    """GB/s of numpy summing a 1 GiB float32 array, split across `threads` Python threads (numpy
    releases the GIL while it sums), the best of `repeats`."""
    data = np.ones(1 << 28, np.float32)
    parts = np.array_split(data, max(threads, 1))
    best = float("inf")
    with ThreadPoolExecutor(len(parts)) as pool:
        for _ in range(repeats):
            started = time.perf_counter()
            list(pool.map(np.sum, parts))
            best = min(best, time.perf_counter() - started)
    return data.nbytes / best / 1e9


def weight_bytes(onnx_dir: Path) -> int:
    """Bytes of the initializers (weights) a step reads: every one, once, but a table only gathered
    (an embedding reads one row; a tied fp32 vocabulary projection reads the table whole and counts)
    and one MatMuls share (each MatMul reads its own copy: onnxruntime prepacks a constant B per node)."""
    model = onnx.load(str(onnx_dir / "model.onnx"), load_external_data=False)
    readers: dict[str, list[str]] = collections.defaultdict(list)
    for node in model.graph.node:
        for name in node.input:
            readers[name].append(node.op_type)
    total = 0
    for tensor in model.graph.initializer:
        if set(readers[tensor.name]) == {"Gather"}:  # an embedding table only gathered (a quantized head reads its own)
            continue
        copies = max(1, readers[tensor.name].count("MatMul"))
        size = int(np.prod(tensor.dims)) if tensor.dims else 1
        if tensor.data_location == onnx.TensorProto.EXTERNAL:
            length = next((int(e.value) for e in tensor.external_data if e.key == "length"), 0)
            total += copies * length
        else:
            total += copies * size * onnx.helper.tensor_dtype_to_np_dtype(tensor.data_type).itemsize
    return total


def profiled_steps(onnx_dir: Path, threads: int, steps: int, vocab: int) -> tuple[dict, float, int, float]:
    """({op type: (microseconds per step, kernel calls per step)}, wall ms per step, kernels per step,
    microseconds per step in the nodes that add Q4_1 offsets)."""
    loop = SharedBufferLoop(onnx_dir, threads)
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.intra_op_num_threads = threads
    with tempfile.TemporaryDirectory(prefix="muestra-profile-") as scratch:
        options.enable_profiling = True
        options.profile_file_prefix = str(Path(scratch) / "step")
        loop.session = ort.InferenceSession(str(onnx_dir / "model.onnx"), options, providers=["CPUExecutionProvider"])
        loop.binding = loop.session.io_binding()
        prompt = np.random.default_rng(0).integers(3, vocab, (1, PAST))
        state = loop.prefill(prompt)
        loop.decode(state, 4)  # warm
        seconds, _, _ = loop.decode(state, steps)
        trace = json.loads(Path(loop.session.end_profiling()).read_text())
    runs = [e for e in trace if e.get("cat") == "Session" and e["name"] == "model_run"]
    kernels = [e for e in trace if e.get("cat") == "Node" and e["name"].endswith("_kernel_time")]
    # The last `steps` runs are the timed decode steps; keep the kernels inside them.
    timed = runs[-steps:]
    start, end = timed[0]["ts"], timed[-1]["ts"] + timed[-1]["dur"]
    inside = [k for k in kernels if start <= k["ts"] <= end]
    per_op: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0])
    offsets_us = 0.0
    for kernel in inside:
        entry = per_op[kernel["args"]["op_name"]]
        entry[0] += kernel["dur"]
        entry[1] += 1
        node = kernel["name"].removesuffix("_kernel_time")
        if "/gguf_q4_1/" in node and node.rsplit("/", 1)[-1] in OFFSET_NODES:
            offsets_us += kernel["dur"]
    table = {op: (us / steps, calls / steps) for op, (us, calls) in per_op.items()}
    return table, seconds / steps * 1000, len(inside) // steps, offsets_us / steps


def bare_step_ms(onnx_dir: Path, threads: int, steps: int, vocab: int) -> float:
    """Wall ms per decode step of the shared-buffer loop with the profiler off."""
    loop = SharedBufferLoop(onnx_dir, threads)
    state = loop.prefill(np.random.default_rng(0).integers(3, vocab, (1, PAST)))
    loop.decode(state, 4)  # warm
    seconds, _, _ = loop.decode(state, steps)
    return seconds / steps * 1000


def service_overhead(onnx_dir: Path, threads: int, steps: int, vocab: int, log_dir: Path) -> tuple[float, float, float]:
    """(round-trip ms per step through the lm over gRPC, the call's ms inside the lm, the forward's
    ms the lm reports), medians of `steps` steps."""
    service = ServiceLoop(onnx_dir, threads, log_dir)
    try:
        prompt = np.random.default_rng(0).integers(3, vocab, (1, PAST))
        batch_id, token = service.prefill(prompt)
        trips, inside, forwards = [], [], []
        for _ in range(steps):
            started = time.perf_counter()
            reply = service.stub.Decode(
                lm_pb2.DecodeRequest(batches=[lm_pb2.DecodeBatch(batch_id=batch_id, next_ids=token)])
            )
            trip = time.perf_counter() - started
            batch_id, token = reply.batch_id, [r.argmax for r in reply.output.rows]
            trips.append(trip * 1000)
            inside.append(reply.timing.total_us / 1000)
            forwards.append(reply.timing.forward_us / 1000)
        return float(np.median(trips)), float(np.median(inside)), float(np.median(forwards))
    finally:
        service.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="llama-100m")
    parser.add_argument("--precisions", default="fp32,int8,int4")
    parser.add_argument("--model-dirs", help="exported folders to profile as they are, comma-separated")
    parser.add_argument("--repeats", type=int, default=1, help="profile the folders in turn this many times")
    parser.add_argument("--no-service", action="store_true", help="leave out the lm over gRPC")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--steps", type=int, default=32)
    args = parser.parse_args()
    if args.model_dirs:
        targets = [(folder, Path(folder)) for folder in args.model_dirs.split(",")]
    else:
        targets = []
        for name in args.models.split(","):
            for precision in args.precisions.split(","):
                quantize = None if precision == "fp32" else precision
                targets.append((f"{name} {precision}", decode_models.build(name, "fused", quantize)[1]))
    bandwidth = memory_bandwidth_gbs(args.threads)
    lines = [
        f"Memory bandwidth (numpy sum of a 1 GiB array on {args.threads} threads, same run): {bandwidth:.1f} GB/s",
        "",
    ]
    runs: dict[str, list[dict]] = collections.defaultdict(list)
    with tempfile.TemporaryDirectory(prefix="muestra-profile-logs-") as log_dir:
        for repeat in range(args.repeats):
            for label, onnx_dir in targets:
                runs[label].append(profile(onnx_dir, args, Path(log_dir)))
                print(f"[profile] {label} done ({repeat + 1}/{args.repeats})", file=sys.stderr, flush=True)
    for label, onnx_dir in targets:
        lines += report(label, onnx_dir, runs[label], args, bandwidth)
    print("\n".join(lines))


def profile(onnx_dir: Path, args, log_dir: Path) -> dict:
    """One run's figures for one folder: the profiled steps, the bare steps and the lm over gRPC."""
    vocab = json.loads((onnx_dir / "config.json").read_text())["vocab_size"]
    table, wall_ms, kernel_calls, offsets_us = profiled_steps(onnx_dir, args.threads, args.steps, vocab)
    run = {"table": table, "wall_ms": wall_ms, "calls": kernel_calls, "offsets_ms": offsets_us / 1000}
    run["bare_ms"] = bare_step_ms(onnx_dir, args.threads, args.steps, vocab)
    if not args.no_service:
        run["service"] = service_overhead(onnx_dir, args.threads, args.steps, vocab, log_dir)
    return run


def report(label: str, onnx_dir: Path, runs: list[dict], args, bandwidth: float) -> list[str]:
    """Markdown for one folder: each figure the median of its runs."""

    def median(values) -> float:
        return float(np.median(list(values)))

    ops = {op for run in runs for op in run["table"]}
    table = {op: tuple(median(run["table"].get(op, (0.0, 0))[i] for run in runs) for i in (0, 1)) for op in ops}
    wall_ms, bare_ms = median(r["wall_ms"] for r in runs), median(r["bare_ms"] for r in runs)
    kernel_calls = int(median(r["calls"] for r in runs))
    offsets_ms = median(r["offsets_ms"] for r in runs)
    weights = weight_bytes(onnx_dir)
    kernels_ms = sum(us for us, _ in table.values()) / 1000
    floor_ms = weights / bandwidth / 1e6
    runs_note = f", medians of {len(runs)} runs taken in turn with the other folders" if len(runs) > 1 else ""
    lines = [
        f"### {label}: batch 1, past {PAST}, {args.threads} threads{runs_note}",
        "",
        f"- step wall time with the profiler off: {bare_ms:.2f} ms (bare shared-buffer loop, {args.steps} steps)",
        f"- step wall time (profiler on): {wall_ms:.2f} ms; kernels' sum "
        f"{kernels_ms:.2f} ms in {kernel_calls} kernel calls; between kernels (dispatch) "
        f"{wall_ms - kernels_ms:.2f} ms ({(wall_ms - kernels_ms) / kernel_calls * 1000:.1f} us a call)",
        f"- weights read per step: {weights / 1e6:.1f} MB; at {bandwidth:.1f} GB/s: {floor_ms:.2f} ms "
        f"(the step is {bare_ms / floor_ms:.2f}x the bandwidth floor)",
    ]
    if offsets_ms:
        lines.append(
            f"- Q4_1 offsets ({', '.join(OFFSET_NODES)} nodes): {offsets_ms:.2f} ms a step, "
            f"{offsets_ms / kernels_ms:.1%} of the kernels' sum, {offsets_ms / wall_ms:.1%} of the profiled step"
        )
    if "service" in runs[0]:
        trip_ms, inside_ms, forward_ms = (median(r["service"][i] for r in runs) for i in range(3))
        lines.append(
            f"- lm over gRPC (medians): {trip_ms:.2f} ms a step round trip; inside the lm {inside_ms:.2f} ms, "
            f"of which the forward {forward_ms:.2f} ms: the lm's bookkeeping {inside_ms - forward_ms:.2f} ms, "
            f"gRPC and the client {trip_ms - inside_ms:.2f} ms"
        )
    lines += ["", "| operator | ms a step | share of kernels | calls a step |", "|---|---|---|---|"]
    for op, (us, calls) in sorted(table.items(), key=lambda item: -item[1][0]):
        lines.append(f"| {op} | {us / 1000:.3f} | {us / 1000 / kernels_ms:.1%} | {calls:.0f} |")
    return [*lines, ""]


if __name__ == "__main__":
    main()

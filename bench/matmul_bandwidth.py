"""How fast onnxruntime's CPU MatMul reads a decode step's fp32 weights, with nothing else in the graph.

    .venv/bin/python -P bench/matmul_bandwidth.py [--model llama-100m] [--threads 2] [--runs 40]

A graph of only the MatMuls one batch-1 decode step of a bench model runs (its q/k/v, o, gate/up and
down projections in every layer, merged as our fused export merges them, and the vocabulary projection),
random fp32 weights, one input row. Prints the fastest and the median run as GB/s of weights read, next
to numpy's read bandwidth in the same run (bench/profile_decode.py's). The fastest run against a whole
decode step (bench/profile_decode.py) says what the rest of the graph costs; against llama.cpp's F32
tokens/s times the weight bytes it says whether the kernels or the machine set the pace.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:] = [str(ROOT), *(p for p in sys.path if Path(p or ".").resolve() != ROOT / "bench")]

import numpy as np  # noqa: E402
import onnx  # noqa: E402
import onnxruntime as ort  # noqa: E402
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from bench import decode_models  # noqa: E402
from bench.profile_decode import memory_bandwidth_gbs  # noqa: E402


def step_shapes(config: dict) -> list[tuple[int, int]]:
    """(K, N) of every MatMul in one decode step of a Llama-like config, as the fused export merges them."""
    hidden, inner = config["hidden_size"], config["intermediate_size"]
    head_dim = config.get("head_dim") or hidden // config["num_attention_heads"]
    q, kv = config["num_attention_heads"] * head_dim, config["num_key_value_heads"] * head_dim
    layer = [(hidden, q + 2 * kv), (q, hidden), (hidden, 2 * inner), (inner, hidden)]
    return layer * config["num_hidden_layers"] + [(hidden, config["vocab_size"])]


def matmul_graph(shapes: list[tuple[int, int]], path: Path) -> dict[str, np.ndarray]:
    """Write the MatMul-only graph to `path`; return a feed (one row per distinct K)."""
    rng = np.random.default_rng(0)
    widths = sorted({k for k, _ in shapes})
    inputs = [helper.make_tensor_value_info(f"x{k}", TensorProto.FLOAT, [1, k]) for k in widths]
    nodes, weights, outputs = [], [], []
    for i, (k, n) in enumerate(shapes):
        weights.append(numpy_helper.from_array((rng.standard_normal((k, n)) * 0.02).astype(np.float32), f"w{i}"))
        nodes.append(helper.make_node("MatMul", [f"x{k}", f"w{i}"], [f"y{i}"]))
        outputs.append(helper.make_tensor_value_info(f"y{i}", TensorProto.FLOAT, None))
    graph = helper.make_graph(nodes, "matmuls", inputs, outputs, weights)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    onnx.save(model, str(path), save_as_external_data=True)
    return {f"x{k}": rng.standard_normal((1, k)).astype(np.float32) for k in widths}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="llama-100m", choices=[m for m in decode_models.MODELS if "llama" in m])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--runs", type=int, default=40)
    args = parser.parse_args()
    hf_dir, _ = decode_models.build(args.model, "fused")
    shapes = step_shapes(json.loads((hf_dir / "config.json").read_text()))
    total = sum(k * n * 4 for k, n in shapes)
    with tempfile.TemporaryDirectory(prefix="matmul-bandwidth-") as tmp:
        feed = matmul_graph(shapes, Path(tmp) / "matmuls.onnx")
        options = ort.SessionOptions()
        options.intra_op_num_threads = args.threads
        session = ort.InferenceSession(str(Path(tmp) / "matmuls.onnx"), options, providers=["CPUExecutionProvider"])
        for _ in range(3):
            session.run(None, feed)
        seconds = []
        for _ in range(args.runs):
            started = time.perf_counter()
            session.run(None, feed)
            seconds.append(time.perf_counter() - started)
    bandwidth = memory_bandwidth_gbs(args.threads)
    fastest, median = min(seconds), statistics.median(seconds)
    print(
        f"{args.model}: {len(shapes)} MatMuls, {total / 1e6:.1f} MB of fp32 weights a step, {args.threads} threads, "
        f"{args.runs} runs (onnxruntime {ort.__version__})\n"
        f"- MatMuls only: fastest {fastest * 1e3:.2f} ms ({total / fastest / 1e9:.1f} GB/s), "
        f"median {median * 1e3:.2f} ms ({total / median / 1e9:.1f} GB/s)\n"
        f"- numpy reading a 1 GiB array, same run: {bandwidth:.1f} GB/s"
    )


if __name__ == "__main__":
    main()

"""Is a row's logits independent of the other rows in its lm batch? Bitwise, step by step.

    .venv/bin/python bench/batch_invariance.py                          # the tiny text fixture
    .venv/bin/python bench/batch_invariance.py --model DIR --steps 40 --threads 1 --no-opt
    .venv/bin/python bench/batch_invariance.py --model models/smollm2-135m-instruct --cost   # what it costs

A target row (a fixed prompt, then fixed next tokens, so every run feeds it the same ids) is
driven through the lm Engine in several batch situations; its logits after the prefill and after
each decode step are compared with the target decoded alone: how many of the steps are bitwise
equal, and the largest absolute difference. Neighbours get random prompts and tokens.

The lm runs a row-invariant graph where the model needs one (muestra.lm.row_pad: one-row steps of the default
model's 4-bit layers take the several-row kernels); --plain loads the graph as it is, to see the difference.
--cost times decode steps of 1, 2 and 8 rows (after 64-token prompts) on the graph as it is, on the padded graph,
and on the padded graph with lone steps padded too (DecodeRequest.row_invariant), in turns, best of --rounds; then
streams through the whole stack (bench.stack): 1 and 8 streams with a seed (their lone steps padded) and without.

A second table runs single-operator graphs (the ones a Llama step is made of) to show where
variance can come from: a MatMul row with M-1 other rows beside it (the linear layers), and the
attention's probs x V MatMul, Softmax and ReduceSum (what onnxruntime runs for a float16 Softmax,
which has no CPU kernel) with `pad` masked leading positions (left padding).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# Run as a script, bench/ would come first on sys.path, where a module may shadow the standard library's.
sys.path[:] = [str(ROOT), *(p for p in sys.path if Path(p or ".").resolve() != ROOT / "bench")]

import numpy as np  # noqa: E402
import onnxruntime as ort  # noqa: E402

from muestra.lm.engine import DecodeInput, Engine, PrefillInput  # noqa: E402
from muestra.lm.model import OnnxDecoder  # noqa: E402

SPEC = (0, 0)  # OUTPUT_KIND_UNSPECIFIED: full logits


def load(model: Path, threads: int, optimize: bool, row_invariant: bool = True) -> Engine:
    decoder = OnnxDecoder(model, providers="cpu", intra_op_threads=threads, row_invariant=row_invariant)
    if not optimize:
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        if threads > 0:
            options.intra_op_num_threads = threads
        decoder.session = ort.InferenceSession(str(model / "model.onnx"), options, providers=["CPUExecutionProvider"])
        decoder._binding = None
    return Engine(decoder, max_batch_rows=64, kv_budget_bytes=1 << 36, max_top_n=16)


class Target:
    """Runs the target row (always row 0) through one batch situation; returns its logits per step."""

    def __init__(self, engine: Engine, prompt: np.ndarray, ids: np.ndarray, seed: int) -> None:
        self.engine, self.prompt, self.ids = engine, prompt, ids
        self.rng = np.random.default_rng(seed)
        self.vocab = engine.info.vocab_size

    def _tokens(self, n: int) -> np.ndarray:
        return self.rng.integers(3, self.vocab, n).astype(np.int64)

    def _prefill(self, prompts: list[np.ndarray]) -> tuple[str, np.ndarray]:
        result = self.engine.prefill([PrefillInput(f"r{i}", p, SPEC) for i, p in enumerate(prompts)])
        return result.batch_id, result.logits

    def run(self, with_=(), alone_after_prefill=False, joins=None, leaves=None) -> list[np.ndarray]:
        """`with_`: neighbour prompt lengths in the target's prefill; `joins[step]`: lengths of rows
        prefilled apart and joined at that step (Engine.decode of two batches); `leaves[step]`: how
        many neighbours stay after that step (the longest ones leave, through Engine.filter)."""
        joins, leaves = joins or {}, leaves or {}
        batch, logits = self._prefill([self.prompt] + [self._tokens(n) for n in with_])
        out = [logits[0]]
        if alone_after_prefill:
            batch, _ = self.engine.filter(batch, [0])
        for step in range(len(self.ids)):
            rows = self.engine.batches[batch].rows
            items = [DecodeInput(batch, np.concatenate([self.ids[step : step + 1], self._tokens(rows - 1)]), None)]
            if step in joins:
                joined, _ = self._prefill([self._tokens(n) for n in joins[step]])
                items.append(DecodeInput(joined, self._tokens(len(joins[step])), None))
            result = self.engine.decode(items, row_invariant=True)  # as for a seeded request
            batch = result.batch_id
            out.append(result.logits[0])
            if step in leaves:
                lengths = self.engine.batches[batch].lengths
                keep = sorted(range(1, len(lengths)), key=lambda r: lengths[r])[: leaves[step]]
                batch, _ = self.engine.filter(batch, [0, *keep])
        self.engine.clear([])
        return out


def scenarios(length: int, steps: int) -> dict[str, dict]:
    q = steps // 4
    return {
        "(a) alone again (replay)": {},
        "(b) 7 neighbours, same length": {"with_": [length] * 7},
        "(c) 7 longer neighbours, lengths +4k": {"with_": [length + 4 * k for k in range(1, 8)]},
        "(c) 7 longer neighbours": {"with_": [length + k for k in (1, 2, 3, 5, 9, 14, 30)]},
        "(c) 7 shorter neighbours": {"with_": [max(1, length - k) for k in (1, 2, 3, 5, 9, 14, 17)]},
        "(c) joins and leaves (decode only)": {
            "alone_after_prefill": True,
            "joins": {0: [3, 9, 17], q: [length + 11, 60], 3 * q: [2]},
            "leaves": {2 * q: 2},
        },
        "(d) prefill padded, decode alone": {"with_": [length + k for k in (1, 2, 3, 7)], "alone_after_prefill": True},
        "(d) prefill beside shorter, decode alone": {"with_": [3, 7, 10], "alone_after_prefill": True},
    }


def compare(ref: list[np.ndarray], got: list[np.ndarray]) -> tuple[int, float, int]:
    """Bitwise-equal steps, max |diff|, first step that differs (-1: none)."""
    diffs = [float(np.abs(a.astype(np.float64) - b).max()) for a, b in zip(ref, got, strict=True)]
    equal = [np.array_equal(a, b) for a, b in zip(ref, got, strict=True)]
    return sum(equal), max(diffs), equal.index(False) if not all(equal) else -1


def model_table(args: argparse.Namespace) -> None:
    engine = load(args.model, args.threads, not args.no_opt, not args.plain)
    info = engine.info
    rng = np.random.default_rng(args.seed)
    prompt = rng.integers(3, info.vocab_size, args.length).astype(np.int64)
    ids = rng.integers(3, info.vocab_size, args.steps).astype(np.int64)
    target = Target(engine, prompt, ids, args.seed + 1)
    print(
        f"model {args.model} ({info.layout}, {engine.decoder.storage_cls.__name__}, rows padded: "
        f"{engine.decoder.row_pads}), threads "
        f"{args.threads or 'default'}, graph optimizations {'off' if args.no_opt else 'all'}; target prompt "
        f"{args.length} tokens, {args.steps} decode steps (+ the prefill)"
    )
    reference = target.run()
    print(f"{'situation':<42} {'bitwise equal':>13} {'max |diff|':>11} {'first diff':>10}")
    for name, plan in scenarios(args.length, args.steps).items():
        equal, diff, first = compare(reference, target.run(**plan))
        print(f"{name:<42} {equal:>6}/{len(reference):<6} {diff:>11.3g} {first if first >= 0 else '-':>10}")


def cost_table(args: argparse.Namespace) -> None:
    """ms per decode step: the graph as it is, padded, and padded with lone steps padded too, in turns."""
    plain, padded = load(args.model, args.threads, True, False), load(args.model, args.threads, True, True)
    variants = {"as it is": (plain, False), "rows padded": (padded, False), "lone steps too": (padded, True)}
    rng = np.random.default_rng(args.seed)
    vocab = plain.info.vocab_size

    def timed(engine: Engine, rows: int, lone: bool) -> float:
        prompts = [PrefillInput(f"r{i}", rng.integers(3, vocab, 64).astype(np.int64), SPEC) for i in range(rows)]
        batch = engine.prefill(prompts).batch_id
        started = time.perf_counter()
        for _ in range(args.steps):
            step = DecodeInput(batch, rng.integers(3, vocab, rows).astype(np.int64), None)
            batch = engine.decode([step], row_invariant=lone).batch_id
        engine.clear([batch])
        return (time.perf_counter() - started) / args.steps * 1e3

    print(f"\nms per decode step ({args.steps} steps after 64-token prompts, best of {args.rounds}, in turns)")
    print(f"{'rows':>4} " + " ".join(f"{name:>15}" for name in variants) + "  ratios to 'as it is'")
    for rows in (1, 2, 8):
        best = dict.fromkeys(variants, float("inf"))
        for _ in range(args.rounds):
            for name, (engine, lone) in variants.items():
                best[name] = min(best[name], timed(engine, rows, lone))
        ratios = " ".join(f"{best[name] / best['as it is']:.3f}" for name in list(variants)[1:])
        print(f"{rows:>4} " + " ".join(f"{best[name]:>15.2f}" for name in variants) + f"  {ratios}")


def stack_cost_table(args: argparse.Namespace) -> None:
    """Streamed tokens/s through the whole stack (gateway, lm with --threads), the model's own chain, requests
    with a seed (their lone steps padded: --row-invariant seeded) against the same requests without one."""
    import asyncio
    import tempfile

    import grpc

    from bench.stack import LocalStack
    from muestra.v1 import gateway_pb2, gateway_pb2_grpc

    async def round_(stub, streams: int, seeded: bool, tokens: int) -> float:
        async def one(i: int) -> int:
            message = gateway_pb2.GenerateRequest(
                prompt=f"Story {i}: once upon a time", max_tokens=tokens, ignore_eos=True, disable_prefix_cache=True
            )
            if seeded:
                message.seed = i
            got = 0
            async for reply in stub.Generate(message, timeout=600):
                got += len(reply.delta.token_ids) if reply.HasField("delta") else 0
            return got

        started = time.perf_counter()
        counts = await asyncio.gather(*(one(i) for i in range(streams)))
        return sum(counts) / (time.perf_counter() - started)

    async def main(address: str) -> None:
        async with grpc.aio.insecure_channel(address) as channel:
            stub = gateway_pb2_grpc.GatewayStub(channel)
            await round_(stub, 1, True, 8)  # warm up
            print(
                f"\nstreamed tokens/s through the stack ({args.stack_tokens} tokens a stream, the model's chain, "
                f"lm --intra-op-threads {args.threads or 'default'}, best of {args.rounds}, in turns)"
            )
            print(f"{'streams':>7} {'no seed':>9} {'seeded':>9} {'seeded / no seed':>17}")
            for streams in (1, 8):
                best = {False: 0.0, True: 0.0}
                for _ in range(args.rounds):
                    for seeded in (False, True):
                        rate = await round_(stub, streams, seeded, args.stack_tokens)
                        best[seeded] = max(best[seeded], rate)
                print(f"{streams:>7} {best[False]:>9.1f} {best[True]:>9.1f} {best[True] / best[False]:>17.3f}")

    lm_args = ("--intra-op-threads", str(args.threads)) if args.threads else ()
    with tempfile.TemporaryDirectory(prefix="muestra-row-cost-") as logs:
        stack = LocalStack(Path(logs), text_model=args.model, image_model=None, lm_args=lm_args)
        try:
            asyncio.run(main(stack.gateway.address))
        finally:
            stack.close()


def _session(nodes, inputs, outputs, initializers, args: argparse.Namespace) -> ort.InferenceSession:
    from onnx import helper

    graph = helper.make_graph(nodes, "op", inputs, outputs, initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    options = ort.SessionOptions()
    if args.threads > 0:
        options.intra_op_num_threads = args.threads
    if args.no_opt:
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def _left_pad(array: np.ndarray, pad: int, axis: int, fill: float) -> np.ndarray:
    shape = list(array.shape)
    shape[axis] = pad
    return np.concatenate([np.full(shape, fill, array.dtype), array], axis)


def op_table(args: argparse.Namespace) -> None:
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(args.seed)
    print(f"\nsingle operators: max |diff| of one row against it run alone (threads {args.threads or 'default'})")
    pads, heads, dim = (1, 2, 3, 4, 5, 8, 16, 64), 4, 64
    for dtype, onnx_type in ((np.float32, TensorProto.FLOAT), (np.float16, TensorProto.FLOAT16)):
        io = [helper.make_tensor_value_info(name, onnx_type, None) for name in ("a", "b", "c")]
        k, n = 256, 704
        weight = numpy_helper.from_array((rng.standard_normal((k, n)) * 0.05).astype(dtype), "w")
        linear = _session([helper.make_node("MatMul", ["a", "w"], ["c"])], io[:1], io[2:], [weight], args)
        x = rng.standard_normal((1, k)).astype(dtype)
        alone = linear.run(None, {"a": x})[0][0]
        cells = []
        for m in (2, 8, 64):
            rows = np.concatenate([x, rng.standard_normal((m - 1, k)).astype(dtype)])
            cells.append(f"M={m}: {np.abs(linear.run(None, {'a': rows})[0][0] - alone).max():.2g}")
        print(f"  {np.dtype(dtype).name:<8} linear [M,{k}]x[{k},{n}]        " + "  ".join(cells))

        axis = numpy_helper.from_array(np.array([-1], np.int64), "axis")
        ops = {
            "probs x V": _session([helper.make_node("MatMul", ["a", "b"], ["c"])], io[:2], io[2:], [], args),
            "Softmax": _session([helper.make_node("Softmax", ["a"], ["c"], axis=-1)], io[:1], io[2:], [], args),
            "ReduceSum": _session([helper.make_node("ReduceSum", ["a", "axis"], ["c"])], io[:1], io[2:], [axis], args),
        }
        for name, op in ops.items():
            worst = dict.fromkeys(pads, 0.0)
            for length in (5, 37, 100, 301):  # the past length the row attends to
                a = rng.random((1, heads, 1, length)).astype(dtype)
                b = rng.standard_normal((1, heads, length, dim)).astype(dtype)
                feeds = {"a": a, "b": b} if name == "probs x V" else {"a": a * 6 - 3}
                ref = op.run(None, feeds)[0]
                for pad in pads:
                    # Left padding: zeros for probs and V rows, the dtype's minimum for softmax scores.
                    fill = np.finfo(dtype).min if name == "Softmax" else 0
                    padded = {key: _left_pad(v, pad, 2 if key == "b" else 3, fill) for key, v in feeds.items()}
                    got = op.run(None, padded)[0]
                    got = got[..., pad:] if name == "Softmax" else got
                    worst[pad] = max(worst[pad], float(np.abs(got.astype(np.float64) - ref).max()))
            print(f"  {'':<8} {name:<9} pad " + "  ".join(f"{p}: {d:.2g}" for p, d in worst.items()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=ROOT / "models" / "tiny-text-fixture", help="lm model folder")
    parser.add_argument("--steps", type=int, default=40, help="decode steps after the prefill")
    parser.add_argument("--length", type=int, default=21, help="target prompt length")
    parser.add_argument("--threads", type=int, default=0, help="intra-op threads (0: onnxruntime's default)")
    parser.add_argument("--no-opt", action="store_true", help="disable onnxruntime graph optimizations")
    parser.add_argument("--no-ops", action="store_true", help="skip the single-operator table")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--plain", action="store_true", help="load the graph without the lm's row padding")
    parser.add_argument("--cost", action="store_true", help="time decode steps with and without the row padding")
    parser.add_argument("--rounds", type=int, default=3, help="--cost: rounds, each variant in turn; best counts")
    parser.add_argument("--stack-tokens", type=int, default=128, help="--cost: tokens a stream through the stack")
    args = parser.parse_args()
    if args.cost:
        cost_table(args)
        stack_cost_table(args)
        return
    model_table(args)
    if not args.no_ops:
        op_table(args)


if __name__ == "__main__":
    main()

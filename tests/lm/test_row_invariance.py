"""A row's bits do not depend on its batch (issue 48): per operator a default-model step runs, then the whole model.

onnxruntime's float-activation 4-bit MatMulNBits (the default model's layers) has a kernel of its own for one row
of activations; the lm pads such a step to two rows (muestra.lm.row_pad). Each operator here gets one row alone,
then the same row among 2, 3, 8, 17 and 129 rows: the outputs must be bitwise equal.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from muestra.lm.engine import Engine
from muestra.lm.engine_io import DecodeInput, PrefillInput
from muestra.lm.model import OnnxDecoder
from muestra.lm.row_pad import ROW_PADS, add_row_pads, pads
from tests.fixtures.default_model import default_model_or_skip

K, N, BLOCK = 576, 1536, 32
BATCHES = (2, 3, 8, 17, 129)
SPEC = (0, 0)  # full logits


def _session(nodes, inputs, initializers, threads: int) -> ort.InferenceSession:
    out = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    graph = helper.make_graph(nodes, "op", inputs, [out], initializers)
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    model = helper.make_model(graph, opset_imports=opsets, ir_version=8)
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def _matmul_nbits(bits: int, level: int, threads: int) -> ort.InferenceSession:
    rng = np.random.default_rng(bits * 10 + level)
    blocks = K // BLOCK
    weights = rng.integers(0, 256, (N, blocks, BLOCK * bits // 8), dtype=np.uint8)
    scales = (rng.random(N * blocks, dtype=np.float32) * 0.02).astype(np.float32)
    node = helper.make_node(
        "MatMulNBits", ["a", "w", "s"], ["y"], domain="com.microsoft",
        K=K, N=N, bits=bits, block_size=BLOCK, accuracy_level=level,
    )  # fmt: skip
    inits = [onnx.numpy_helper.from_array(weights, "w"), onnx.numpy_helper.from_array(scales, "s")]
    return _session([node], [helper.make_tensor_value_info("a", TensorProto.FLOAT, ["m", K])], inits, threads)


def _matmul_float(threads: int) -> ort.InferenceSession:
    """The Q4_1 offsets' MatMul: activations times a constant float matrix (onnxruntime prepacks it)."""
    b = np.random.default_rng(5).standard_normal((K, N)).astype(np.float32)
    node = helper.make_node("MatMul", ["a", "b"], ["y"])
    inputs = [helper.make_tensor_value_info("a", TensorProto.FLOAT, ["m", K])]
    return _session([node], inputs, [onnx.numpy_helper.from_array(b, "b")], threads)


OPERATORS = {
    "4-bit MatMulNBits, float activations (the layers)": lambda t: _matmul_nbits(4, 0, t),
    "8-bit MatMulNBits, int8 activations (the vocabulary projection)": lambda t: _matmul_nbits(8, 4, t),
    "float MatMul, constant matrix (the Q4_1 offsets)": _matmul_float,
}


def _run_padded(session: ort.InferenceSession, rows: np.ndarray) -> np.ndarray:
    """Rows through the operator as the padded graph runs them: one zero row appended where pads() says so."""
    extra = int(pads(len(rows), lone=True)[3])
    fed = np.concatenate([rows, np.zeros((extra, K), np.float32)]) if extra else rows
    return session.run(None, {"a": fed})[0][: len(rows)]


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("operator", list(OPERATORS))
def test_one_row_alone_equals_the_same_row_among_2_3_8_17_and_129_rows(operator, threads):
    session = OPERATORS[operator](threads)
    rng = np.random.default_rng(11)
    for trial in range(3):
        row = rng.standard_normal((1, K)).astype(np.float32)
        alone = _run_padded(session, row)[0]
        for rows in BATCHES:
            others = rng.standard_normal((rows - 1, K)).astype(np.float32)
            at = rows - 1 if trial else int(rng.integers(rows))  # the last row: a 129-row step's one-row slice
            batch = np.concatenate([others[:at], row, others[at:]])
            got = _run_padded(session, batch)[at]
            assert np.array_equal(got, alone), f"{operator}, row {at} of {rows}: max diff {np.abs(got - alone).max()}"


def test_the_float_activation_4_bit_kernel_rounds_one_row_otherwise_than_two():
    """Why the lm pads: without it, a row alone differs from the same row beside another (onnxruntime's one-row
    kernel). If this ever fails, onnxruntime has made the two agree and the padding is no longer needed."""
    session = _matmul_nbits(4, 0, 1)
    rng = np.random.default_rng(3)
    rows = rng.standard_normal((8, K)).astype(np.float32)
    differ = [not np.array_equal(session.run(None, {"a": r[None]})[0][0], session.run(None, {"a": rows})[0][i])
              for i, r in enumerate(rows)]  # fmt: skip
    assert any(differ)


def test_a_graph_without_one_row_kernels_is_left_as_it_is():
    a = helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["b", "s"])
    graph = helper.make_graph([helper.make_node("Identity", ["input_ids"], ["y"])], "g", [a], [])
    model = helper.make_model(graph)
    assert add_row_pads(model) == "no operator has a one-row kernel"
    assert ROW_PADS not in [i.name for i in model.graph.input]


@pytest.fixture(scope="module")
def engines():
    folder = default_model_or_skip()

    def engine(row_invariant: bool, threads: int) -> Engine:
        decoder = OnnxDecoder(folder, providers="cpu", intra_op_threads=threads, row_invariant=row_invariant)
        return Engine(decoder, max_batch_rows=64, kv_budget_bytes=1 << 32, max_top_n=16)

    return {"padded": engine(True, 2), "plain": engine(False, 2)}


def _target(engine: Engine, prompt: np.ndarray, feed: np.ndarray, neighbours: int, row_invariant: bool, seed: int):
    """The target row's logits after its prefill and after each token of `feed`, with `neighbours` other rows
    (their prompts as long as the target's, their tokens random)."""
    rng = np.random.default_rng(seed)
    prompts = [prompt] + [rng.integers(3, 40000, len(prompt)).astype(np.int64) for _ in range(neighbours)]
    order = rng.permutation(len(prompts))
    at = int(np.flatnonzero(order == 0)[0])
    result = engine.prefill([PrefillInput(f"r{i}", prompts[i], SPEC) for i in order])
    out = [result.logits[at].copy()]
    batch = result.batch_id
    for token in feed:
        ids = rng.integers(3, 40000, len(prompts)).astype(np.int64)
        ids[at] = token
        result = engine.decode([DecodeInput(batch, ids, None)], row_invariant=row_invariant)
        batch = result.batch_id
        out.append(result.logits[at].copy())
    engine.clear([batch])
    return out


def test_the_default_model_gives_a_row_the_same_logits_alone_and_among_2_3_8_and_17_rows(engines):
    rng = np.random.default_rng(7)
    prompt = rng.integers(3, 40000, 21).astype(np.int64)
    feed = rng.integers(3, 40000, 5).astype(np.int64)
    engine = engines["padded"]
    alone = _target(engine, prompt, feed, 0, True, 0)
    for rows in (2, 3, 8, 17):
        together = _target(engine, prompt, feed, rows - 1, False, rows)  # several rows need no request for it
        for step, (a, b) in enumerate(zip(alone, together, strict=True)):
            assert np.array_equal(a, b), f"{rows} rows, step {step}: max diff {np.abs(a - b).max()}"
    # The same lone steps without the request take the one-row kernels: the decode steps differ from a batch's.
    fast = _target(engine, prompt, feed, 0, False, 0)
    assert np.array_equal(fast[0], alone[0])  # a prefill of several positions is never one row
    assert not any(np.array_equal(a, b) for a, b in zip(fast[1:], alone[1:], strict=True))
    # And the unpadded graph gives exactly those fast bits: the padding changes nothing else.
    plain = _target(engines["plain"], prompt, feed, 0, True, 0)
    assert all(np.array_equal(a, b) for a, b in zip(plain, fast, strict=True))

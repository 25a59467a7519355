"""Export options (float16, int8, all-position logits, external data), the CLI, and errors on bad input."""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys

import numpy as np
import onnx
import pytest
import torch

from muestra.lm.export import ExportError, export_lm, exporter
from tests.lm.test_export import empty_past, prompt, session, step

EVAL_TEXT = (
    "Once upon a time, in a land far away, there lived a small robot who loved to count numbers. "
    "The quick brown fox jumps over the lazy dog. def add(a, b): return a + b"
)


def torch_perplexity(model, ids: list[int]) -> float:
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([ids])).logits[0, :-1].double()
    return math.exp(torch.nn.functional.cross_entropy(logits, torch.tensor(ids[1:])).item())


@pytest.mark.parametrize("family", ["llama", "gpt2", "bloom"])
def test_float16_export_runs_on_onnxruntime_cpu_close_to_float32(tiny_lm, family, tmp_path):
    lm = tiny_lm(family)
    out = export_lm(lm.hf_dir, tmp_path / "fp16", dtype="float16", progress=False)
    sess = session(out)
    assert {n.type for n in sess.get_inputs() if n.name.startswith("past_")} == {"tensor(float16)"}
    ids = prompt(5, 8)
    logits, past = step(sess, np.array([ids]), np.ones((1, 8), dtype=np.int64), empty_past(sess, 1))
    assert {v.dtype for v in past.values()} == {np.dtype(np.float16)}
    assert logits.dtype == np.float32
    with torch.no_grad():
        reference = lm.torch_model()(input_ids=torch.tensor([ids])).logits[0, -1].numpy()
    np.testing.assert_allclose(logits[0, -1], reference, atol=2e-2, rtol=0)
    metadata = json.loads((out / "muestra_export.json").read_text())
    assert metadata["kv_dtype"] == metadata["weights_dtype"] == "float16"
    assert metadata["validation"]["max_abs_diff"] < 2e-2


def test_all_logits_option_emits_every_position(tiny_lm, tmp_path):
    lm = tiny_lm("qwen2")
    out = export_lm(lm.hf_dir, tmp_path / "all", last_logits_only=False, progress=False)
    assert json.loads((out / "muestra_export.json").read_text())["logits"] == "all"
    sess = session(out)
    ids = np.array([prompt(6, 7)])
    logits, _ = step(sess, ids, np.ones_like(ids), empty_past(sess, 1))
    with torch.no_grad():
        reference = lm.torch_model()(input_ids=torch.from_numpy(ids)).logits.numpy()
    assert logits.shape == reference.shape == (1, 7, 1024)
    np.testing.assert_allclose(logits, reference, atol=1e-4, rtol=0)


def test_cli_int8_export_reports_perplexity_before_and_after(tiny_lm, tmp_path):
    lm = tiny_lm("gpt2")
    (tmp_path / "eval.txt").write_text(EVAL_TEXT, encoding="utf-8")
    out = tmp_path / "int8"
    command = [sys.executable, "-m", "muestra.lm.export", str(lm.hf_dir), str(out)]
    command += ["--quantize", "int8", "--eval-text", str(tmp_path / "eval.txt")]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert "perplexity float32 =" in result.stderr and "int8 =" in result.stderr
    assert "Traceback" not in result.stderr

    metadata = json.loads((out / "muestra_export.json").read_text())
    assert metadata["weights_dtype"] == "int8" and metadata["kv_dtype"] == "float32"
    ids = lm.tokenizer()(EVAL_TEXT)["input_ids"]
    perplexity = metadata["perplexity"]
    assert perplexity["tokens"] == len(ids)
    # The float32 figure is the model's own perplexity, recomputed here by transformers in one pass.
    assert perplexity["float32"] == pytest.approx(torch_perplexity(lm.torch_model(), ids), rel=1e-4)
    assert perplexity["int8"] == pytest.approx(perplexity["float32"], rel=0.05)
    assert perplexity["int8"] != perplexity["float32"]

    assert metadata["quantization"] == {
        "method": "MatMulNBits", "bits": 8, "symmetric": True, "block_size": 32, "accuracy_level": 4,
    }  # fmt: skip
    graph = onnx.load(str(out / "model.onnx")).graph
    # Every weight product: GPT-2's Conv1D layers (Gemm in the float32 graph) and the vocabulary projection.
    assert sum(n.op_type == "MatMulNBits" for n in graph.node) == weight_matmuls(
        onnx.load(lm.onnx_dir / "model.onnx").graph, ("MatMul", "Gemm")
    )
    assert weight_matmuls(graph, ("MatMul", "Gemm")) == 0
    # Only MatMul weights are quantized; the tiny model's embedding tables stay float32.
    assert (out / "model.onnx").stat().st_size < 0.75 * (lm.onnx_dir / "model.onnx").stat().st_size
    assert sorted(p.name for p in out.iterdir()) == sorted(p.name for p in lm.onnx_dir.iterdir())


def alone_and_batched(folder) -> tuple[np.ndarray, np.ndarray]:
    """Last-position logits of one prompt run alone, and of the same prompt as row 0 of a batch of 3."""
    sess = session(folder)
    rows = np.array([prompt(7, 6), prompt(3, 6), prompt(11, 6)])
    alone, _ = step(sess, rows[:1], np.ones_like(rows[:1]), empty_past(sess, 1))
    batched, _ = step(sess, rows, np.ones_like(rows), empty_past(sess, 3))
    return alone[0], batched[0]


@pytest.mark.parametrize("quantize", ["int8", "int4"])
def test_a_quantized_row_does_not_depend_on_its_batch(tiny_lm, tmp_path, quantize):
    # Seeded replays and greedy decoding under load need it: the lm batches whatever requests are running.
    out = export_lm(tiny_lm("llama").hf_dir, tmp_path / quantize, quantize=quantize, progress=False)
    alone, batched = alone_and_batched(out)
    np.testing.assert_array_equal(alone, batched)


def test_int8_dynamic_is_dynamic_quantization_and_says_its_rows_depend_on_the_batch(tiny_lm, tmp_path):
    lm = tiny_lm("llama")
    out = export_lm(lm.hf_dir, tmp_path / "dynamic", quantize="int8-dynamic", progress=False)
    metadata = json.loads((out / "muestra_export.json").read_text())
    assert metadata["weights_dtype"] == "int8"
    assert metadata["quantization"] == {"method": "quantize_dynamic", "bits": 8, "batch_invariant": False}
    graph = onnx.load(str(out / "model.onnx")).graph
    assert any(n.op_type == "DynamicQuantizeLinear" for n in graph.node) and weight_matmuls(graph) == 0
    alone, batched = alone_and_batched(out)
    reference, _ = alone_and_batched(lm.onnx_dir)
    np.testing.assert_allclose(alone, reference, atol=0.1, rtol=0)
    np.testing.assert_allclose(batched, reference, atol=0.1, rtol=0)


def weight_matmuls(graph, ops: tuple[str, ...] = ("MatMul",)) -> int:
    """MatMuls (or `ops`) whose second input is a weight (an initializer), the ones a weight quantizer rewrites."""
    weights = {t.name for t in graph.initializer}
    return sum(1 for n in graph.node if n.op_type in ops and n.input[1] in weights)


def test_cli_int4_export_is_matmulnbits_everywhere_and_the_lm_serves_it(tiny_lm, tmp_path):
    import grpc

    from muestra.v1 import lm_pb2, lm_pb2_grpc
    from tests.fixtures.lm_service import start_lm
    from tests.lm.test_greedy import service_greedy

    lm = tiny_lm("llama")
    (tmp_path / "eval.txt").write_text(EVAL_TEXT, encoding="utf-8")
    out = tmp_path / "int4"
    command = [sys.executable, "-m", "muestra.cli", "export-lm", str(lm.hf_dir), str(out), "--quiet"]
    command += ["--quantize", "int4", "--block-size", "32", "--eval-text", str(tmp_path / "eval.txt")]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr

    metadata = json.loads((out / "muestra_export.json").read_text())
    assert metadata["weights_dtype"] == "int4"
    assert metadata["quantization"] == {
        "method": "MatMulNBits", "bits": 4, "symmetric": True, "block_size": 32, "accuracy_level": 4,
    }  # fmt: skip
    assert metadata["perplexity"]["int4"] == pytest.approx(metadata["perplexity"]["float32"], rel=0.1)
    assert metadata["perplexity"]["int4"] != metadata["perplexity"]["float32"]
    fp32_graph = onnx.load(str(lm.onnx_dir / "model.onnx")).graph
    graph = onnx.load(str(out / "model.onnx")).graph
    # Every weight MatMul, the vocabulary projection included (the tiny Llama's head is untied).
    assert sum(n.op_type == "MatMulNBits" for n in graph.node) == weight_matmuls(fp32_graph)
    assert weight_matmuls(graph) == 0
    # The embedding table (a Gather, a quarter of the tiny model) stays float32.
    assert (out / "model.onnx").stat().st_size < 0.55 * (lm.onnx_dir / "model.onnx").stat().st_size

    # The lm service serves it: its greedy tokens are those of a bare onnxruntime loop on the same file.
    sess = session(out)
    ids = prompt(5, 9)
    logits, past = step(sess, np.array([ids]), np.ones((1, len(ids)), dtype=np.int64), empty_past(sess, 1))
    expected = []
    for _ in range(12):
        expected.append(int(logits[0, -1].argmax()))
        mask = np.ones((1, len(ids) + len(expected)), dtype=np.int64)
        logits, past = step(sess, np.array([expected[-1:]]), mask, past)
    (tmp_path / "logs").mkdir()
    process = start_lm(out, "llama", tmp_path / "logs")
    try:
        with grpc.insecure_channel(process.address) as channel:
            stub = lm_pb2_grpc.LanguageModelStub(channel)
            stub.Describe(lm_pb2.DescribeModelRequest())
            assert service_greedy(stub, [ids], eos=set())[0][:12] == expected
    finally:
        process.stop()


@pytest.mark.parametrize("quantize", [None, "int8", "int8-dynamic"])
def test_weights_go_to_model_onnx_data_above_the_threshold(tiny_lm, tmp_path, monkeypatch, quantize):
    lm = tiny_lm("llama")
    monkeypatch.setattr(exporter, "EXTERNAL_DATA_THRESHOLD", 0)
    out = export_lm(lm.hf_dir, tmp_path / "external", quantize=quantize, progress=False)
    assert {"model.onnx", "model.onnx.data"} <= {p.name for p in out.iterdir()}
    assert not [p for p in out.iterdir() if p.name.endswith(".data") and p.name != "model.onnx.data"]
    assert json.loads((out / "muestra_export.json").read_text())["external_data"] is True
    inline = onnx.load(str(out / "model.onnx"), load_external_data=False).graph.initializer
    assert max(len(t.raw_data) for t in inline if t.data_location != onnx.TensorProto.EXTERNAL) < 1024
    assert (out / "model.onnx.data").stat().st_size > 100_000
    sess = session(out)
    ids = np.array([prompt(7, 5)])
    expected, _ = step(session(lm.onnx_dir), ids, np.ones_like(ids), empty_past(sess, 1))
    logits, _ = step(sess, ids, np.ones_like(ids), empty_past(sess, 1))
    np.testing.assert_allclose(logits, expected, atol=1e-4 if quantize is None else 0.1, rtol=0)


def _write_config(folder, **config):
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config))
    return folder


@pytest.mark.parametrize(
    ("make_source", "message"),
    [
        (lambda tmp: tmp / "missing", "neither a folder nor a GGUF file"),
        (lambda tmp: (tmp / "empty").mkdir() or tmp / "empty", "has no config.json"),
        (lambda tmp: _write_config(tmp / "bert", model_type="bert"), "model_type 'bert'"),
        (lambda tmp: _write_config(tmp / "noweights", model_type="llama"), "has no weights"),
    ],
    ids=["missing", "no-config", "unsupported-family", "no-weights"],
)
def test_bad_source_folder_gives_a_clear_error(tmp_path, make_source, message):
    with pytest.raises(ExportError, match=message):
        export_lm(make_source(tmp_path), tmp_path / "out", progress=False)
    assert not (tmp_path / "out").exists()


def test_bad_options_give_a_clear_error(tiny_lm, tmp_path):
    lm = tiny_lm("llama")
    with pytest.raises(ExportError, match="dtype must be one of"):
        export_lm(lm.hf_dir, tmp_path / "a", dtype="bfloat8", progress=False)
    with pytest.raises(ExportError, match="quantizes the float32 export"):
        export_lm(lm.hf_dir, tmp_path / "b", dtype="float16", quantize="int8", progress=False)
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "keep.txt").write_text("x")
    with pytest.raises(ExportError, match="not empty"):
        export_lm(lm.hf_dir, tmp_path / "full", progress=False)
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_cli_bad_source_exits_1_with_one_line_error(tmp_path):
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    command = [sys.executable, "-m", "muestra.lm.export", str(tmp_path / "nope"), str(tmp_path / "out")]
    result = subprocess.run(command, capture_output=True, text=True, timeout=120, env=env)
    assert result.returncode == 1
    message = f"python -m muestra.lm.export: error: source {tmp_path / 'nope'} is neither a folder nor a GGUF file"
    assert result.stderr.strip().splitlines() == [message]


def test_corrupt_weights_give_a_clear_error(tiny_lm, tmp_path):
    source = tmp_path / "corrupt"
    shutil.copytree(tiny_lm("llama").hf_dir, source)
    (source / "model.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(ExportError, match="could not load a transformers causal LM"):
        export_lm(source, tmp_path / "out", progress=False)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("trans_b", [0, 1])
def test_weight_gemms_become_matmuls_that_compute_the_same(trans_b):
    """quantize.gemms_to_matmuls on a lone Gemm (with bias, either weight layout): onnxruntime gives the same
    output before and after, and a transposed weight is stored once (its original is dropped)."""
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    from muestra.lm.export.quantize import gemms_to_matmuls

    rng = np.random.default_rng(0)
    weight = rng.standard_normal((5, 4) if trans_b else (4, 5)).astype(np.float32)
    bias = rng.standard_normal(5).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("Gemm", ["x", "w", "b"], ["y"], name="gemm", transB=trans_b)],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 5])],
        [numpy_helper.from_array(weight, "w"), numpy_helper.from_array(bias, "b")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)
    x = rng.standard_normal((3, 4)).astype(np.float32)

    def run(m):
        return ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]

    before = run(model)
    assert gemms_to_matmuls(model.graph) == 1
    assert [n.op_type for n in model.graph.node] == ["MatMul", "Add"]
    assert sorted(t.name for t in model.graph.initializer) == (["b", "w_transposed"] if trans_b else ["b", "w"])
    np.testing.assert_allclose(run(model), before, rtol=1e-6, atol=1e-6)

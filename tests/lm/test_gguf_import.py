"""`export-lm FILE.gguf`: small GGUF files the tests write, against transformers loading the same file.

The exact-mapped types (Q8_0, Q4_0, Q4_1) must carry the file's blocks into the graph so that what
onnxruntime reads dequantizes bit for bit to the gguf package's own dequantization; every type must
decode greedily as transformers does on the dequantized weights; a file that cannot be served is one
line and exit 1 before any work.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import onnx
import pytest

from muestra.lm.export import checks, export_lm
from muestra.lm.export.gguf_weights import OFFSET_NODES, dequantized_weights
from tests.fixtures.gguf_files import EXACT_KINDS, GGUF_KINDS, write_llama_gguf
from tests.fixtures.tokenizers import SAMPLE_TEXTS

PROMPTS = ["The quick brown fox", "¿Qué tal, señor Muñoz?"]
NEW_TOKENS = 12


@pytest.fixture(scope="module")
def imported(tmp_path_factory):
    """(kind, accuracy level) -> (gguf path, exported folder), each built once; level None: the default."""
    root = tmp_path_factory.mktemp("gguf")
    cache = {}

    def get(kind: str, level: int | None = None):
        if (kind, level) not in cache:
            path = root / f"tiny-{kind}.gguf"
            if not path.exists():
                write_llama_gguf(path, kind)
            out = root / f"onnx-{kind}-{level}"
            cache[kind, level] = (path, export_lm(path, out, accuracy_level=level, progress=False))
        return cache[kind, level]

    return get


def _transformers(path):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32).eval()
    return model, AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)


def _onnx_greedy(session, prompt: list[int], count: int) -> list[int]:
    buffers = checks.shared_buffers(session, 1, len(prompt) + count + 1)
    lengths = np.array([len(prompt)])
    logits = checks.run_shared_step(session, np.array([prompt]), lengths, buffers)
    tokens = []
    for _ in range(count):
        tokens.append(int(logits[0, -1].argmax()))
        lengths = lengths + 1
        logits = checks.run_shared_step(session, np.array([tokens[-1:]]), lengths, buffers)
    return tokens


@pytest.mark.parametrize("kind", GGUF_KINDS)
def test_greedy_tokens_equal_transformers_loading_the_same_file(imported, kind):
    """The default export: 4-bit weights on float activations, a Q8_0 vocabulary projection on int8
    activations with its top logits recomputed in float32, other Q8_0 weights float32."""
    import torch

    path, folder = imported(kind)
    model, tokenizer = _transformers(path)
    session = checks.ort_session(folder / "model.onnx")
    for prompt in PROMPTS:
        ids = tokenizer(prompt)["input_ids"]
        with torch.no_grad():
            reference = model.generate(
                torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.int64),
                max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False,
            )[0, len(ids):].tolist()  # fmt: skip
        assert _onnx_greedy(session, ids, NEW_TOKENS) == reference


@pytest.mark.parametrize("kind", EXACT_KINDS)
def test_exact_types_keep_the_files_blocks_bit_for_bit(imported, kind):
    """Accuracy level 4 keeps every exactly-mapped weight (level 0 leaves Q8_0 layers in float32)."""
    import gguf

    path, folder = imported(kind, 4)
    reader = gguf.GGUFReader(path)
    rows = {
        row.tobytes()
        for tensor in reader.tensors
        if len(tensor.shape) == 2
        for row in gguf.quants.dequantize(tensor.data, tensor.tensor_type).astype(np.float32)
    }
    graph = onnx.load(str(folder / "model.onnx"))
    weights = dequantized_weights(graph)
    # Two layers of merged q/k/v, o, merged gate/up and down, plus the tied vocabulary projection.
    assert len(weights) == 9
    for values in weights.values():
        assert all(row.tobytes() in rows for row in values)
    ops = [node.op_type for node in graph.graph.node]
    assert "GatherBlockQuantized" in ops and "Gather" not in ops[:3]
    # No float32 weight matrix is left beside the quantized ones (the block indicators are not weights).
    left = [
        i.name
        for i in graph.graph.initializer
        if i.data_type == onnx.TensorProto.FLOAT and len(i.dims) == 2 and min(i.dims) >= 64
    ]
    assert left == []
    metadata = json.loads((folder / "muestra_export.json").read_text())
    assert metadata["gguf"]["kept"] == {"Gather/" + kind: 1, "MatMul/" + kind: 9}
    assert metadata["weights_dtype"] == kind
    assert metadata["validation"]["max_abs_diff"] < 1e-3


@pytest.mark.parametrize("kind", EXACT_KINDS)
def test_the_default_keeps_what_float_activations_can_run(imported, kind):
    _, folder = imported(kind)
    kept = json.loads((folder / "muestra_export.json").read_text())["gguf"]["kept"]
    if kind == "Q8_0":
        # onnxruntime has no float kernel for 8-bit MatMulNBits: only the vocabulary projection, rescored.
        assert kept == {"Gather/Q8_0": 1, "MatMul/Q8_0": 1, "rescored/Q8_0": 1}
    else:
        assert kept == {"Gather/" + kind: 1, "MatMul/" + kind: 9}
    graph = onnx.load(str(folder / "model.onnx"))
    levels = {
        attribute.i
        for node in graph.graph.node
        if node.op_type == "MatMulNBits"
        for attribute in node.attribute
        if attribute.name == "accuracy_level"
    }
    assert levels == ({4} if kind == "Q8_0" else {0})


def test_a_q4_1_matmul_adds_its_offsets_in_three_small_ops_over_one_indicator_per_width(imported):
    """Block sums, their product with the offsets and an Add per MatMulNBits (every one has an input of its
    own: q/k/v and gate/up are merged), the sums through one block indicator per input width."""
    _, folder = imported("Q4_1")
    graph = onnx.load(str(folder / "model.onnx")).graph
    stems = [n.name.removesuffix("/matmul") for n in graph.node if n.op_type == "MatMulNBits"]
    assert len(stems) == 9  # two layers of q/k/v, o, gate/up and down, and the tied vocabulary projection
    assert len({n.input[0] for n in graph.node if n.op_type == "MatMulNBits"}) == len(stems)
    for stem in stems:
        offsets = [n.op_type for n in graph.node if n.name.startswith(stem + "/") and not n.name.endswith("/matmul")]
        assert offsets == ["MatMul", "MatMul", "Add"], stem
    named = {n.name: n for n in graph.node}
    sums = [named[f"{stem}/{OFFSET_NODES[0]}"] for stem in stems]
    assert all(f"{stem}/{part}" in named for stem in stems for part in OFFSET_NODES)
    indicators = {n.input[1] for n in sums}
    widths = {onnx.numpy_helper.to_array(i).shape[0] for i in graph.initializer if i.name in indicators}
    assert len(indicators) == len(widths) == 2  # hidden 256 (all but down) and FFN 512 (down)


def test_smollm_pre_tokenizer_splits_digits_as_llama_cpp_does(tmp_path):
    from transformers import AutoTokenizer

    from muestra.lm.export.gguf_file import inspect_gguf, to_transformers_folder

    for pre, expected in (("smollm", ["1", "2", "3", "4", "5"]), (None, None)):
        path = write_llama_gguf(tmp_path / f"pre-{pre}.gguf", "F32", pre_tokenizer=pre)
        folder = tmp_path / f"folder-{pre}"
        folder.mkdir()
        to_transformers_folder(inspect_gguf(path, {"llama"}), folder)
        pre_tokenizer = json.loads((folder / "tokenizer.json").read_text())["pre_tokenizer"]
        digits = [p for p in pre_tokenizer.get("pretokenizers", []) if p["type"] == "Digits"]
        assert bool(digits) == (pre == "smollm")
        if expected:
            assert (
                digits[0]["individual_digits"] and AutoTokenizer.from_pretrained(folder).tokenize("12345") == expected
            )


@pytest.mark.parametrize("kind", ["F32", "Q4_K"])
def test_other_types_are_dequantized_to_float32(imported, kind):
    _, folder = imported(kind)
    metadata = json.loads((folder / "muestra_export.json").read_text())
    assert metadata["gguf"]["kept"] == {} and metadata["weights_dtype"] == "float32"
    ops = {node.op_type for node in onnx.load(str(folder / "model.onnx")).graph.node}
    assert "MatMulNBits" not in ops and "GatherBlockQuantized" not in ops


def test_the_folder_holds_tokenizer_chat_template_and_limits(imported):
    from transformers import AutoTokenizer

    path, folder = imported("Q4_1")
    _, reference = _transformers(path)
    ours = AutoTokenizer.from_pretrained(folder)
    for text in SAMPLE_TEXTS:
        ids = ours(text)["input_ids"]
        assert ids == reference(text)["input_ids"]
        assert ours.decode(ids) == text
    config = json.loads((folder / "tokenizer_config.json").read_text())
    metadata = json.loads((folder / "muestra_export.json").read_text())
    assert config["model_max_length"] == metadata["context_length"] == 256
    assert "<|im_start|>" in (folder / "chat_template.jinja").read_text()
    special = json.loads((folder / "special_tokens_map.json").read_text())
    assert special["eos_token"] == "<|im_end|>"
    generation = json.loads((folder / "generation_config.json").read_text())
    assert generation["eos_token_id"] == ours.convert_tokens_to_ids("<|im_end|>")
    assert metadata["gguf"]["file"] == path.name and len(metadata["gguf"]["sha256"]) == 64


def test_dequantize_and_quantize_options(imported, tmp_path):
    path, _ = imported("Q4_1")
    folder = export_lm(path, tmp_path / "f32", dequantize=True, progress=False)
    assert "MatMulNBits" not in {n.op_type for n in onnx.load(str(folder / "model.onnx")).graph.node}
    k_path, _ = imported("Q4_K")
    folder = export_lm(k_path, tmp_path / "int8", quantize="int8", progress=False)
    metadata = json.loads((folder / "muestra_export.json").read_text())
    assert metadata["weights_dtype"] == "int8" and metadata["quantization"]["bits"] == 8


def _refused_files(tmp_path):
    good = write_llama_gguf(tmp_path / "good.gguf", "Q8_0")
    truncated = tmp_path / "truncated.gguf"
    truncated.write_bytes(good.read_bytes()[:-4096])
    magic = tmp_path / "magic.gguf"
    magic.write_bytes(b"GGML" + good.read_bytes()[4:])
    return {
        "wrong magic": (magic, "is not a GGUF file"),
        "truncated": (truncated, "truncated"),
        "architecture": (write_llama_gguf(tmp_path / "arch.gguf", "F32", architecture="rwkv6"), "'rwkv6'"),
        "type": (write_llama_gguf(tmp_path / "type.gguf", "IQ2_XXS"), "tensor type IQ2_XXS cannot be loaded"),
    }


def test_refused_gguf_files_are_one_line_and_exit_1(tmp_path):
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    for why, (path, words) in _refused_files(tmp_path).items():
        out = tmp_path / f"out-{why.replace(' ', '-')}"
        command = [sys.executable, "-m", "muestra.lm.export", str(path), str(out)]
        result = subprocess.run(command, capture_output=True, text=True, timeout=120, env=env)
        assert result.returncode == 1, (why, result.stderr)
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("python -m muestra.lm.export: error: "), (why, lines)
        assert words in lines[0], (why, lines)
        assert not out.exists()

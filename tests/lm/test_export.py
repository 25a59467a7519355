"""The exported ONNX graphs compute what the transformers models compute, in the layout the lm service loads."""

from __future__ import annotations

import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from transformers import AutoConfig, AutoTokenizer

from muestra.lm.export.checks import last_position
from muestra.lm.export.families import FAMILIES
from tests.fixtures.lm_models import EXTRA_FAMILIES, LM_FAMILIES, VARIANTS

TOLERANCE = 1e-4
ALL_MODELS = LM_FAMILIES + EXTRA_FAMILIES + VARIANTS
# Exported in the fused layout by default: all but BLOOM (ALiBi); llama-concat is the Llama in the other one.
FUSED = [m for m in ALL_MODELS if FAMILIES[m.split("-")[0]].fused]
CONCAT = [m for m in ALL_MODELS if m not in FUSED] + ["llama-concat"]


def session(onnx_dir) -> ort.InferenceSession:
    return ort.InferenceSession(str(onnx_dir / "model.onnx"), providers=["CPUExecutionProvider"])


def empty_past(sess: ort.InferenceSession, batch: int) -> dict[str, np.ndarray]:
    dtypes = {"tensor(float)": np.float32, "tensor(float16)": np.float16}
    return {
        node.name: np.zeros((batch, node.shape[1], 0, node.shape[3]), dtype=dtypes[node.type])
        for node in sess.get_inputs()
        if node.name.startswith("past_key_values.")
    }


def step(sess, input_ids, attention_mask, past):
    """One call; position_ids = cumsum(mask) - 1 clipped at 0, for the new positions only."""
    feed = {"input_ids": input_ids, "attention_mask": attention_mask, **past, **last_position(sess)}
    if any(node.name == "position_ids" for node in sess.get_inputs()):
        positions = np.clip(np.cumsum(attention_mask, axis=1) - 1, 0, None)
        feed["position_ids"] = positions[:, -input_ids.shape[1] :]
    names = [node.name for node in sess.get_outputs()]
    outputs = dict(zip(names, sess.run(names, feed), strict=True))
    presents = {k.replace("present.", "past_key_values."): v for k, v in outputs.items() if k.startswith("present.")}
    return outputs["logits"], presents


def torch_last_logits(model, ids: list[int]) -> np.ndarray:
    with torch.no_grad():
        return model(input_ids=torch.tensor([ids])).logits[0, -1].numpy()


def left_pad(prompts: list[list[int]], pad_id: int = 1) -> tuple[np.ndarray, np.ndarray]:
    width = max(map(len, prompts))
    ids = np.array([[pad_id] * (width - len(p)) + p for p in prompts], dtype=np.int64)
    mask = np.array([[0] * (width - len(p)) + [1] * len(p) for p in prompts], dtype=np.int64)
    return ids, mask


def prompt(seed: int, length: int) -> list[int]:
    return np.random.default_rng(seed).integers(2, 1000, size=length).tolist()


@pytest.mark.parametrize("family", [*ALL_MODELS, "llama-concat"])
def test_prefill_and_decode_logits_equal_torch_at_batch_one(tiny_lm, family):
    lm = tiny_lm(family)
    sess, model = session(lm.onnx_dir), lm.torch_model()
    ids = prompt(0, 9)
    logits, past = step(sess, np.array([ids]), np.ones((1, len(ids)), dtype=np.int64), empty_past(sess, 1))
    for _ in range(5):
        np.testing.assert_allclose(logits[0, -1], torch_last_logits(model, ids), atol=TOLERANCE, rtol=0)
        ids.append(int(logits[0, -1].argmax()))
        logits, past = step(sess, np.array([ids[-1:]]), np.ones((1, len(ids)), dtype=np.int64), past)
    np.testing.assert_allclose(logits[0, -1], torch_last_logits(model, ids), atol=TOLERANCE, rtol=0)


@pytest.mark.parametrize("family", CONCAT)
def test_left_padded_batch_equals_each_prompt_alone(tiny_lm, family):
    lm = tiny_lm(family)
    sess, model = session(lm.onnx_dir), lm.torch_model()
    prompts = [prompt(1, 11), prompt(2, 4)]
    ids, mask = left_pad(prompts)
    logits, past = step(sess, ids, mask, empty_past(sess, 2))
    for _ in range(4):
        for row, tokens in enumerate(prompts):
            np.testing.assert_allclose(logits[row, -1], torch_last_logits(model, tokens), atol=TOLERANCE, rtol=0)
        next_ids = logits[:, -1].argmax(-1).astype(np.int64)[:, None]
        for row, tokens in enumerate(prompts):
            tokens.append(int(next_ids[row, 0]))
        mask = np.concatenate([mask, np.ones_like(next_ids)], axis=1)
        logits, past = step(sess, next_ids, mask, past)


def shared_step(sess, ids: np.ndarray, lengths: np.ndarray, buffers: list[np.ndarray]) -> np.ndarray:
    """A fused graph's step as the lm runs it: right-padded rows, each buffer bound as past and present."""
    new = ids.shape[1]
    binding = sess.io_binding()
    binding.bind_cpu_input("input_ids", ids.astype(np.int64))
    binding.bind_cpu_input("attention_mask", (np.arange(lengths.max()) < lengths[:, None]).astype(np.int64))
    binding.bind_cpu_input("position_ids", (np.arange(new) + np.maximum(lengths - new, 0)[:, None]).astype(np.int64))
    for name, value in last_position(sess).items():
        binding.bind_cpu_input(name, value)
    binding.bind_output("logits")
    pasts = [n.name for n in sess.get_inputs() if n.name.startswith("past_key_values.")]
    for name, buffer in zip(pasts, buffers, strict=True):
        value = ort.OrtValue.ortvalue_from_numpy(buffer)
        binding.bind_ortvalue_input(name, value)
        binding.bind_ortvalue_output(name.replace("past_key_values.", "present."), value)
    sess.run_with_iobinding(binding)
    return binding.get_outputs()[0].numpy()[:, -1]


@pytest.mark.parametrize("family", FUSED)
def test_shared_buffer_rows_join_and_leave_and_equal_a_full_recompute(tiny_lm, family):
    """Rows prefilled alone, joined in one right-padded buffer, one leaving and one joining mid-decode:
    every row's logits at every step equal transformers recomputing its whole sequence."""
    lm = tiny_lm(family)
    sess, model = session(lm.onnx_dir), lm.torch_model()
    graph = onnx.load(str(lm.onnx_dir / "model.onnx")).graph
    assert (
        sum(n.op_type == "GroupQueryAttention" for n in graph.node)
        == AutoConfig.from_pretrained(lm.hf_dir).num_hidden_layers
    )
    shapes = [n.shape for n in sess.get_inputs() if n.name.startswith("past_key_values.")]
    capacity = 40

    def prefill_alone(tokens: list[int]) -> tuple[list[np.ndarray], np.ndarray]:
        buffers = [np.zeros((1, s[1], capacity, s[3]), np.float32) for s in shapes]
        return buffers, shared_step(sess, np.array([tokens]), np.array([len(tokens)]), buffers)[0]

    rows = [prompt(11, 12), prompt(12, 3)]
    alone = [prefill_alone(r) for r in rows]
    buffers = [np.concatenate([alone[0][0][t], alone[1][0][t]]) for t in range(len(shapes))]
    logits = np.stack([alone[0][1], alone[1][1]])
    for step in range(8):
        for row, tokens in enumerate(rows):
            np.testing.assert_allclose(logits[row], torch_last_logits(model, tokens), atol=TOLERANCE, rtol=0)
        for row, token in enumerate(logits.argmax(-1)):
            rows[row].append(int(token))
        if step == 3:
            # The long row leaves; a new row, prefilled alone, joins with its first generated token.
            joining = prompt(13, 6)
            extra, extra_logits = prefill_alone(joining)
            np.testing.assert_allclose(extra_logits, torch_last_logits(model, joining), atol=TOLERANCE, rtol=0)
            rows = [rows[1], [*joining, int(extra_logits.argmax())]]
            buffers = [np.concatenate([b[1:2], e]) for b, e in zip(buffers, extra, strict=True)]
        ids = np.array([[r[-1]] for r in rows])
        logits = shared_step(sess, ids, np.array([len(r) for r in rows]), buffers)


@pytest.mark.parametrize("family", [*LM_FAMILIES, "llama-concat"])
def test_prefill_continues_from_a_cached_prefix(tiny_lm, family):
    """A prompt split into a cached prefix and a multi-token rest gives the same logits and KV as one prefill."""
    sess = session(tiny_lm(family).onnx_dir)
    ids = np.array([prompt(3, 10)])
    whole_logits, whole_kv = step(sess, ids, np.ones_like(ids), empty_past(sess, 1))
    _, prefix_kv = step(sess, ids[:, :6], np.ones_like(ids[:, :6]), empty_past(sess, 1))
    split_logits, split_kv = step(sess, ids[:, 6:], np.ones_like(ids), prefix_kv)
    np.testing.assert_allclose(split_logits, whole_logits, atol=TOLERANCE, rtol=0)
    for name, value in whole_kv.items():
        np.testing.assert_allclose(split_kv[name], value, atol=TOLERANCE, rtol=0)


def test_export_folder_has_exactly_the_optimum_layout(tiny_lm):
    lm = tiny_lm("llama")
    assert sorted(p.name for p in lm.onnx_dir.iterdir()) == [
        "config.json",
        "generation_config.json",
        "model.onnx",
        "muestra_export.json",
        "tokenizer.json",
        "tokenizer_config.json",
    ]
    assert (lm.onnx_dir / "config.json").read_bytes() == (lm.hf_dir / "config.json").read_bytes()
    assert json.loads((lm.onnx_dir / "generation_config.json").read_text())["eos_token_id"] == 0
    text = "The quick brown fox \u65e5\u672c"
    assert AutoTokenizer.from_pretrained(lm.onnx_dir)(text)["input_ids"] == lm.tokenizer()(text)["input_ids"]


@pytest.mark.parametrize("family", LM_FAMILIES)
def test_graph_names_dtypes_and_kv_shapes(tiny_lm, family):
    lm = tiny_lm(family)
    config = AutoConfig.from_pretrained(lm.hf_dir)
    num_heads = config.num_attention_heads
    num_kv_heads = getattr(config, "num_key_value_heads", num_heads)
    head_dim = config.hidden_size // num_heads
    layers = range(config.num_hidden_layers)
    graph = onnx.load(str(lm.onnx_dir / "model.onnx")).graph

    expected_inputs = ["input_ids", "attention_mask", *(["position_ids"] if family != "bloom" else [])]
    expected_inputs += [f"past_key_values.{i}.{kind}" for i in layers for kind in ("key", "value")]
    assert [node.name for node in graph.input] == [*expected_inputs, "logits_positions"]
    expected_outputs = ["logits", *(f"present.{i}.{kind}" for i in layers for kind in ("key", "value"))]
    assert [node.name for node in graph.output] == expected_outputs

    def dims(node):
        return [d.dim_param or d.dim_value for d in node.type.tensor_type.shape.dim]

    positions = graph.input[-1]  # the positions whose logits a step keeps
    assert positions.type.tensor_type.elem_type == onnx.TensorProto.INT64 and len(dims(positions)) == 1

    for node in graph.input[: len(expected_inputs) - 2 * len(layers)]:
        assert node.type.tensor_type.elem_type == onnx.TensorProto.INT64
        assert all(isinstance(d, str) for d in dims(node)), f"{node.name} has a fixed axis: {dims(node)}"
    for node in list(graph.input[-1 - 2 * len(layers) : -1]) + list(graph.output[1:]):
        batch, heads, length, size = dims(node)
        assert (heads, size) == (num_kv_heads, head_dim)
        assert isinstance(batch, str) and isinstance(length, str)
    if family in ("llama", "qwen2"):
        assert num_kv_heads < num_heads, "the tiny RoPE models must exercise grouped-query attention"

    sess = session(lm.onnx_dir)
    ids = np.array([prompt(4, 5)] * 3)
    logits, presents = step(sess, ids, np.ones_like(ids), empty_past(sess, 3))
    assert logits.shape == (3, 1, config.vocab_size) and logits.dtype == np.float32
    # GroupQueryAttention continues several tokens after a past one row at a time (so does the lm).
    rows = 3 if family in CONCAT else 1
    presents = {name: value[:rows] for name, value in presents.items()}
    logits, presents = step(sess, ids[:rows, :2], np.ones((rows, 7), dtype=np.int64), presents)
    assert {v.shape for v in presents.values()} == {(rows, num_kv_heads, 7, head_dim)}


@pytest.mark.parametrize("family", LM_FAMILIES)
def test_metadata_describes_the_export(tiny_lm, family):
    lm = tiny_lm(family)
    metadata = json.loads((lm.onnx_dir / "muestra_export.json").read_text())
    config = AutoConfig.from_pretrained(lm.hf_dir)
    assert metadata["format"] == 1
    assert metadata["family"] == family
    # The last position's logits unless a step names the positions it wants (speculative verification).
    assert metadata["logits"] == "positions"
    inputs = [node.name for node in ort.InferenceSession(str(lm.onnx_dir / "model.onnx")).get_inputs()]
    assert inputs[-1] == "logits_positions"
    assert metadata["kv_dtype"] == "float32"
    assert metadata["position_ids"] is (family != "bloom")
    assert metadata["layout"] == ("concat" if family == "bloom" else "fused")
    assert metadata["kv_storage"] == ("concat" if family == "bloom" else "shared")
    assert metadata["num_layers"] == config.num_hidden_layers
    assert metadata["external_data"] is False
    assert 0 <= metadata["validation"]["max_abs_diff"] <= TOLERANCE


# Families whose rotary is the half-rotation over the whole head: GroupQueryAttention applies it.
KERNEL_ROTARY = ["llama", "qwen2", "qwen3", "mistral", "phi3", "gemma", "gemma2", "falcon"]


@pytest.mark.parametrize("family", [m for m in FUSED if m in [*KERNEL_ROTARY, "gpt_neox", "stablelm", "opt"]])
def test_the_kernel_rotates_where_the_family_rotates_whole_heads(tiny_lm, family):
    """Full-head rotary moves into GroupQueryAttention (no traced rotate-half left: no Neg); partial
    rotary (GPT-NeoX, StableLM) stays transformers' traced code; OPT has none."""
    lm = tiny_lm(family)
    metadata = json.loads((lm.onnx_dir / "muestra_export.json").read_text())
    graph = onnx.load(str(lm.onnx_dir / "model.onnx")).graph
    attentions = [n for n in graph.node if n.op_type == "GroupQueryAttention"]
    do_rotary = {a.i for n in attentions for a in n.attribute if a.name == "do_rotary"}
    negations = sum(n.op_type == "Neg" for n in graph.node)
    if family in KERNEL_ROTARY:
        assert metadata["rotary"] == "kernel" and do_rotary == {1}
        assert all(len(n.input) == 10 and n.input[9] == "position_ids" for n in attentions)
        assert negations == 0, f"{negations} Neg nodes: transformers' rotate_half was traced"
    else:
        assert metadata["rotary"] == "traced" and do_rotary <= {0}
        assert negations == (2 * len(attentions) if family != "opt" else 0)


@pytest.mark.parametrize("family", ["llama", "qwen2", "mistral", "gemma"])
def test_attention_reads_one_packed_projection_and_norms_take_the_residual(tiny_lm, family):
    """q, k and v are one MatMul that GroupQueryAttention reads packed (key and value inputs empty);
    gate and up are one MatMul; every RMSNorm after a residual Add is a SkipSimplifiedLayerNormalization."""
    lm = tiny_lm(family)
    layers = AutoConfig.from_pretrained(lm.hf_dir).num_hidden_layers
    graph = onnx.load(str(lm.onnx_dir / "model.onnx")).graph
    attentions = [n for n in graph.node if n.op_type == "GroupQueryAttention"]
    assert len(attentions) == layers and all(n.input[1] == n.input[2] == "" for n in attentions)
    # Per layer: qkv, o, gate-up, down; and the vocabulary projection.
    assert sum(n.op_type == "MatMul" for n in graph.node) == 4 * layers + 1
    assert sum(n.op_type == "SkipSimplifiedLayerNormalization" for n in graph.node) == 2 * layers
    metadata = json.loads((lm.onnx_dir / "muestra_export.json").read_text())
    assert metadata["fusions"] == {"merged_matmuls": 2 * layers, "packed_attention": layers, "skip_norms": 2 * layers}

"""The exported ONNX graphs compute what the transformers models compute, in the layout the lm service loads."""

from __future__ import annotations

import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from transformers import AutoConfig, AutoTokenizer

from tests.fixtures.lm_models import EXTRA_FAMILIES, LM_FAMILIES, VARIANTS

TOLERANCE = 1e-4


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
    feed = {"input_ids": input_ids, "attention_mask": attention_mask, **past}
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


@pytest.mark.parametrize("family", LM_FAMILIES + EXTRA_FAMILIES + VARIANTS)
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


@pytest.mark.parametrize("family", LM_FAMILIES + EXTRA_FAMILIES + VARIANTS)
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


@pytest.mark.parametrize("family", LM_FAMILIES)
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
    assert [node.name for node in graph.input] == expected_inputs
    expected_outputs = ["logits", *(f"present.{i}.{kind}" for i in layers for kind in ("key", "value"))]
    assert [node.name for node in graph.output] == expected_outputs

    def dims(node):
        return [d.dim_param or d.dim_value for d in node.type.tensor_type.shape.dim]

    for node in graph.input[: len(expected_inputs) - 2 * len(layers)]:
        assert node.type.tensor_type.elem_type == onnx.TensorProto.INT64
        assert all(isinstance(d, str) for d in dims(node)), f"{node.name} has a fixed axis: {dims(node)}"
    for node in list(graph.input[-2 * len(layers) :]) + list(graph.output[1:]):
        batch, heads, length, size = dims(node)
        assert (heads, size) == (num_kv_heads, head_dim)
        assert isinstance(batch, str) and isinstance(length, str)
    if family in ("llama", "qwen2"):
        assert num_kv_heads < num_heads, "the tiny RoPE models must exercise grouped-query attention"

    sess = session(lm.onnx_dir)
    ids = np.array([prompt(4, 5)] * 3)
    logits, presents = step(sess, ids, np.ones_like(ids), empty_past(sess, 3))
    assert logits.shape == (3, 1, config.vocab_size) and logits.dtype == np.float32
    logits, presents = step(sess, ids[:, :2], np.ones((3, 7), dtype=np.int64), presents)
    assert {v.shape for v in presents.values()} == {(3, num_kv_heads, 7, head_dim)}


@pytest.mark.parametrize("family", LM_FAMILIES)
def test_metadata_describes_the_export(tiny_lm, family):
    lm = tiny_lm(family)
    metadata = json.loads((lm.onnx_dir / "muestra_export.json").read_text())
    config = AutoConfig.from_pretrained(lm.hf_dir)
    assert metadata["format"] == 1
    assert metadata["family"] == family
    assert metadata["logits"] == "last"
    assert metadata["kv_dtype"] == "float32"
    assert metadata["position_ids"] is (family != "bloom")
    assert metadata["num_layers"] == config.num_hidden_layers
    assert metadata["external_data"] is False
    assert 0 <= metadata["validation"]["max_abs_diff"] <= TOLERANCE

"""Every family the exporter takes, and onnxruntime-genai's builder folder, served by the lm service.

For each: the export (or the builder's folder as it comes) is served by a real lm process, and its
greedy tokens over gRPC equal transformers' generate() on the same weights; the context length the
service reports is the one the family's config gives. The logits themselves are checked against
transformers in tests/lm/test_export.py, over the same families.
"""

from __future__ import annotations

import json
import shutil

import pytest
from transformers import AutoConfig

from muestra.lm.export import ExportError, export_lm
from muestra.lm.export.families import FAMILIES
from muestra.lm.model import OnnxDecoder
from muestra.lm.model_folder import ModelFolderError
from muestra.v1 import lm_pb2
from tests.fixtures.lm_models import EXTRA_FAMILIES, MAX_POSITIONS, VARIANTS, save_tiny_tokenizer
from tests.lm.lm_client import prompts
from tests.lm.test_greedy import service_greedy, transformers_greedy

NEW_FAMILIES = [f for f in EXTRA_FAMILIES if f != "mistral"]
# What each served model's Describe must say: the config's max_position_embeddings, except where noted.
EXPECTED_CONTEXT = {name: MAX_POSITIONS for name in NEW_FAMILIES + VARIANTS + ["llama-genai"]}
# longrope is exact up to the length before scaling (the fixture's original_max_position_embeddings).
EXPECTED_CONTEXT["phi3-longrope"] = 64


@pytest.mark.parametrize("name", NEW_FAMILIES + VARIANTS + ["llama-genai"])
def test_served_greedy_tokens_equal_transformers_generate(lm_service, served_lm, name):
    service = lm_service(name)
    model = served_lm(name).torch_model()
    info = service.stub.Describe(lm_pb2.DescribeModelRequest())
    assert info.context_length == EXPECTED_CONTEXT[name]
    eos = set(info.eos_token_ids)
    assert eos == {0}
    batch = prompts([9, 4, 15], model.config.vocab_size, seed=11)
    expected = [transformers_greedy(model, p) for p in batch]
    assert service_greedy(service.stub, batch[:1], eos) == expected[:1]
    assert service_greedy(service.stub, batch, eos) == expected


def test_genai_folder_is_served_as_the_builder_wrote_it(served_lm, lm_service):
    folder = served_lm("llama-genai").onnx_dir
    names = {p.name for p in folder.iterdir()}
    assert "genai_config.json" in names and "config.json" not in names and "generation_config.json" not in names
    info = lm_service("llama-genai").stub.Describe(lm_pb2.DescribeModelRequest())
    assert info.kv.storage == "shared", "genai's graph binds one buffer as past and present"
    search = json.loads((folder / "genai_config.json").read_text())["search"]
    served = json.loads(info.generation_config_json)
    assert served["do_sample"] is search["do_sample"] and served["top_k"] == search["top_k"]


def test_every_family_records_its_context_length(tiny_lm):
    for name in ["llama", "gpt2", "bloom", *NEW_FAMILIES]:
        metadata = json.loads((tiny_lm(name).onnx_dir / "muestra_export.json").read_text())
        config = AutoConfig.from_pretrained(tiny_lm(name).hf_dir)
        want = 2048 if name == "bloom" else getattr(config, "max_position_embeddings", None) or config.n_positions
        assert metadata["context_length"] == want, name
    assert set(FAMILIES) >= {"phi3", "gemma", "gemma2", "qwen3", "gpt_neox", "opt", "falcon", "stablelm"}


def test_bloom_is_served_at_its_training_length_without_a_flag(tiny_lm):
    decoder = OnnxDecoder(tiny_lm("bloom").onnx_dir, providers="cpu", intra_op_threads=1)
    assert decoder.context_length == 2048


def test_export_context_length_option_lowers_and_never_raises(tiny_lm, tmp_path):
    src = tiny_lm("qwen3").hf_dir
    out = export_lm(src, tmp_path / "short", progress=False, max_context=100)
    assert json.loads((out / "muestra_export.json").read_text())["context_length"] == 100
    assert OnnxDecoder(out, providers="cpu", intra_op_threads=1).context_length == 100
    with pytest.raises(ExportError, match=f"context length 4096 exceeds the model's {MAX_POSITIONS}"):
        export_lm(src, tmp_path / "long", progress=False, max_context=4096)


def test_falcon_with_alibi_is_refused_naming_the_variant(tmp_path):
    import torch
    from transformers import AutoModelForCausalLM, FalconConfig

    torch.manual_seed(0)
    config = FalconConfig(
        hidden_size=64, num_hidden_layers=1, num_attention_heads=4, alibi=True, vocab_size=1024, bos_token_id=0
    )
    AutoModelForCausalLM.from_config(config).save_pretrained(tmp_path / "hf")
    save_tiny_tokenizer(tmp_path / "hf")
    with pytest.raises(ExportError, match=r"alibi=true \(the falcon-rw models\) is not supported"):
        export_lm(tmp_path / "hf", tmp_path / "onnx", progress=False)
    assert not (tmp_path / "onnx").exists()


def test_a_transformers_folder_as_the_model_names_the_export_command(tiny_lm, tmp_path):
    folder = tmp_path / "my-model"
    shutil.copytree(tiny_lm("llama").hf_dir, folder)
    with pytest.raises(ModelFolderError) as error:
        OnnxDecoder(folder, providers="cpu")
    assert f"muestra export-lm {folder} {tmp_path / 'my-model-onnx'}" in str(error.value)

"""Describe: what the model is, where it runs, and a fingerprint that identifies the exact model."""

from __future__ import annotations

import json

import grpc

from muestra.v1 import common_pb2, lm_pb2, lm_pb2_grpc
from tests.fixtures.lm_models import MAX_POSITIONS, VOCAB_SIZE
from tests.fixtures.lm_service import start_lm


def describe(stub) -> lm_pb2.DescribeModelResponse:
    return stub.Describe(lm_pb2.DescribeModelRequest())


def test_describe_reports_the_model_the_providers_and_the_kv_layout(lm_service, tiny_lm):
    info = describe(lm_service("llama").stub)
    config = tiny_lm("llama").torch_model().config
    assert list(info.providers) == ["CPUExecutionProvider"]
    assert (info.vocab_size, info.context_length) == (VOCAB_SIZE, MAX_POSITIONS)
    assert list(info.eos_token_ids) == [config.eos_token_id]
    assert info.kv == lm_pb2.KvLayout(
        num_layers=config.num_hidden_layers,
        num_kv_heads=config.num_key_value_heads,
        head_dim=config.hidden_size // config.num_attention_heads,
        dtype=common_pb2.FLOAT32,
        storage="shared",
    )
    assert json.loads(info.generation_config_json)["eos_token_id"] == config.eos_token_id
    assert len(info.fingerprint) == 64


def test_fingerprint_is_stable_across_restarts_and_differs_between_models(lm_service, tiny_lm, tmp_path):
    running = describe(lm_service("llama").stub).fingerprint
    restarted = start_lm(tiny_lm("llama").onnx_dir, "llama", tmp_path)
    try:
        with grpc.insecure_channel(restarted.address) as channel:
            again = describe(lm_pb2_grpc.LanguageModelStub(channel)).fingerprint
    finally:
        restarted.stop()
    assert again == running
    assert describe(lm_service("gpt2").stub).fingerprint != running
    assert describe(lm_service("qwen2").stub).fingerprint != running
    # The same weights in the other KV layout are another model to a prefix cache.
    assert describe(lm_service("llama-concat").stub).fingerprint != running


def test_a_group_query_attention_graph_is_served_with_a_shared_kv_buffer(lm_service):
    info = describe(lm_service("llama").stub)
    assert info.kv.storage == "shared"
    assert (info.kv.num_layers, info.kv.num_kv_heads, info.kv.head_dim) == (2, 2, 16)

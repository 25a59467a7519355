"""The tests' text model, models/tiny-text-fixture: served by the real lm and tokenizer services, small, trained.

The quality bar (held-out perplexity against a unigram model) takes minutes and lives in
bench/text_quality.py; here are the properties every clone must keep (the tests that serve it rely on them).
"""

from __future__ import annotations

import json
import math
import pydoc_data.topics
from pathlib import Path

import grpc
import numpy as np
import onnxruntime as ort
import pytest
from tokenizers import Tokenizer

from muestra.gateway.engine.sampling.chain import default_specs
from muestra.lm.export.checks import last_position
from muestra.v1 import lm_pb2, lm_pb2_grpc, tokenizer_pb2, tokenizer_pb2_grpc
from tests.harness import ServiceProcess

REPO = Path(__file__).resolve().parents[2]
FIXTURE = REPO / "models" / "tiny-text-fixture"
SIZE_LIMIT_BYTES = 20_000_000
PROMPTS = ["The list", "Return the number of", "If the file does not exist,"]
GREEDY_TOKENS = 24


@pytest.fixture(scope="module")
def stubs(tmp_path_factory):
    """The tokenizer and lm services on the fixture's folder, as `muestra up --text-model` starts them."""
    log_dir = tmp_path_factory.mktemp("tiny-text-fixture")
    tokenizer = ServiceProcess("tokenizer", ["--models", str(FIXTURE)], log_dir)
    try:
        lm = ServiceProcess("lm", ["--model", str(FIXTURE), "--providers", "cpu", "--intra-op-threads", "1"], log_dir)
    except BaseException:
        tokenizer.stop()
        raise
    try:
        with grpc.insecure_channel(tokenizer.address) as t_channel, grpc.insecure_channel(lm.address) as l_channel:
            yield tokenizer_pb2_grpc.TokenizerStub(t_channel), lm_pb2_grpc.LanguageModelStub(l_channel)
    finally:
        lm.stop()
        tokenizer.stop()


@pytest.fixture(scope="module")
def session():
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    return ort.InferenceSession(str(FIXTURE / "model.onnx"), options, providers=["CPUExecutionProvider"])


def forward(session: ort.InferenceSession, ids: list[int], past: dict, start: int) -> tuple[np.ndarray, dict]:
    """One call of the bare graph for one row without padding: last-position logits and the new past."""
    feed = {
        "input_ids": np.array([ids], dtype=np.int64),
        "attention_mask": np.ones((1, start + len(ids)), dtype=np.int64),
        "position_ids": np.arange(start, start + len(ids), dtype=np.int64)[None],
        **past,
        **last_position(session),
    }
    names = [output.name for output in session.get_outputs()]
    values = dict(zip(names, session.run(names, feed), strict=True))
    present = {name.replace("present.", "past_key_values.", 1): v for name, v in values.items() if "present." in name}
    return values["logits"][0, -1], present


def empty_past(session: ort.InferenceSession) -> dict:
    dtypes = {"tensor(float)": np.float32, "tensor(float16)": np.float16}
    return {
        node.name: np.zeros((1, node.shape[1], 0, node.shape[3]), dtype=dtypes[node.type])
        for node in session.get_inputs()
        if node.name.startswith("past_key_values.")
    }


def onnxruntime_greedy(session: ort.InferenceSession, prompt_ids: list[int], steps: int) -> list[int]:
    """Greedy tokens from the bare graph: the prompt in one call, then one token per call through the KV cache."""
    logits, past = forward(session, prompt_ids, empty_past(session), 0)
    out = []
    for _ in range(steps):
        out.append(int(logits.argmax()))
        logits, past = forward(session, out[-1:], past, len(prompt_ids) + len(out) - 1)
    return out


def service_greedy(lm: lm_pb2_grpc.LanguageModelStub, prompt_ids: list[int], steps: int) -> list[int]:
    """Greedy tokens from the lm service: Prefill, then Decode with ARGMAX outputs."""
    argmax = lm_pb2.OutputSpec(kind=lm_pb2.ARGMAX)
    reply = lm.Prefill(
        lm_pb2.PrefillRequest(rows=[lm_pb2.PrefillRow(request_id="greedy", input_ids=prompt_ids, output=argmax)])
    )
    out, batch_id = [reply.output.rows[0].argmax], reply.batch_id
    try:
        while len(out) < steps:
            decode = lm_pb2.DecodeBatch(batch_id=batch_id, next_ids=out[-1:], outputs=[argmax])
            step = lm.Decode(lm_pb2.DecodeRequest(batches=[decode]))
            out.append(step.output.rows[0].argmax)
            batch_id = step.batch_id  # every Decode replaces the batch
    finally:
        lm.Clear(lm_pb2.ClearRequest(batch_ids=[batch_id]))
    return out


@pytest.mark.parametrize("prompt", PROMPTS)
def test_greedy_continuation_through_the_services_equals_bare_onnxruntime(stubs, session, prompt):
    tokenizer, lm = stubs
    prompt_ids = list(tokenizer.Encode(tokenizer_pb2.EncodeRequest(texts=[prompt])).encodings[0].ids)
    served = service_greedy(lm, prompt_ids, GREEDY_TOKENS)
    assert served == onnxruntime_greedy(session, prompt_ids, GREEDY_TOKENS)
    sequences = [tokenizer_pb2.TokenIds(ids=prompt_ids + served), tokenizer_pb2.TokenIds(ids=served)]
    full, continuation = tokenizer.Decode(tokenizer_pb2.DecodeTokensRequest(sequences=sequences)).texts
    reference = Tokenizer.from_file(str(FIXTURE / "tokenizer.json"))
    assert full == reference.decode(prompt_ids + served) == prompt + continuation
    assert "\ufffd" not in continuation and continuation.strip()


def test_the_services_describe_the_fixtures_configuration(stubs):
    tokenizer, lm = stubs
    described = lm.Describe(lm_pb2.DescribeModelRequest())
    config = json.loads((FIXTURE / "config.json").read_text())
    tokenizer_config = json.loads((FIXTURE / "tokenizer_config.json").read_text())
    assert described.model == FIXTURE.name
    assert described.context_length == config["max_position_embeddings"] == tokenizer_config["model_max_length"]
    assert (
        described.vocab_size
        == config["vocab_size"]
        == tokenizer.Describe(tokenizer_pb2.DescribeTokenizerRequest()).vocab_size
    )
    eos_token = json.loads((FIXTURE / "special_tokens_map.json").read_text())["eos_token"]
    assert list(described.eos_token_ids) == [
        Tokenizer.from_file(str(FIXTURE / "tokenizer.json")).token_to_id(eos_token)
    ]
    assert described.kv.num_kv_heads == config["num_key_value_heads"] < config["num_attention_heads"]


def test_it_is_a_llama_with_grouped_query_attention_and_a_sampling_default():
    config = json.loads((FIXTURE / "config.json").read_text())
    assert config["model_type"] == "llama" and config["architectures"] == ["LlamaForCausalLM"]
    assert config["hidden_act"] == "silu" and config["num_key_value_heads"] < config["num_attention_heads"]
    assert 512 <= config["max_position_embeddings"] <= 1024
    generation_config = json.loads((FIXTURE / "generation_config.json").read_text())
    chain = [spec["name"] for spec in default_specs(generation_config)]
    assert chain == ["repetition_penalty", "temperature", "top_p", "sample"]


def test_the_fixtures_folder_is_at_most_20_mb():
    files = [path for path in FIXTURE.iterdir() if path.is_file()]
    assert {"model.onnx", "config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json"} <= {
        path.name for path in files
    }
    assert sum(path.stat().st_size for path in files) <= SIZE_LIMIT_BYTES


def test_it_is_trained_python_help_text_is_far_likelier_than_chance(session):
    # Help topics are training text, so this says "trained", not "generalizes" (bench/text_quality.py does that).
    tokenizer = Tokenizer.from_file(str(FIXTURE / "tokenizer.json"))
    ids = tokenizer.encode(pydoc_data.topics.topics["typesseq-mutable"]).ids[:256]
    logits, past = forward(session, ids[:1], empty_past(session), 0)
    nll = 0.0
    for position in range(1, len(ids)):
        row = logits.astype(np.float64)
        nll += row.max() + math.log(np.exp(row - row.max()).sum()) - row[ids[position]]
        logits, past = forward(session, ids[position : position + 1], past, position)
    perplexity = math.exp(nll / (len(ids) - 1))
    assert perplexity < 100, f"perplexity {perplexity:.1f}; uniform would be {tokenizer.get_vocab_size()}"

"""The tokenizer of the tests' text model, models/tiny-text-fixture: reproducible, loadable by transformers, served."""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path

import grpc
import pytest
from tokenizers import Tokenizer
from transformers import AutoTokenizer

from muestra.v1 import common_pb2, tokenizer_pb2, tokenizer_pb2_grpc
from tests.fixtures.tokenizers import SAMPLE_TEXTS
from tests.harness import ServiceProcess

REPO = Path(__file__).resolve().parents[2]
FIXTURE = REPO / "models" / "tiny-text-fixture"
FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


@pytest.fixture(scope="module")
def stub(tmp_path_factory):
    """A service given its tokenizer only through MUESTRA_TOKENIZER_MODELS, as `muestra up` may."""
    service = ServiceProcess(
        "tokenizer",
        [],
        tmp_path_factory.mktemp("fixture-tokenizer"),
        env={"MUESTRA_TOKENIZER_MODELS": str(FIXTURE)},
    )
    try:
        with grpc.insecure_channel(service.address) as channel:
            yield tokenizer_pb2_grpc.TokenizerStub(channel)
    finally:
        service.stop()


def test_the_training_script_reproduces_the_committed_files(tmp_path):
    sys.path.insert(0, str(REPO / "models"))
    try:
        import train_tokenizer
    finally:
        sys.path.remove(str(REPO / "models"))
    corpus = hashlib.sha256(train_tokenizer.corpus_path().read_bytes()).hexdigest()
    if corpus != train_tokenizer.CORPUS_SHA256:
        pytest.skip("this Python ships another pydoc_data/topics.py than the one the files were trained on")
    subprocess.run([sys.executable, str(REPO / "models" / "train_tokenizer.py"), "--out", str(tmp_path)], check=True)
    for name in FILES:
        assert (tmp_path / name).read_bytes() == (FIXTURE / name).read_bytes(), name


def test_the_committed_files_are_small():
    assert sum((FIXTURE / name).stat().st_size for name in FILES) < 1_000_000


def test_transformers_loads_it_and_encodes_like_the_service(stub):
    reference = AutoTokenizer.from_pretrained(FIXTURE)
    reply = stub.Encode(tokenizer_pb2.EncodeRequest(texts=SAMPLE_TEXTS, add_special_tokens=True))
    assert [list(e.ids) for e in reply.encodings] == reference(SAMPLE_TEXTS)["input_ids"]
    decoded = stub.Decode(
        tokenizer_pb2.DecodeTokensRequest(sequences=[tokenizer_pb2.TokenIds(ids=e.ids) for e in reply.encodings])
    )
    assert list(decoded.texts) == SAMPLE_TEXTS


def test_it_is_a_byte_level_bpe_with_the_specified_special_tokens(stub):
    tokenizer = Tokenizer.from_file(str(FIXTURE / "tokenizer.json"))
    assert tokenizer.get_vocab_size() == 4096
    described = stub.Describe(tokenizer_pb2.DescribeTokenizerRequest())
    assert described.model == FIXTURE.name and list(described.models) == [FIXTURE.name]
    assert described.vocab_size == 4096 and described.backend == "tokenizers"
    assert described.bos_token_id == tokenizer.token_to_id("<|bos|>")
    assert list(described.eos_token_ids) == [tokenizer.token_to_id("<|eos|>")]
    assert described.pad_token_id == tokenizer.token_to_id("<|pad|>")
    assert described.has_chat_template


def test_its_chat_template_renders_like_transformers(stub):
    reference = AutoTokenizer.from_pretrained(FIXTURE)
    messages = [
        {"role": "system", "content": "Eres breve."},
        {"role": "user", "content": "¿Qué es 東京? 🙂"},
        {"role": "assistant", "content": "La capital de Japón."},
        {"role": "user", "content": "¿Y de España?"},
    ]
    request = tokenizer_pb2.ApplyChatTemplateRequest(
        messages=[common_pb2.ChatMessage(**m) for m in messages], add_generation_prompt=True, tokenize=True
    )
    reply = stub.ApplyChatTemplate(request)
    assert reply.text == reference.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert reply.text.startswith("<|bos|>system\nEres breve.<|eos|>\n") and reply.text.endswith("<|bos|>assistant\n")
    assert list(reply.ids) == reference.apply_chat_template(messages, add_generation_prompt=True, return_dict=False)

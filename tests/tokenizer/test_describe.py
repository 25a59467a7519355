"""Describe reports what the tokenizer objects themselves say."""

from __future__ import annotations

import pytest
from transformers import AutoTokenizer

from muestra.v1 import tokenizer_pb2
from tests.fixtures.tokenizers import TEST_MAX_TEXT_BYTES


def describe(stub, model: str) -> tokenizer_pb2.DescribeTokenizerResponse:
    return stub.Describe(tokenizer_pb2.DescribeTokenizerRequest(model=model))


def optional(reply, field: str) -> int | None:
    return getattr(reply, field) if reply.HasField(field) else None


@pytest.mark.parametrize("model", ["bpe", "llama3", "features", "wordpiece", "unigram"])
def test_describe_equals_transformers(tokenizer_stub, tokenizer_folders, model):
    reference = AutoTokenizer.from_pretrained(tokenizer_folders[model])
    reply = describe(tokenizer_stub, model)
    assert reply.model == model
    assert reply.vocab_size == len(reference)
    assert optional(reply, "bos_token_id") == reference.bos_token_id
    assert list(reply.eos_token_ids) == ([] if reference.eos_token_id is None else [reference.eos_token_id])
    assert optional(reply, "pad_token_id") == reference.pad_token_id
    assert reply.model_max_length == reference.model_max_length
    assert reply.has_chat_template == (reference.chat_template is not None)
    assert reply.backend == "tokenizers"


def test_describe_equals_sentencepiece(tokenizer_stub, reference_tokenizers):
    sp = reference_tokenizers["sentencepiece"]
    reply = describe(tokenizer_stub, "sentencepiece")
    assert reply.backend == "sentencepiece"
    assert reply.vocab_size == sp.get_piece_size()
    assert (reply.bos_token_id, list(reply.eos_token_ids), reply.pad_token_id) == (
        sp.bos_id(),
        [sp.eos_id()],
        sp.pad_id(),
    )
    assert reply.model_max_length == 1024  # from its tokenizer_config.json
    assert not reply.has_chat_template


def test_describe_lists_every_model_and_the_limit(tokenizer_stub, tokenizer_folders):
    reply = describe(tokenizer_stub, "")
    assert reply.model == "bpe"
    assert list(reply.models) == list(tokenizer_folders)
    assert reply.max_text_bytes == TEST_MAX_TEXT_BYTES

"""ExportTokenizer: the loaded tokenizer as tokenizer.json text, which encodes as the service does."""

from __future__ import annotations

import grpc
import pytest
from tokenizers import Tokenizer

from muestra.v1 import tokenizer_pb2

TEXTS = ["The quick brown fox", "Café 日本語 🙂", "def f(x):\n    return x"]


@pytest.mark.parametrize("model", ["bpe", "wordpiece", "unigram"])
def test_the_exported_tokenizer_encodes_as_the_service_does(tokenizer_stub, model):
    chunks = list(tokenizer_stub.ExportTokenizer(tokenizer_pb2.DescribeTokenizerRequest(model=model)))
    exported = Tokenizer.from_str(b"".join(chunk.data for chunk in chunks).decode("utf-8"))
    described = tokenizer_stub.Describe(tokenizer_pb2.DescribeTokenizerRequest(model=model))
    assert exported.get_vocab_size(with_added_tokens=True) == described.vocab_size
    encoded = tokenizer_stub.Encode(tokenizer_pb2.EncodeRequest(model=model, texts=TEXTS, add_special_tokens=True))
    for text, encoding in zip(TEXTS, encoded.encodings, strict=True):
        assert exported.encode(text).ids == list(encoding.ids)


def test_large_tokenizers_come_in_chunks_of_at_most_one_mebibyte(tokenizer_stub):
    from muestra.tokenizer.server import EXPORT_CHUNK_BYTES

    chunks = list(tokenizer_stub.ExportTokenizer(tokenizer_pb2.DescribeTokenizerRequest(model="bpe")))
    assert chunks and all(0 < len(chunk.data) <= EXPORT_CHUNK_BYTES == 1 << 20 for chunk in chunks)


def test_sentencepiece_and_unknown_models_are_refused_by_name(tokenizer_stub):
    with pytest.raises(grpc.RpcError) as info:
        list(tokenizer_stub.ExportTokenizer(tokenizer_pb2.DescribeTokenizerRequest(model="sentencepiece")))
    assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "sentencepiece backend, which has no tokenizer.json form" in info.value.details()
    with pytest.raises(grpc.RpcError) as info:
        list(tokenizer_stub.ExportTokenizer(tokenizer_pb2.DescribeTokenizerRequest(model="nope")))
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT and info.value.details().startswith("model: ")

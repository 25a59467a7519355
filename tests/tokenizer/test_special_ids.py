"""Describe lists the special ids: exactly those decode drops with skip_special_tokens."""

from __future__ import annotations

import pytest
from transformers import AutoTokenizer

from muestra.v1 import tokenizer_pb2


def describe(stub, model: str) -> tokenizer_pb2.DescribeTokenizerResponse:
    return stub.Describe(tokenizer_pb2.DescribeTokenizerRequest(model=model))


@pytest.mark.parametrize("model", ["bpe", "llama3", "features", "wordpiece", "unigram"])
def test_special_ids_are_the_added_tokens_marked_special(tokenizer_stub, tokenizer_folders, model):
    reference = AutoTokenizer.from_pretrained(tokenizer_folders[model])
    expected = sorted(i for i, token in reference.added_tokens_decoder.items() if token.special)
    reply = describe(tokenizer_stub, model)
    assert list(reply.special_token_ids) == expected
    # Decoding with skip_special_tokens drops exactly these.
    every = list(range(reply.vocab_size))
    kept = reference.convert_ids_to_tokens([i for i in every if i not in set(expected)])
    assert reference.decode(every, skip_special_tokens=True) == reference.convert_tokens_to_string(kept)


def test_special_ids_of_sentencepiece_are_its_control_pieces(tokenizer_stub, reference_tokenizers):
    sp = reference_tokenizers["sentencepiece"]
    reply = describe(tokenizer_stub, "sentencepiece")
    assert list(reply.special_token_ids) == [i for i in range(sp.get_piece_size()) if sp.is_control(i)]

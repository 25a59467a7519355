"""The gateway's Tokenize and Detokenize give what the tokenizer service gives; `muestra tokenize` uses them."""

from __future__ import annotations

import json

import grpc
import pytest

from muestra.v1 import common_pb2, gateway_pb2, tokenizer_pb2, tokenizer_pb2_grpc
from tests.cli.conftest import assert_fails_in_one_line, muestra

TEXTS = ["El cielo es azul", "Caf\u00e9 na\u00efve \U0001f600", "def add(a, b):\n    return a + b"]


@pytest.fixture(scope="module")
def tokenizer_stub(text_stack):
    with grpc.insecure_channel(text_stack("llama").tokenizer.address) as channel:
        yield tokenizer_pb2_grpc.TokenizerStub(channel)


@pytest.mark.parametrize("add_special_tokens", [True, False])
def test_gateway_tokenize_equals_the_tokenizer_services_encode(text_stack, tokenizer_stub, add_special_tokens):
    stack = text_stack("llama")
    for text in TEXTS:
        expected = tokenizer_stub.Encode(
            tokenizer_pb2.EncodeRequest(texts=[text], add_special_tokens=add_special_tokens), timeout=30
        ).encodings[0]
        got = stack.stub.Tokenize(
            gateway_pb2.TokenizeRequest(prompt=text, add_special_tokens=add_special_tokens), timeout=30
        )
        assert list(got.ids) == list(expected.ids) and list(got.tokens) == list(expected.tokens)
        assert got.context_length == 512
        decoded = tokenizer_stub.Decode(
            tokenizer_pb2.DecodeTokensRequest(sequences=[tokenizer_pb2.TokenIds(ids=got.ids)]), timeout=30
        ).texts[0]
        assert stack.stub.Detokenize(gateway_pb2.DetokenizeRequest(ids=got.ids), timeout=30).text == decoded


def test_gateway_tokenize_of_messages_equals_the_chat_template_ids(openai_stack):
    messages = common_pb2.ChatMessages(
        messages=[
            common_pb2.ChatMessage(role="user", content="Hola"),
            common_pb2.ChatMessage(role="assistant", content="Hey"),
        ]
    )
    metadata = [("authorization", f"Bearer {openai_stack.api_key}")]
    got = openai_stack.stub.Tokenize(gateway_pb2.TokenizeRequest(messages=messages), timeout=30, metadata=metadata)
    from transformers import AutoTokenizer  # the reference: transformers' own chat template rendering

    reference = AutoTokenizer.from_pretrained(openai_stack.chat_tokenizer_dir)
    expected = reference.apply_chat_template(
        [{"role": "user", "content": "Hola"}, {"role": "assistant", "content": "Hey"}],
        add_generation_prompt=True, tokenize=True,
    )  # fmt: skip
    if hasattr(expected, "keys"):  # a BatchEncoding in transformers 5
        expected = expected["input_ids"]
    assert list(got.ids) == list(expected)


def test_muestra_tokenize_goes_through_the_gateway(text_stack, tokenizer_stub):
    stack = text_stack("llama")
    result = muestra("tokenize", TEXTS[1], "--json", "--gateway", stack.gateway.address, timeout=60)
    assert result.returncode == 0, result.stderr
    expected = tokenizer_stub.Encode(
        tokenizer_pb2.EncodeRequest(texts=[TEXTS[1]], add_special_tokens=True), timeout=30
    ).encodings[0]
    assert json.loads(result.stdout) == {"ids": list(expected.ids), "tokens": list(expected.tokens)}


def test_tokenize_errors_name_the_field(text_stack):
    stack = text_stack("llama")
    with pytest.raises(grpc.RpcError) as info:
        stack.stub.Detokenize(gateway_pb2.DetokenizeRequest(ids=[10**6]), timeout=30)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "ids" in info.value.details()
    line = assert_fails_in_one_line(
        muestra("tokenize", "x", "--model", "nope", "--gateway", stack.gateway.address, timeout=60)
    )
    assert "NOT_FOUND" in line and "nope" in line

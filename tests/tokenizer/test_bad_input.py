"""Bad requests get INVALID_ARGUMENT (or FAILED_PRECONDITION) naming the field and the limit, and the
service keeps serving: the next request, and requests running alongside, still succeed."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest

from muestra.v1 import common_pb2, tokenizer_pb2, tokenizer_pb2_grpc
from tests.fixtures.tokenizers import (
    SAMPLE_TEXTS,
    TEST_MAX_BATCH_SIZE,
    TEST_MAX_MESSAGES,
    TEST_MAX_SEQUENCE_IDS,
    TEST_MAX_TEXT_BYTES,
)
from tests.harness import ServiceProcess

pb = tokenizer_pb2
INVALID = grpc.StatusCode.INVALID_ARGUMENT
BPE_VOCAB = 600  # tests/fixtures/tokenizers.py trains the byte-level BPE to this size


def msg(role: str, content: str = "hi") -> common_pb2.ChatMessage:
    return common_pb2.ChatMessage(role=role, content=content)


def stream(ids: list[int], read_offset: int = 0) -> pb.DetokenizeStream:
    return pb.DetokenizeStream(ids=ids, read_offset=read_offset)


# name → (rpc, request, status, fragments the message must hold: the field first, then the limit or value)
CASES = {}


def case(name: str, method: str, request, fragments: list[str], status=INVALID) -> None:
    CASES[name] = (method, request, status, fragments)


ALL_MODELS = "bpe, features, llama3, sentencepiece, unigram, wordpiece"
case(
    "unknown model (Encode)", "Encode", pb.EncodeRequest(model="gpt-9", texts=["x"]), ["model:", "'gpt-9'", ALL_MODELS]
)
case("unknown model (Describe)", "Describe", pb.DescribeTokenizerRequest(model="nope"), ["model:", ALL_MODELS])
case("unknown model (Decode)", "Decode", pb.DecodeTokensRequest(model="nope"), ["model:", ALL_MODELS])
case("unknown model (DetokenizeStep)", "DetokenizeStep", pb.DetokenizeStepRequest(model="nope"), ["model:"])
case(
    "unknown model (ApplyChatTemplate)",
    "ApplyChatTemplate",
    pb.ApplyChatTemplateRequest(model="nope", messages=[msg("user")]),
    ["model:", ALL_MODELS],
)
case(
    "text over the byte limit",
    "Encode",
    pb.EncodeRequest(texts=["ok", "x" * (TEST_MAX_TEXT_BYTES + 1)]),
    ["texts[1]:", str(TEST_MAX_TEXT_BYTES + 1), str(TEST_MAX_TEXT_BYTES)],
)
case(
    "text over the byte limit in multi-byte characters",
    "Encode",
    pb.EncodeRequest(texts=["ñ" * (TEST_MAX_TEXT_BYTES // 2 + 1)]),
    ["texts[0]:", "UTF-8 bytes", str(TEST_MAX_TEXT_BYTES)],
)
case(
    "too many texts",
    "Encode",
    pb.EncodeRequest(texts=["a"] * (TEST_MAX_BATCH_SIZE + 1)),
    ["texts:", str(TEST_MAX_BATCH_SIZE), str(TEST_MAX_BATCH_SIZE + 1)],
)
case(
    "too many sequences",
    "Decode",
    pb.DecodeTokensRequest(sequences=[pb.TokenIds(ids=[1])] * (TEST_MAX_BATCH_SIZE + 1)),
    ["sequences:", str(TEST_MAX_BATCH_SIZE)],
)
case(
    "id outside the vocabulary",
    "Decode",
    pb.DecodeTokensRequest(sequences=[pb.TokenIds(ids=[5]), pb.TokenIds(ids=[1, 2, BPE_VOCAB])]),
    ["sequences[1].ids[2]:", f"id {BPE_VOCAB}", f"vocab_size {BPE_VOCAB}"],
)
case(
    "sequence too long",
    "Decode",
    pb.DecodeTokensRequest(sequences=[pb.TokenIds(ids=[1] * (TEST_MAX_SEQUENCE_IDS + 1))]),
    ["sequences[0].ids:", str(TEST_MAX_SEQUENCE_IDS)],
)
case(
    "stream id outside the vocabulary",
    "DetokenizeStep",
    pb.DetokenizeStepRequest(streams=[stream([3, 10**6])]),
    ["streams[0].ids[1]:", "id 1000000", f"vocab_size {BPE_VOCAB}"],
)
case(
    "read offset past the window",
    "DetokenizeStep",
    pb.DetokenizeStepRequest(streams=[stream([1, 2]), stream([3], read_offset=2)]),
    ["streams[1].read_offset:", "is 2", "1 ids"],
)
case(
    "too many streams",
    "DetokenizeStep",
    pb.DetokenizeStepRequest(streams=[stream([1])] * (TEST_MAX_BATCH_SIZE + 1)),
    ["streams:", str(TEST_MAX_BATCH_SIZE)],
)
case(
    "window too long",
    "DetokenizeStep",
    pb.DetokenizeStepRequest(streams=[stream([1] * (TEST_MAX_SEQUENCE_IDS + 1))]),
    ["streams[0].ids:", str(TEST_MAX_SEQUENCE_IDS)],
)
case("no messages", "ApplyChatTemplate", pb.ApplyChatTemplateRequest(), ["messages:", "at least one"])
case(
    "empty role",
    "ApplyChatTemplate",
    pb.ApplyChatTemplateRequest(messages=[msg("user"), msg(" ")]),
    ["messages[1].role:", "empty"],
)
case(
    "too many messages",
    "ApplyChatTemplate",
    pb.ApplyChatTemplateRequest(messages=[msg("user")] * (TEST_MAX_MESSAGES + 1)),
    ["messages:", str(TEST_MAX_MESSAGES)],
)
case(
    "messages over the byte limit",
    "ApplyChatTemplate",
    pb.ApplyChatTemplateRequest(messages=[msg("user", "x" * TEST_MAX_TEXT_BYTES)]),
    ["messages:", str(TEST_MAX_TEXT_BYTES)],
)
case(
    "template rejects a role",
    "ApplyChatTemplate",
    pb.ApplyChatTemplateRequest(model="llama3", messages=[msg("robot")]),
    ["messages:", "Unknown role: robot"],
)
case(
    "model without a chat template",
    "ApplyChatTemplate",
    pb.ApplyChatTemplateRequest(model="wordpiece", messages=[msg("user")]),
    ["'wordpiece'", "no chat template"],
    status=grpc.StatusCode.FAILED_PRECONDITION,
)


def assert_still_serving(stub) -> None:
    reply = stub.Encode(pb.EncodeRequest(texts=SAMPLE_TEXTS))
    decoded = stub.Decode(pb.DecodeTokensRequest(sequences=[pb.TokenIds(ids=e.ids) for e in reply.encodings]))
    assert list(decoded.texts) == SAMPLE_TEXTS


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_input_is_refused_with_the_field_and_the_limit(tokenizer_stub, case):
    method, request, status, fragments = CASES[case]
    with pytest.raises(grpc.RpcError) as info:
        getattr(tokenizer_stub, method)(request, timeout=30)
    assert info.value.code() == status, info.value.details()
    details = info.value.details()
    if status == INVALID:
        assert details.startswith(fragments[0]), details
    for fragment in fragments:
        assert fragment in details, details
    assert "Traceback" not in details
    assert_still_serving(tokenizer_stub)


def test_exactly_at_the_limits_is_accepted(tokenizer_stub):
    texts = ["x" * TEST_MAX_TEXT_BYTES] + ["a"] * (TEST_MAX_BATCH_SIZE - 1)
    assert len(tokenizer_stub.Encode(pb.EncodeRequest(texts=texts)).encodings) == TEST_MAX_BATCH_SIZE
    ids = pb.TokenIds(ids=[BPE_VOCAB - 1] * TEST_MAX_SEQUENCE_IDS)
    assert len(tokenizer_stub.Decode(pb.DecodeTokensRequest(sequences=[ids])).texts) == 1
    messages = [msg("user")] * TEST_MAX_MESSAGES
    assert tokenizer_stub.ApplyChatTemplate(pb.ApplyChatTemplateRequest(messages=messages)).text


def test_bad_requests_do_not_disturb_requests_running_alongside(tokenizer_stub):
    good = pb.EncodeRequest(texts=SAMPLE_TEXTS)
    expected = [list(e.ids) for e in tokenizer_stub.Encode(good).encodings]
    bad = [CASES[name][:2] for name in sorted(CASES)]

    def call_good(_):
        return [list(e.ids) for e in tokenizer_stub.Encode(good, timeout=30).encodings]

    def call_bad(index):
        method, request = bad[index % len(bad)]
        try:
            getattr(tokenizer_stub, method)(request, timeout=30)
        except grpc.RpcError as exc:
            return exc.code()
        return None

    with ThreadPoolExecutor(8) as pool:
        good_futures = [pool.submit(call_good, i) for i in range(40)]
        bad_futures = [pool.submit(call_bad, i) for i in range(40)]
        assert all(f.result() == expected for f in good_futures)
        assert all(f.result() in (INVALID, grpc.StatusCode.FAILED_PRECONDITION) for f in bad_futures)


@pytest.fixture(scope="module")
def small_message_stub(tokenizer_folders, tmp_path_factory):
    """A service whose gRPC messages may not exceed 200 kB."""
    service = ServiceProcess(
        "tokenizer",
        ["--models", str(tokenizer_folders["bpe"]), "--max-message-bytes", "200000"],
        tmp_path_factory.mktemp("small-messages"),
    )
    try:
        with grpc.insecure_channel(service.address, options=[("grpc.max_receive_message_length", 1 << 24)]) as channel:
            yield tokenizer_pb2_grpc.TokenizerStub(channel)
    finally:
        service.stop()


def test_a_reply_over_the_message_limit_is_refused_before_sending(small_message_stub):
    # 60 kB of text in, several times that out (ids, token strings and offsets).
    request = pb.EncodeRequest(texts=["ab cd " * 10_000], return_offsets=True)
    with pytest.raises(grpc.RpcError) as info:
        small_message_stub.Encode(request, timeout=30)
    assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "over the message limit of 200000" in info.value.details()
    assert len(small_message_stub.Encode(pb.EncodeRequest(texts=["ab cd"])).encodings[0].ids) > 0

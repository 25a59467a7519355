"""DecodeSteps (Decode on one open stream) gives what Decode gives, and ends the stream on bad input."""

from __future__ import annotations

import queue

import grpc
import numpy as np
import pytest

from muestra.v1 import lm_pb2
from tests.lm.lm_client import decode, logits, prefill, prompts, torch_last_logits

STEPS = 8
_END = object()


class OpenStream:
    """One DecodeSteps call driven a request at a time: step(request) sends it and waits for its reply."""

    def __init__(self, stub) -> None:
        self._requests: queue.Queue = queue.Queue()
        self._replies = stub.DecodeSteps(iter(self._requests.get, _END))

    def step(self, request: lm_pb2.DecodeRequest) -> lm_pb2.DecodeResponse:
        self._requests.put(request)
        return next(self._replies)

    def close(self) -> None:
        self._requests.put(_END)
        assert list(self._replies) == []


def one_step(batch_id: str, next_ids) -> lm_pb2.DecodeRequest:
    return lm_pb2.DecodeRequest(batches=[lm_pb2.DecodeBatch(batch_id=batch_id, next_ids=list(next_ids))])


def test_steps_on_one_stream_equal_unary_decode_and_a_full_recompute(lm_service, served_lm):
    service = lm_service("llama")
    model = served_lm("llama").torch_model()
    sequences = prompts((5, 9), model.config.vocab_size, seed=7)
    unary, streamed = prefill(service.stub, sequences), prefill(service.stub, sequences)
    batch_unary, batch_streamed = unary.batch_id, streamed.batch_id
    got_unary = logits(unary.output)
    stream = OpenStream(service.stub)
    worst_stream, worst_torch = 0.0, 0.0
    for _ in range(STEPS):
        next_ids = got_unary.argmax(axis=-1).tolist()
        for sequence, token in zip(sequences, next_ids, strict=True):
            sequence.append(token)
        reply = decode(service.stub, (batch_unary, next_ids))
        batch_unary, got_unary = reply.batch_id, logits(reply.output)
        streamed = stream.step(one_step(batch_streamed, next_ids))
        batch_streamed, got_streamed = streamed.batch_id, logits(streamed.output)
        worst_stream = max(worst_stream, float(np.abs(got_streamed - got_unary).max()))
        for row, sequence in enumerate(sequences):
            worst_torch = max(worst_torch, float(np.abs(got_streamed[row] - torch_last_logits(model, sequence)).max()))
    stream.close()
    assert worst_stream == 0.0
    assert worst_torch <= 1e-4
    service.stub.Clear(lm_pb2.ClearRequest(batch_ids=[batch_unary, batch_streamed]))


def test_a_bad_step_ends_the_stream_with_invalid_argument_and_the_service_keeps_serving(lm_service):
    service = lm_service("llama")
    (prompt,) = prompts((4,), 64, seed=9)
    reply = prefill(service.stub, [prompt], kind=lm_pb2.ARGMAX)
    stream = OpenStream(service.stub)
    answer = stream.step(one_step(reply.batch_id, [3]))
    with pytest.raises(grpc.RpcError) as raised:
        stream.step(one_step("no-such-batch", [1]))
    assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "batches[0].batch_id" in raised.value.details()
    # The batch the stream had advanced is intact, and a new stream goes on from it.
    again = OpenStream(service.stub)
    answer = again.step(one_step(answer.batch_id, [answer.output.rows[0].argmax]))
    again.close()
    service.stub.Clear(lm_pb2.ClearRequest(batch_ids=[answer.batch_id]))

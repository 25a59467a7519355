"""BatchSteps (Decode, Filter and Clear on one open stream) gives what the unary calls give, and ends
the stream on bad input."""

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
    """One BatchSteps call driven a request at a time: step(request) sends it and waits for its reply."""

    def __init__(self, stub) -> None:
        self._requests: queue.Queue = queue.Queue()
        self._replies = stub.BatchSteps(iter(self._requests.get, _END))

    def step(self, request) -> lm_pb2.DecodeResponse:
        """A DecodeRequest's reply; other steps (filter, clear) through send()."""
        return self.send(lm_pb2.BatchStepRequest(decode=request)).decode

    def send(self, request: lm_pb2.BatchStepRequest) -> lm_pb2.BatchStepResponse:
        self._requests.put(request)
        reply = next(self._replies)
        assert reply.WhichOneof("step") == request.WhichOneof("step")
        return reply

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
    # Filter on the stream (row 1 twice, as n > 1 or a beam would) equals Filter then Decode by unary calls.
    unary_kept = service.stub.Filter(lm_pb2.FilterRequest(batch_id=batch_unary, rows=[1, 1])).batch_id
    kept = stream.send(lm_pb2.BatchStepRequest(filter=lm_pb2.FilterRequest(batch_id=batch_streamed, rows=[1, 1])))
    assert kept.filter.num_rows == 2
    token = int(got_unary[1].argmax())
    unary_after = logits(decode(service.stub, (unary_kept, [token, token])).output)
    streamed = stream.step(one_step(kept.filter.batch_id, [token, token]))
    assert np.array_equal(logits(streamed.output), unary_after)
    # Clear on the stream frees the batch: the service holds no rows of it afterwards.
    rows_before = service.stub.Describe(lm_pb2.DescribeModelRequest()).load.rows
    cleared = stream.send(lm_pb2.BatchStepRequest(clear=lm_pb2.ClearRequest(batch_ids=[streamed.batch_id])))
    assert cleared.clear.load.rows == rows_before - 2
    stream.close()
    assert worst_stream == 0.0
    assert worst_torch <= 1e-4
    service.stub.Clear(lm_pb2.ClearRequest(batch_ids=[batch_unary, unary_kept]))


def test_an_empty_step_is_refused_naming_the_field(lm_service):
    stream = OpenStream(lm_service("llama").stub)
    with pytest.raises(grpc.RpcError) as raised:
        stream.send(lm_pb2.BatchStepRequest())
    assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "step" in raised.value.details()


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

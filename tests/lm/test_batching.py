"""Rows are independent of their batch: joining (Decode over several batches) and leaving (Filter)."""

from __future__ import annotations

import numpy as np
import pytest

from muestra.v1 import lm_pb2
from tests.lm.lm_client import decode, logits, prefill, prompts

VOCAB = 1024


def describe(stub) -> lm_pb2.DescribeModelResponse:
    return stub.Describe(lm_pb2.DescribeModelRequest())


@pytest.mark.parametrize("model", ["llama-concat", "llama"], ids=["concat-kv", "shared-kv"])
def test_row_logits_are_the_same_alone_and_while_rows_join_and_leave(lm_service, model):
    stub = lm_service(model).stub
    a, b, c = prompts([5, 13, 8], VOCAB, seed=3)
    # Row A alone: one prefill and six steps, feeding a fixed token sequence.
    feed = prompts([6], VOCAB, seed=4)[0]
    reply = prefill(stub, [a])
    alone = [logits(reply.output)[0]]
    for token in feed:
        reply = decode(stub, (reply.batch_id, [token]))
        alone.append(logits(reply.output)[0])
    stub.Clear(lm_pb2.ClearRequest(batch_ids=[reply.batch_id]))

    # Row A with B (padded differently), then C joins from its own batch, then B leaves.
    together = []
    ab = prefill(stub, [b, a])
    together.append(logits(ab.output)[1])
    ab = decode(stub, (ab.batch_id, [feed[0], feed[0]]))
    together.append(logits(ab.output)[1])
    cc = prefill(stub, [c])
    joined = decode(stub, (ab.batch_id, [7, feed[1]]), (cc.batch_id, [logits(cc.output)[0].argmax()]))
    assert len(joined.output.rows) == 3
    together.append(logits(joined.output)[1])
    left = stub.Filter(lm_pb2.FilterRequest(batch_id=joined.batch_id, rows=[2, 1]))
    assert left.num_rows == 2
    reply = decode(stub, (left.batch_id, [9, feed[2]]))
    together.append(logits(reply.output)[1])
    for token in feed[3:]:
        reply = decode(stub, (reply.batch_id, [9, token]))
        together.append(logits(reply.output)[1])
    stub.Clear(lm_pb2.ClearRequest(batch_ids=[reply.batch_id]))

    assert len(together) == len(alone)
    for step, (x, y) in enumerate(zip(alone, together, strict=True)):
        assert np.abs(x - y).max() <= 1e-4, f"step {step}"


@pytest.mark.parametrize("model", ["llama-concat", "llama"], ids=["concat-kv", "shared-kv"])
def test_filter_with_repeated_rows_copies_them(lm_service, model):
    stub = lm_service(model).stub
    batch = prompts([4, 10], VOCAB, seed=5)
    original = prefill(stub, batch)
    copy = prefill(stub, batch)
    filtered = stub.Filter(lm_pb2.FilterRequest(batch_id=copy.batch_id, rows=[1, 1, 0]))
    assert filtered.num_rows == 3
    expected = logits(decode(stub, (original.batch_id, [11, 22])).output)
    got = logits(decode(stub, (filtered.batch_id, [22, 22, 11])).output)
    assert np.abs(got[0] - expected[1]).max() <= 1e-4
    assert np.abs(got[1] - expected[1]).max() <= 1e-4
    assert np.abs(got[2] - expected[0]).max() <= 1e-4
    stub.Clear(lm_pb2.ClearRequest())


def test_filter_drops_left_padding_no_row_needs(lm_service):
    stub = lm_service("llama-concat", "--max-batch-rows", "8").stub
    stub.Clear(lm_pb2.ClearRequest())
    info = describe(stub)
    per_token = 2 * info.kv.num_layers * info.kv.num_kv_heads * info.kv.head_dim * 4
    reply = prefill(stub, prompts([3, 40, 6], VOCAB, seed=6))
    assert describe(stub).load.kv_bytes == 3 * 40 * per_token
    short = stub.Filter(lm_pb2.FilterRequest(batch_id=reply.batch_id, rows=[2, 0]))
    assert describe(stub).load.kv_bytes == 2 * 6 * per_token
    reply = decode(stub, (short.batch_id, [1, 2]))
    assert describe(stub).load == lm_pb2.ServiceLoad(
        batches=1, rows=2, kv_bytes=2 * 7 * per_token, kv_budget_bytes=info.load.kv_budget_bytes
    )
    empty = stub.Filter(lm_pb2.FilterRequest(batch_id=reply.batch_id, rows=[]))
    assert (empty.batch_id, empty.num_rows) == ("", 0)
    assert describe(stub).load.batches == 0

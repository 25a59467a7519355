"""A Decode may append several tokens per row (tokens_per_row): its logits are those after each row's last
token, as a full recompute gives them, and later single steps go on from there."""

from __future__ import annotations

import grpc
import numpy as np
import pytest

from muestra.v1 import lm_pb2
from tests.fixtures.lm_service import SERVED_MODELS
from tests.lm.lm_client import logits, prefill, prompts, torch_last_logits


def step(stub, batch_id: str, rows: list[list[int]]):
    """One Decode appending rows[i] to row i (every row the same number of tokens)."""
    request = lm_pb2.DecodeRequest(tokens_per_row=len(rows[0]))
    request.batches.add(batch_id=batch_id, next_ids=[t for row in rows for t in row])
    return stub.Decode(request)


@pytest.mark.parametrize("family", SERVED_MODELS)
def test_several_tokens_per_row_equal_a_full_recompute(lm_service, served_lm, family):
    service = lm_service(family)
    model = served_lm(family).torch_model()
    vocab = model.config.vocab_size
    sequences = prompts((3, 11, 6), vocab, seed=5)
    reply = prefill(service.stub, sequences)
    rng = np.random.default_rng(7)
    worst = 0.0
    for tokens in (4, 1, 3, 2):
        appended = rng.integers(2, vocab, (len(sequences), tokens)).tolist()
        reply = step(service.stub, reply.batch_id, appended)
        for sequence, more in zip(sequences, appended, strict=True):
            sequence.extend(more)
        got = logits(reply.output)
        for row, sequence in enumerate(sequences):
            worst = max(worst, float(np.abs(got[row] - torch_last_logits(model, sequence)).max()))
    assert worst <= 1e-4
    service.stub.Clear(lm_pb2.ClearRequest(batch_ids=[reply.batch_id]))


def test_tokens_per_row_has_a_limit_and_must_fit_the_ids(lm_service):
    stub = lm_service("llama").stub
    reply = prefill(stub, prompts((4, 5), 1024, seed=1))
    cases = [
        (lm_pb2.DecodeRequest(tokens_per_row=33), "tokens_per_row: "),
        (lm_pb2.DecodeRequest(tokens_per_row=3), "got 2 ids for a batch of 2 rows x 3 tokens_per_row"),
    ]
    for request, message in cases:
        request.batches.add(batch_id=reply.batch_id, next_ids=[5, 6])
        with pytest.raises(grpc.RpcError) as info:
            stub.Decode(request)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT and message in info.value.details()
    stub.Clear(lm_pb2.ClearRequest(batch_ids=[reply.batch_id]))

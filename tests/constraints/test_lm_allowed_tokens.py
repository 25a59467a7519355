"""The lm applies a row's allowed-token bitmask before its argmax, top-n and logits, for that step only."""

from __future__ import annotations

import grpc
import numpy as np
import pytest

from muestra.v1 import lm_pb2
from tests.lm.lm_client import logits, prompts

VOCAB = 1024


def bitmask(allowed, vocab: int = VOCAB) -> bytes:
    """Bit (i % 8) of byte (i / 8) set for every allowed id, in 32-bit words as llguidance fills them."""
    words = np.zeros((vocab + 31) // 32, dtype=np.uint32)
    for token in allowed:
        words[token // 32] |= np.uint32(1 << (token % 32))
    return words.astype("<u4").tobytes()


def row(ids, kind, allowed=(), top_n=0):
    output = lm_pb2.OutputSpec(kind=kind, top_n=top_n, allowed_tokens=bitmask(allowed) if allowed else b"")
    return lm_pb2.PrefillRow(input_ids=ids, output=output)


def test_masked_rows_see_only_their_allowed_tokens(lm_service):
    stub = lm_service("llama").stub
    batch = prompts([5, 7, 9], VOCAB, seed=3)
    full = logits(stub.Prefill(lm_pb2.PrefillRequest(rows=[lm_pb2.PrefillRow(input_ids=p) for p in batch])).output)
    allowed = [[3, 40, 700, 1023], [17], [int(np.argsort(full[2])[-2]), 900]]
    reply = stub.Prefill(
        lm_pb2.PrefillRequest(
            rows=[
                row(batch[0], lm_pb2.LOGITS, allowed[0]),
                row(batch[1], lm_pb2.ARGMAX, allowed[1]),
                row(batch[2], lm_pb2.TOP_N, allowed[2], top_n=5),
            ]
        )
    )
    masked = logits(reply.output)[0]
    assert np.isneginf(np.delete(masked, allowed[0])).all()
    np.testing.assert_allclose(masked[allowed[0]], full[0][allowed[0]], atol=1e-4)
    assert reply.output.rows[0].argmax == allowed[0][int(np.argmax(full[0][allowed[0]]))]
    assert reply.output.rows[1].argmax == 17  # the one allowed token, whatever the model prefers
    top = reply.output.rows[2]
    expected = sorted(allowed[2], key=lambda t: -full[2][t])
    assert list(top.top_ids[:2]) == expected and np.isneginf(top.top_logits[2:]).all()

    # The mask was for that step only: a Decode that sends no outputs keeps the kinds, not the masks.
    step = stub.Decode(lm_pb2.DecodeRequest(batches=[lm_pb2.DecodeBatch(batch_id=reply.batch_id, next_ids=[5, 6, 7])]))
    assert np.isfinite(logits(step.output)[0]).all()
    stub.Clear(lm_pb2.ClearRequest(batch_ids=[step.batch_id]))


@pytest.mark.parametrize(
    ("mask", "message"),
    [
        (b"\xff" * (VOCAB // 8 + 4), "a vocabulary of 1024 takes at most 128"),
        (b"\x00" * 8, "allows no token"),
    ],
)
def test_a_bad_mask_is_invalid_argument_naming_the_field(lm_service, mask, message):
    stub = lm_service("llama").stub
    request = lm_pb2.PrefillRequest(
        rows=[lm_pb2.PrefillRow(input_ids=[5, 6], output=lm_pb2.OutputSpec(kind=lm_pb2.ARGMAX, allowed_tokens=mask))]
    )
    with pytest.raises(grpc.RpcError) as info:
        stub.Prefill(request)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "rows[0].output.allowed_tokens" in info.value.details() and message in info.value.details()

"""TOP_N and ARGMAX outputs agree with the full logits of the same rows; draft positions pack after their rows."""

from __future__ import annotations

import numpy as np
import torch

from muestra.lm.outputs import batch_output
from muestra.v1 import lm_pb2
from tests.lm.lm_client import logits, prompts

TOP_N = 5


def test_top_n_and_argmax_agree_with_full_logits(lm_service):
    stub = lm_service("llama").stub
    batch = prompts([6, 12, 3, 9], 1024, seed=8)
    kinds = [lm_pb2.TOP_N, lm_pb2.LOGITS, lm_pb2.ARGMAX, lm_pb2.TOP_N]
    mixed = stub.Prefill(
        lm_pb2.PrefillRequest(
            rows=[
                lm_pb2.PrefillRow(input_ids=p, output=lm_pb2.OutputSpec(kind=k, top_n=TOP_N))
                for p, k in zip(batch, kinds, strict=True)
            ]
        )
    )
    full = logits(
        stub.Prefill(
            lm_pb2.PrefillRequest(rows=[lm_pb2.PrefillRow(input_ids=p) for p in batch])  # unspecified = LOGITS
        ).output
    )
    assert full.shape == (4, 1024)
    rows = mixed.output.rows
    assert [r.logits_row for r in rows] == [-1, 0, -1, -1]
    assert np.abs(logits(mixed.output)[0] - full[1]).max() <= 1e-4
    for i, row in enumerate(rows):
        assert row.argmax == int(np.argmax(full[i]))
    for i in (0, 3):
        reference = torch.topk(torch.from_numpy(full[i].copy()), TOP_N)
        assert list(rows[i].top_ids) == reference.indices.tolist()
        np.testing.assert_allclose(rows[i].top_logits, reference.values.numpy(), atol=1e-4)
        assert abs(rows[i].logsumexp - torch.logsumexp(torch.from_numpy(full[i].copy()), 0).item()) <= 1e-4
    assert not rows[1].top_ids and not rows[2].top_ids
    stub.Clear(lm_pb2.ClearRequest(batch_ids=[mixed.batch_id]))


def test_draft_positions_pack_after_their_rows_whatever_the_other_rows_want():
    """An ARGMAX row, a LOGITS row with one draft and a plain LOGITS row: three logits rows in all, as many as
    there are rows, yet packed as the rows' positions (the drafting row's two, then the plain row's)."""
    rng = np.random.default_rng(0)
    last = rng.standard_normal((3, 11)).astype(np.float32)
    extra = rng.standard_normal((1, 11)).astype(np.float32)
    specs = [(lm_pb2.ARGMAX, 0), (lm_pb2.LOGITS, 0), (lm_pb2.LOGITS, 0)]
    out = batch_output(last, specs, draft_logits=[None, extra, None], accepted=[None, None, None])
    packed = np.frombuffer(out.logits.data, dtype="<f4").reshape(tuple(out.logits.shape))
    assert [row.logits_row for row in out.rows] == [-1, 0, 2]
    assert [row.positions for row in out.rows] == [0, 2, 0]
    np.testing.assert_array_equal(packed, np.concatenate([last[1:2], extra, last[2:3]]))
    assert out.rows[0].argmax == int(last[0].argmax())

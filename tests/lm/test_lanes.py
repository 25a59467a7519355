"""Rows far longer than their neighbours keep a KV buffer of their own (lanes): the batch answers exactly as one
buffer would, through steps, bursts, drafts, rollbacks and filters that reorder and repeat rows."""

from __future__ import annotations

import numpy as np
import pytest

from muestra.lm import lanes
from muestra.lm.engine import Engine
from muestra.lm.engine_io import DecodeInput, PrefillInput
from muestra.lm.lanes import Lanes
from muestra.lm.model import OnnxDecoder
from muestra.v1 import lm_pb2
from tests.fixtures.lm_models import MAX_POSITIONS
from tests.lm.lm_client import prompts

FULL = (lm_pb2.LOGITS, 0)


def run(engine: Engine, lengths: list[int]) -> list[np.ndarray]:
    """Rows of these prompt lengths joined in one Decode, then a script of steps; every step's logits."""
    rows = [np.array(p) for p in prompts(lengths, engine.info.vocab_size, seed=17)]
    batches = [
        engine.prefill([PrefillInput(str(i), ids, FULL, suppressed=np.array([3, 4]))]).batch_id
        for i, ids in enumerate(rows)
    ]
    seen = []
    step = engine.decode([DecodeInput(b, np.array([5]), None) for b in batches])
    seen.append(step.logits)
    batch = step.batch_id
    step = engine.decode([DecodeInput(batch, np.array([6, 7, 8, 9]), None)])
    seen.append(step.logits)
    # Drafts on two rows, then the caller's rollback of one of them.
    drafts = [np.array([11, 12]), np.array([], np.int64), np.array([13]), np.array([], np.int64)]
    step = engine.decode([DecodeInput(step.batch_id, np.array([1, 2, 3, 4]), None, drafts=drafts)])
    seen += [step.logits, *(d for d in step.draft_logits if d is not None)]
    step = engine.decode([DecodeInput(step.batch_id, np.array([5, 5, 5, 5]), None, rollback=np.array([1, 0, 0, 0]))])
    seen.append(step.logits)
    # A filter that reorders and repeats rows, then a greedy burst.
    batch, _ = engine.filter(step.batch_id, [3, 0, 0, 2])
    step = engine.decode([DecodeInput(batch, np.array([8, 8, 8, 8]), [(lm_pb2.ARGMAX, 0)] * 4)], greedy_steps=3)
    seen += [step.logits, step.greedy_ids.astype(np.float32)]
    kept = engine.batches[step.batch_id]
    seen.append(np.array([kept.row_ids(r)[-4:] for r in range(kept.rows)], np.float32))
    seen.append(np.array(kept.lengths, np.float32))
    return seen, kept


@pytest.mark.parametrize("family", ["llama", "llama-concat"])
def test_lanes_answer_as_one_buffer_would(served_lm, family, monkeypatch):
    decoder = OnnxDecoder(served_lm(family).onnx_dir, providers="cpu", intra_op_threads=1, context_length=MAX_POSITIONS)
    lengths = [6, 300, 9, 280]  # two long rows among short ones, interleaved
    expected, one = run(Engine(decoder, max_batch_rows=8, kv_budget_bytes=1 << 30, max_top_n=8), lengths)
    assert not isinstance(one, Lanes)
    monkeypatch.setattr(lanes, "LANE_WASTE_BYTES", 0)
    got, kept = run(Engine(decoder, max_batch_rows=8, kv_budget_bytes=1 << 30, max_top_n=8), lengths)
    assert isinstance(kept, Lanes) and len(kept.lanes) >= 2
    for a, b in zip(got, expected, strict=True):
        assert a.shape == b.shape and np.array_equal(np.isinf(a), np.isinf(b))  # the suppressed ids, -inf
        finite = np.isfinite(b)
        assert np.abs(a[finite] - b[finite]).max() <= 1e-5


def test_a_long_row_joins_short_ones_in_a_lane_of_its_own_and_they_merge_once_it_leaves(served_lm):
    decoder = OnnxDecoder(
        served_lm("llama").onnx_dir, providers="cpu", intra_op_threads=1, context_length=MAX_POSITIONS
    )
    engine = Engine(decoder, max_batch_rows=8, kv_budget_bytes=1 << 30, max_top_n=8)
    short, long = (np.array(p) for p in prompts([6, 400], decoder.info.vocab_size, seed=3))
    # A buffer's padding for the short rows costs more than the limit, at this model's bytes per position.
    per_position = decoder.kv_bytes_per_token
    padded = 3 * (512 - 256) * per_position
    a = engine.prefill([PrefillInput(str(i), short, FULL) for i in range(3)]).batch_id
    b = engine.prefill([PrefillInput("long", long, FULL)]).batch_id
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(lanes, "LANE_WASTE_BYTES", padded - 1)
        joined = engine.decode([DecodeInput(a, np.array([5, 5, 5]), None), DecodeInput(b, np.array([5]), None)])
        batch = engine.batches[joined.batch_id]
        assert isinstance(batch, Lanes) and [lane.rows for lane in batch.lanes] == [3, 1]
        assert engine.load().kv_bytes == batch.nbytes < 4 * 512 * per_position
        alone, _ = engine.filter(joined.batch_id, [0, 1, 2])
        assert not isinstance(engine.batches[alone], Lanes)

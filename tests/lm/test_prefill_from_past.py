"""The engine's prefill can start a row from a given past (the seam the prefix cache will use)."""

from __future__ import annotations

import numpy as np
import pytest

from muestra.lm.engine import Engine
from muestra.lm.engine_io import DecodeInput, PrefillInput
from muestra.lm.model import OnnxDecoder
from muestra.v1 import lm_pb2
from tests.fixtures.lm_models import MAX_POSITIONS
from tests.fixtures.lm_service import SERVED_MODELS
from tests.lm.lm_client import prompts

FULL = (lm_pb2.LOGITS, 0)


@pytest.mark.parametrize("family", SERVED_MODELS)
def test_prefill_after_a_given_past_equals_prefilling_the_whole_prompt(served_lm, family):
    decoder = OnnxDecoder(served_lm(family).onnx_dir, providers="cpu", intra_op_threads=1, context_length=MAX_POSITIONS)
    engine = Engine(decoder, max_batch_rows=8, kv_budget_bytes=1 << 30, max_top_n=8)
    head, tail, other = (np.array(p) for p in prompts([9, 4, 6], decoder.info.vocab_size, seed=11))
    whole_prompt = np.concatenate([head, tail])
    whole = engine.prefill([PrefillInput("whole", whole_prompt, FULL), PrefillInput("other", other, FULL)])
    first = engine.prefill([PrefillInput("head", head, FULL)])
    past = engine.batches[first.batch_id].kv.row_arrays(0, len(head))
    # The row with a past comes first: the engine runs it apart and must restore the row order.
    split = engine.prefill([PrefillInput("tail", tail, FULL, past=past), PrefillInput("other", other, FULL)])
    assert np.abs(split.logits[0] - whole.logits[0]).max() <= 1e-4
    assert np.abs(split.logits[1] - whole.logits[1]).max() <= 1e-4
    assert engine.batches[split.batch_id].request_ids == ["tail", "other"]

    next_ids = np.array([5, 7])
    expected = engine.decode([DecodeInput(whole.batch_id, next_ids, None)]).logits
    got = engine.decode([DecodeInput(split.batch_id, next_ids, None)]).logits
    assert np.abs(got - expected).max() <= 1e-4

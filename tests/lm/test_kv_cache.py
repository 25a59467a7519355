"""The KV cache changes nothing: cached decode steps give the logits of a full recompute."""

from __future__ import annotations

import numpy as np
import pytest

from tests.fixtures.lm_service import SERVED_MODELS
from tests.lm.lm_client import decode, logits, prefill, prompts, torch_last_logits

STEPS = 12


@pytest.mark.parametrize("family", SERVED_MODELS)
@pytest.mark.parametrize("lengths", [(7,), (3, 11, 6)], ids=["batch-1", "left-padded-batch"])
def test_cached_decode_logits_equal_full_recompute_at_every_step(lm_service, served_lm, family, lengths):
    service = lm_service(family)
    model = served_lm(family).torch_model()
    sequences = prompts(lengths, model.config.vocab_size, seed=len(lengths))
    reply = prefill(service.stub, sequences)
    worst = 0.0
    for _ in range(STEPS):
        got = logits(reply.output)
        for row, sequence in enumerate(sequences):
            worst = max(worst, float(np.abs(got[row] - torch_last_logits(model, sequence)).max()))
        next_ids = got.argmax(axis=-1).tolist()
        for sequence, token in zip(sequences, next_ids, strict=True):
            sequence.append(token)
        reply = decode(service.stub, (reply.batch_id, next_ids))
    assert worst <= 1e-4

"""A long prompt prefilled a chunk at a time (other calls may run between chunks) gives the batch one forward
would: the same logits, the same KV, the same tokens after it."""

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


def chunked(engine: Engine, row: PrefillInput, chunk: int, between=lambda: None):
    job = engine.begin_prefill(row, "", chunk)
    while (result := engine.prefill_chunk(job)) is None:
        between()
    return result, job


def greedy(engine: Engine, batch_id: str, first: int, steps: int) -> list[int]:
    ids, token = [], first
    for _ in range(steps):
        result = engine.decode([DecodeInput(batch_id, np.array([token]), None)])
        batch_id, token = result.batch_id, int(result.logits[0].argmax())
        ids.append(token)
    return ids


@pytest.mark.parametrize("family", SERVED_MODELS)
def test_a_chunked_prefill_gives_the_logits_and_tokens_of_one_forward(served_lm, family):
    decoder = OnnxDecoder(served_lm(family).onnx_dir, providers="cpu", intra_op_threads=1, context_length=MAX_POSITIONS)
    engine = Engine(decoder, max_batch_rows=8, kv_budget_bytes=1 << 30, max_top_n=8)
    (prompt,) = (np.array(p) for p in prompts([301], decoder.info.vocab_size, seed=7))
    whole = engine.prefill([PrefillInput("whole", prompt, FULL)])
    expected = greedy(engine, whole.batch_id, int(whole.logits[0].argmax()), 12)
    for chunk in (16, 100, 300):
        result, job = chunked(engine, PrefillInput("chunked", prompt, FULL), chunk)
        assert job.chunks == -(-prompt.size // chunk)
        # The attention after a past rounds apart from one over the whole prompt in the last bits: up to 2.4e-7
        # on these float graphs (measured; bitwise on the default model's), never enough to change a token here.
        assert np.abs(result.logits - whole.logits).max() <= 1e-5, chunk
        assert greedy(engine, result.batch_id, int(result.logits[0].argmax()), 12) == expected, chunk


def test_decode_steps_of_other_rows_run_between_chunks_and_the_reservation_is_freed(served_lm):
    decoder = OnnxDecoder(
        served_lm("llama").onnx_dir, providers="cpu", intra_op_threads=1, context_length=MAX_POSITIONS
    )
    engine = Engine(decoder, max_batch_rows=8, kv_budget_bytes=1 << 30, max_top_n=8)
    running, long = (np.array(p) for p in prompts([12, 200], decoder.info.vocab_size, seed=9))
    alone = engine.prefill([PrefillInput("running", running, FULL)])
    expected = greedy(engine, alone.batch_id, 5, 8)
    engine.clear([alone.batch_id])

    batch = {"id": engine.prefill([PrefillInput("running", running, FULL)]).batch_id}
    got = []

    def step():
        result = engine.decode([DecodeInput(batch["id"], np.array([got[-1] if got else 5]), None)])
        batch["id"] = result.batch_id
        got.append(int(result.logits[0].argmax()))

    result, _ = chunked(engine, PrefillInput("long", long, FULL), 32, between=step)
    assert got == expected[: len(got)] and len(got) == 6
    cold = engine.prefill([PrefillInput("cold", long, FULL)])
    assert np.abs(result.logits - cold.logits).max() <= 1e-5
    engine.clear([result.batch_id, cold.batch_id])

    held = engine.load().kv_bytes
    job = engine.begin_prefill(PrefillInput("left", long, FULL), "", 32)
    assert engine.load().kv_bytes > held  # the whole prompt's KV is reserved from the start
    engine.prefill_chunk(job)
    engine.abandon_prefill(job)  # its caller left
    assert engine.load().kv_bytes == held


def test_on_the_default_model_chunks_and_hits_of_two_or_more_tokens_give_the_bits_of_one_forward():
    """Why a hit leaves two prompt tokens to run (prefix_cache.MIN_SUFFIX), and why chunking changes no bit: every
    forward of several positions gives each position the same bits; a forward of one position does not."""
    from muestra.lm.prefix_cache import MIN_SUFFIX
    from tests.fixtures.default_model import default_model_or_skip

    decoder = OnnxDecoder(default_model_or_skip(), providers="cpu", intra_op_threads=1, context_length=1024)
    engine = Engine(decoder, max_batch_rows=8, kv_budget_bytes=1 << 30, max_top_n=8)
    (prompt,) = (np.array(p) for p in prompts([300], 30000, seed=13))
    whole = engine.prefill([PrefillInput("whole", prompt, FULL)])
    for chunk in (128, 100):
        result, _ = chunked(engine, PrefillInput("chunked", prompt, FULL), chunk)
        assert np.array_equal(result.logits, whole.logits), chunk
    held = engine.batches[whole.batch_id].kv.row_arrays(0, prompt.size)
    differs = {}
    for suffix in (1, MIN_SUFFIX, 7):
        past = [np.array(a[:, : prompt.size - suffix]) for a in held]
        hit = engine.prefill([PrefillInput("hit", prompt[-suffix:], FULL, past=past, history=prompt)])
        differs[suffix] = float(np.abs(hit.logits - whole.logits).max())
    assert differs[MIN_SUFFIX] == differs[7] == 0.0
    assert differs[1] > 0  # the one-position forward: were it ever bitwise too, MIN_SUFFIX could be 1

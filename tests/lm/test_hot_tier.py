"""The hot tier: rows that leave their batches leave their ids and KV, a later prompt adopts them, and the tier
lives inside the KV budget (live rows always win the memory)."""

from __future__ import annotations

import numpy as np
import pytest

from muestra.lm.batch import RowCache
from muestra.lm.engine import Engine
from muestra.lm.engine_io import DecodeInput, PrefillInput
from muestra.lm.hot_tier import HotTier
from muestra.lm.model import OnnxDecoder
from muestra.runtime.errors import ResourceExhausted
from muestra.v1 import lm_pb2
from tests.fixtures.lm_models import MAX_POSITIONS
from tests.lm.lm_client import prompts

FULL = (lm_pb2.LOGITS, 0)
ARGMAX = (lm_pb2.ARGMAX, 0)
CACHED = RowCache(block_size=4, stored_blocks=0, write=False)


def kv(length: int, value: float) -> list[np.ndarray]:
    return [np.full((2, length, 3), value, np.float32) for _ in range(4)]


def test_a_prompt_finds_the_entry_sharing_the_most_leading_ids_up_to_the_limit():
    tier = HotTier()
    tier.keep(np.array([1, 2, 3, 4, 5]), kv(5, 1.0), 4, 0)
    tier.keep(np.array([1, 2, 9, 9]), kv(4, 2.0), 4, 0)
    tier.keep(np.array([7, 7, 7]), kv(3, 3.0), 4, 0)
    entry, length = tier.longest(np.array([1, 2, 3, 4, 8, 8]), limit=5)
    assert length == 4 and entry.kv[0][0, 0, 0] == 1.0
    entry, length = tier.longest(np.array([1, 2, 3, 4, 5, 6]), limit=3)
    assert length == 3 and entry.ids.tolist() == [1, 2, 3, 4, 5]
    assert tier.longest(np.array([5, 1, 2]), limit=2) == (None, 0)


def test_a_row_that_extends_an_entry_replaces_it_and_a_prefix_of_an_entry_is_not_kept_again():
    tier = HotTier()
    first = tier.keep(np.array([1, 2, 3]), kv(3, 1.0), 4, 0)
    turn = tier.keep(np.array([1, 2, 3, 4, 5]), kv(5, 2.0), 4, 0)  # the conversation's next turn
    assert len(tier) == 1 and tier.nbytes == turn.nbytes and first is not turn
    again = tier.keep(np.array([1, 2, 3, 4]), kv(4, 3.0), 4, 0)
    assert again is turn and len(tier) == 1


def test_the_tier_copies_what_it_keeps():
    tier = HotTier()
    arrays = kv(4, 1.0)
    tier.keep(np.array([1, 2, 3, 4]), arrays, 4, 0)
    arrays[0][:] = 5.0  # the batch's buffer is written over by later steps
    entry, _ = tier.longest(np.array([1, 2, 3, 4, 5]), limit=4)
    assert float(entry.kv[0].max()) == 1.0


def test_eviction_drops_the_least_recently_used_first():
    tier = HotTier()
    old = tier.keep(np.array([1, 1, 1]), kv(3, 1.0), 4, 0)
    tier.keep(np.array([2, 2, 2]), kv(3, 2.0), 4, 0)
    tier.keep(np.array([3, 3, 3]), kv(3, 3.0), 4, 0)
    tier.longest(np.array([1, 1, 1, 5]), limit=3)  # a hit makes it the most recently used
    freed = tier.evict(1)
    assert freed == old.nbytes and len(tier) == 2
    assert tier.longest(np.array([2, 2, 2, 9]), limit=3) == (None, 0)
    assert tier.longest(np.array([1, 1, 1, 9]), limit=3)[1] == 3


@pytest.fixture(scope="module")
def decoder(served_lm):
    return OnnxDecoder(served_lm("llama").onnx_dir, providers="cpu", intra_op_threads=1, context_length=MAX_POSITIONS)


def test_a_batch_knows_the_ids_its_rows_hold_through_steps_filters_joins_and_rejected_drafts(decoder):
    engine = Engine(decoder, max_batch_rows=8, kv_budget_bytes=1 << 30, max_top_n=8)
    a, b = (np.array(p) for p in prompts([5, 7], decoder.info.vocab_size, seed=3))
    first = engine.prefill([PrefillInput("a", a, FULL)])
    second = engine.prefill([PrefillInput("b", b, ARGMAX)])
    joined = engine.decode(
        [DecodeInput(first.batch_id, np.array([10]), None), DecodeInput(second.batch_id, np.array([11]), None)]
    )
    burst = engine.decode([DecodeInput(joined.batch_id, np.array([12, 13]), [ARGMAX, ARGMAX])], greedy_steps=3)
    fed = burst.greedy_ids[:, :-1]  # the last argmax of a burst is not fed
    batch = engine.batches[burst.batch_id]
    assert batch.row_ids(0).tolist() == [*a, 10, 12, *fed[0]]
    assert batch.row_ids(1).tolist() == [*b, 11, 13, *fed[1]]
    # Drafts: every drafted id is held until the caller's rollback drops the rejected ones.
    drafted = engine.decode(
        [
            DecodeInput(
                burst.batch_id, np.array([20, 21]), [FULL, FULL], drafts=[np.array([30, 31]), np.array([], np.int64)]
            )
        ]
    )
    rolled = engine.decode([DecodeInput(drafted.batch_id, np.array([40, 41]), None, rollback=np.array([1, 0]))])
    batch = engine.batches[rolled.batch_id]
    assert batch.row_ids(0).tolist() == [*a, 10, 12, *fed[0], 20, 30, 40]
    assert batch.row_ids(1).tolist() == [*b, 11, 13, *fed[1], 21, 41]
    copied, _ = engine.filter(rolled.batch_id, [1, 1, 0])
    batch = engine.batches[copied]
    assert [batch.row_ids(r).tolist()[-2:] for r in range(3)] == [[21, 41], [21, 41], [30, 40]]


def test_a_row_that_leaves_is_adopted_by_a_prompt_that_starts_with_it(decoder):
    """The conversation case: a row's prompt and fed tokens, kept when it leaves, are the past of a longer prompt;
    the logits equal a cold prefill of the whole prompt."""
    engine = Engine(decoder, max_batch_rows=8, kv_budget_bytes=1 << 30, max_top_n=8, hot_tier=HotTier())
    left = []
    engine.on_row_left = lambda resident, cache: left.append((resident, cache))
    prompt, more = (np.array(p) for p in prompts([9, 6], decoder.info.vocab_size, seed=5))
    row = engine.prefill([PrefillInput("turn1", prompt, ARGMAX, cache=CACHED)])
    step = engine.decode([DecodeInput(row.batch_id, np.array([17]), None)], greedy_steps=4)
    held = [*prompt, 17, *step.greedy_ids[0, :-1]]
    engine.filter(step.batch_id, [])
    assert len(engine.hot) == 1 and left[0][0].ids.tolist() == held and left[0][1] == CACHED

    whole = np.array([*held, *more])
    resident, length = engine.hot.longest(whole, whole.size - 1)
    assert length == len(held)
    past = [a[:, :length] for a in resident.kv]
    hit = engine.prefill([PrefillInput("turn2", whole[length:], FULL, past=past, history=whole, cache=CACHED)])
    cold = engine.prefill([PrefillInput("cold", whole, FULL)])
    assert np.abs(hit.logits - cold.logits).max() <= 1e-4
    assert engine.batches[hit.batch_id].row_ids(0).tolist() == whole.tolist()
    # A row without cache instructions leaves nothing behind.
    engine.clear([cold.batch_id])
    assert len(engine.hot) == 1


def test_the_hot_tier_never_exceeds_the_budget_and_live_rows_always_win_the_memory(decoder):
    per_row = engine_bytes = decoder.storage_cls.bytes_for([64], decoder.kv_bytes_per_token, MAX_POSITIONS)
    budget = 3 * per_row
    engine = Engine(decoder, max_batch_rows=8, kv_budget_bytes=budget, max_top_n=8, hot_tier=HotTier())
    for seed in range(6):
        (prompt,) = (np.array(p) for p in prompts([40], decoder.info.vocab_size, seed=seed))
        row = engine.prefill([PrefillInput(str(seed), prompt, ARGMAX, cache=CACHED)])
        assert engine.load().kv_bytes + engine.hot.nbytes <= budget
        engine.clear([row.batch_id])
        assert engine.hot.nbytes <= budget
    assert len(engine.hot) >= 2  # rows of 40 tokens hold far less than a 64-position buffer's bytes
    # Live rows that need the whole budget get it: the tier gives everything up, and a row past it is refused.
    live = engine.prefill([PrefillInput(str(i), np.arange(2, 42), ARGMAX) for i in range(3)])
    assert engine.load().kv_bytes == engine_bytes * 3 and engine.hot.nbytes == 0 and len(engine.hot) == 0
    with pytest.raises(ResourceExhausted):
        engine.prefill([PrefillInput("more", np.arange(2, 42), ARGMAX)])
    engine.clear([live.batch_id])


def test_a_prompt_that_starts_like_a_row_still_in_a_batch_takes_its_kv(decoder):
    """A turn that ended but whose Filter has not come yet (the gateway starts the next prompt's prefill as it
    arrives): the prompt takes the row's KV from its batch, as it would from the hot tier once the row leaves."""
    engine = Engine(decoder, max_batch_rows=8, kv_budget_bytes=1 << 30, max_top_n=8, hot_tier=HotTier())
    prompt, more = (np.array(p) for p in prompts([9, 6], decoder.info.vocab_size, seed=8))
    row = engine.prefill([PrefillInput("turn1", prompt, ARGMAX, cache=CACHED)])
    step = engine.decode([DecodeInput(row.batch_id, np.array([17]), None)], greedy_steps=4)
    held = [*prompt, 17, *step.greedy_ids[0, :-1]]
    whole = np.array([*held, *more])
    hit = engine.prefill([PrefillInput("turn2", whole, FULL, cache=CACHED)])
    assert engine.batches[hit.batch_id].row_ids(0).tolist() == whole.tolist()
    cold = engine.prefill([PrefillInput("cold", whole, FULL)])  # no cache instructions: nothing adopted
    assert np.abs(hit.logits - cold.logits).max() <= 1e-4
    adopted = PrefillInput("turn2-again", whole, FULL, cache=CACHED)
    engine.prefill([adopted])
    assert adopted.adopted == whole.size - 2  # the live turn-2 row holds all of it; the last two tokens run
    without = Engine(decoder, max_batch_rows=8, kv_budget_bytes=1 << 30, max_top_n=8)  # no hot tier: no reuse
    kept = without.prefill([PrefillInput("a", prompt, ARGMAX, cache=CACHED)])
    other = PrefillInput("b", np.array([*prompt, 5, 6, 7]), FULL, cache=CACHED)
    without.prefill([other])
    assert other.adopted == 0 and kept.batch_id in without.batches


def test_a_turn_alone_in_its_batch_is_kept_without_a_copy_and_its_next_turn_goes_on_in_its_buffer(decoder):
    engine = Engine(decoder, max_batch_rows=8, kv_budget_bytes=1 << 30, max_top_n=8, hot_tier=HotTier())
    prompt, more = (np.array(p) for p in prompts([9, 6], decoder.info.vocab_size, seed=21))
    row = engine.prefill([PrefillInput("turn1", prompt, ARGMAX, cache=CACHED)])
    step = engine.decode([DecodeInput(row.batch_id, np.array([17]), None)], greedy_steps=4)
    buffers = engine.batches[step.batch_id].kv.values
    engine.clear([step.batch_id])  # the turn ends: its batch goes with it
    (resident,) = engine.hot._entries.values()
    assert resident.owner is buffers and resident.nbytes == sum(v.tensor_size_in_bytes() for v in buffers)
    before = [np.array(a) for a in resident.kv]
    whole = np.array([*resident.ids, *more])
    turn = PrefillInput("turn2", whole, FULL, cache=CACHED)
    hit = engine.prefill([turn])
    assert turn.adopted == len(resident.ids) and len(engine.hot) == 0  # taken over, out of the tier
    assert engine.batches[hit.batch_id].kv.values[0] is buffers[0]  # the same buffer, written on in place
    assert all(np.array_equal(a, b) for a, b in zip(resident.kv, before, strict=True))  # its past untouched
    cold = engine.prefill([PrefillInput("cold", whole, FULL)])
    assert np.abs(hit.logits - cold.logits).max() <= 1e-4

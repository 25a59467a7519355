"""The speculation policy without processes: which rows draft, how long their drafts are, when drafting pauses,
and the ngram proposer's lookups. Through the real stack: tests/gateway/test_speculation.py."""

from __future__ import annotations

import asyncio
import itertools
import types

import numpy as np

from muestra.gateway.engine.generation.request import GenerationRequest, Sequence
from muestra.gateway.engine.generation.speculation import (
    CREDIT,
    DEBT,
    FIRST_PAUSE,
    PROBE_EVERY,
    QUIET_BURST,
    START_DRAFT,
    RowSpeculation,
    SpeculationPolicy,
    eligible,
)
from muestra.gateway.engine.proposers.ngram import NgramProposer, lookup, quiet_tokens
from muestra.gateway.engine.proposers.registry import Speculation
from muestra.plugin import DraftRow, RowContext
from muestra.v1 import lm_pb2

NGRAM = NgramProposer()


def draft(policy: SpeculationPolicy, rows: list, max_draft_tokens: int, context_length: int) -> int:
    return asyncio.run(policy.draft(rows, max_draft_tokens, context_length))


def row(prompt: list[int], generated: list[int], max_tokens=100, stop=(), constraint=None, **params) -> Sequence:
    request = GenerationRequest(
        request_id="r", prompt_ids=prompt, max_tokens=max_tokens, n=1, seed=0, chain=None, stop=list(stop)
    )
    sampling = types.SimpleNamespace(
        constraint=constraint, output_kind=lm_pb2.LOGITS, context=RowContext(prompt, np.random.default_rng(0))
    )
    sequence = Sequence(request, 0, sampling)
    sequence.generated = list(generated)
    sequence.pending_token = generated[-1] if generated else None
    # Matches of 3 tokens draft here (the default is 6), so that short prompts do.
    params = {"min_ngram": 3, **params}
    sequence.speculation = RowSpeculation.start(Speculation(NGRAM, NGRAM.validate(params)))
    return sequence


def test_lookup_proposes_what_followed_the_latest_earlier_occurrence():
    ids = np.array([1, 2, 3, 4, 5, 9, 1, 2, 3, 7, 8, 1, 2, 3])
    assert lookup(ids, 4, 3).tolist() == [7, 8, 1, 2]  # the later of the two earlier (1, 2, 3)
    assert lookup(ids, 1, 3).tolist() == [7]
    assert lookup(np.array([1, 2, 3, 4]), 4, 2).tolist() == []  # (3, 4) never occurred before
    assert lookup(np.array([5, 5]), 4, 2).tolist() == []  # no room for an earlier occurrence


def test_lookup_prefers_the_longest_match_then_the_latest():
    #                 0  1  2  3   4   5  6  7  8   9  10 11 12 13 14
    ids = np.array([4, 1, 2, 3, 40, 41, 9, 2, 3, 50, 51, 4, 1, 2, 3])
    # (2, 3) occurred at 2 and 7; the one at 2 matches 4 tokens back (4, 1, 2, 3), the later one 2.
    assert lookup(ids, 2, 2, 4).tolist() == [40, 41]
    assert lookup(ids, 2, 2, 2).tolist() == [50, 51]  # counted up to 2 tokens: equals, the latest wins
    assert lookup(ids, 2, 4, 8).tolist() == [40, 41]
    assert lookup(ids, 2, 5, 8).tolist() == []  # no earlier match of 5 tokens


def test_a_repeating_text_is_drafted_past_its_end():
    # The last three ids repeat (a list that goes on and on): what followed the previous (1, 2) is 3 and
    # then the text's end, so the draft goes on as the repetition would.
    ids = np.array([9, 1, 2, 3, 1, 2, 3, 1, 2])
    assert lookup(ids, 8, 2).tolist() == [3, 1, 2, 3, 1, 2, 3, 1]
    assert lookup(np.array([5, 5, 5]), 4, 2).tolist() == [5, 5, 5, 5]


def test_longer_tails_are_tried_first_and_shorter_than_min_ngram_never():
    proposer = NgramProposer()
    params = proposer.validate({"max_ngram": 3, "min_ngram": 2})
    ids = np.array([7, 2, 3, 40, 41, 1, 2, 3, 50, 51, 1, 2, 3])
    # (1, 2, 3) occurred at 5: its continuation (50, 51, ...) wins over (2, 3)'s latest elsewhere.
    assert proposer.propose([DraftRow(ids, 2, params)]) == [[50, 51]]
    assert proposer.propose([DraftRow(np.array([1, 2, 3, 9, 3]), 2, params)]) == [[]]


def test_by_default_a_match_of_six_tokens_drafts_and_of_five_does_not():
    proposer = NgramProposer()
    params = proposer.validate({})
    source = [10, 11, 12, 13, 14, 15, 16, 17]
    five = np.array([*source, 99, 11, 12, 13, 14, 15])
    six = np.array([*source, 99, 10, 11, 12, 13, 14, 15])
    assert proposer.propose([DraftRow(five, 2, params)]) == [[]]
    assert proposer.propose([DraftRow(six, 2, params)]) == [[16, 17]]


def test_quiet_tokens_is_the_fewest_tokens_before_a_match_of_min_ngram_can_occur():
    ids = np.array([1, 2, 3, 4, 9, 1, 2, 3])  # "1 2 3" occurred before; "4 1 2 3" did not
    assert lookup(ids, 4, 4).size == 0
    assert quiet_tokens(ids, 4) == 1  # a 4 next makes "1 2 3 4"
    assert lookup(np.append(ids, 4), 4, 4).tolist() == [9, 1, 2, 3]
    assert quiet_tokens(ids, 6) == 3
    assert quiet_tokens(np.array([5, 6, 7, 8]), 6) == 6  # its last token never occurred before
    assert quiet_tokens(np.array([7]), 3) == 3
    # Against every continuation of a small vocabulary: no shorter one drafts, and one of that length does.
    rng = np.random.default_rng(0)
    for _ in range(300):
        ids, min_ngram = rng.integers(0, 3, int(rng.integers(1, 30))), int(rng.integers(1, 5))
        if lookup(ids, 4, min_ngram).size:
            continue
        quiet = quiet_tokens(ids, min_ngram)
        drafts_after = {
            len(tail)
            for t in range(1, quiet + 1)
            for tail in itertools.product(range(4), repeat=t)
            if lookup(np.concatenate([ids, tail]), 4, min_ngram).size
        }
        assert min(drafts_after) == quiet


def test_after_a_step_without_drafts_the_policy_says_when_a_draft_could_begin():
    policy = SpeculationPolicy("m", 1000)
    near = row([1, 2, 3, 4, 9, 1], [2, 3], min_ngram=4)  # a 4 next drafts
    assert draft(policy, [near], 16, 1000) == 0 and policy.quiet == 1
    far = row([1, 2, 3, 4, 9], [7, 8], min_ngram=4)  # 8 never occurred before: 4 tokens at least
    assert draft(policy, [far], 16, 1000) == 0 and policy.quiet is None  # beyond QUIET_BURST: bursts run on
    assert QUIET_BURST < 4
    assert draft(policy, [near, far], 16, 1000) == 0 and policy.quiet == 1
    near.speculation.resume_at = len(near.generated) + 2  # paused for 2 more tokens
    assert draft(policy, [near], 16, 1000) == 0 and policy.quiet == 2
    drafting = row([1, 2, 3, 1, 2], [3])
    assert draft(policy, [drafting], 16, 1000) == 1 and policy.quiet is None

    class Unsure(NgramProposer):
        name = "unsure"

        def quiet(self, row):
            raise RuntimeError("cannot tell")

    unsure = row([1, 2, 3, 4, 9, 1], [2, 3], min_ngram=4)
    unsure.speculation = RowSpeculation.start(Speculation(Unsure(), Unsure().validate({"min_ngram": 4})))
    assert draft(policy, [unsure], 16, 1000) == 0 and policy.quiet is None


def test_only_running_unconstrained_rows_with_nothing_queued_draft():
    prompt = [1, 2, 3, 4, 5, 6, 1, 2, 3]
    assert eligible(row(prompt, [4]))
    assert eligible(row(prompt, [4], stop=["x"]))  # the detokenizer ends it at the stop string's token
    assert not eligible(row(prompt, [4], constraint=object()))
    queued = row(prompt, [4])
    queued.queued = [7]
    assert not eligible(queued)
    assert not eligible(row(prompt, []))  # nothing pending to feed


def test_a_draft_never_passes_max_tokens_or_the_context():
    policy = SpeculationPolicy("m", 1000)
    prompt = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 1, 2, 3]
    near_the_end = row(prompt, [4], max_tokens=4)  # 3 more tokens at most: the pending one and 2 drafts
    assert draft(policy, [near_the_end], 16, 1000) == 1 and near_the_end.drafts == [5, 6]
    at_the_context = row(prompt, [4])
    assert draft(policy, [at_the_context], 16, len(prompt) + 1 + 3) == 1 and at_the_context.drafts == [5, 6, 7]
    assert draft(policy, [row(prompt, [4])], 0, 1000) == 0  # a model that cannot verify


def test_draft_length_grows_while_all_are_accepted_and_falls_back_after_a_rejection():
    spec = row([1], [2]).speculation
    assert spec.k == START_DRAFT
    spec.verified(8, 8)
    assert spec.k == 16
    spec.verified(16, 16)
    assert spec.k == 16  # max_draft_tokens
    spec.verified(16, 3)
    assert spec.k == START_DRAFT
    spec.verified(8, 7)
    assert spec.k == START_DRAFT
    assert (spec.draft_tokens, spec.accepted_tokens) == (48, 34)


def test_drafting_pauses_where_it_does_not_pay_and_probes_again_later():
    policy = SpeculationPolicy("m", 1000)
    policy.timed(0.010, 1, 1, 0)  # a plain step: 10 ms per row and token
    policy.timed(0.040, 1, 1, 1)  # a step with one drafting row: 30 ms more
    assert abs(policy.needed() - 3.0) < 1e-9
    prompt = [1, 2, 3, 4, 5, 6, 7, 8, 9, 1, 2, 3]
    sequence = row(prompt, [4])
    spec = sequence.speculation
    spec.balance = -DEBT - 0.5  # its drafts have cost more than they kept
    assert draft(policy, [sequence], 16, 1000) == 0
    assert spec.resume_at == 1 + FIRST_PAUSE and spec.pause == 2 * FIRST_PAUSE
    sequence.generated += [9] * FIRST_PAUSE
    sequence.generated[-3:] = [1, 2, 3]
    sequence.pending_token = 3
    assert draft(policy, [sequence], 16, 1000) == 1  # a probe after the pause, from an even balance
    assert spec.pause == 2 * FIRST_PAUSE  # its drafts have not paid since: the next pause is longer
    spec.verified(8, 8)  # the probe kept 8 drafts for the cost of 3 plain steps
    assert spec.balance == CREDIT
    assert spec.pause == FIRST_PAUSE  # they paid: the next pause starts short again


def test_in_a_batch_a_row_pauses_after_any_verification_that_did_not_pay():
    policy = SpeculationPolicy("m", 1000)
    policy.timed(0.010, 1, 1, 0)
    policy.timed(0.040, 1, 1, 1)
    prompt = [1, 2, 3, 4, 5, 6, 7, 8, 9, 1, 2, 3]
    first, second = row(prompt, [4]), row(prompt, [4])
    assert draft(policy, [first, second], 16, 1000) == 2
    first.speculation.verified(8, 8)
    second.speculation.verified(8, 2)  # 2 kept for 3 plain steps
    assert first.speculation.balance == 0.0  # no credit in a batch
    assert draft(policy, [first, second], 16, 1000) == 1 and second.drafts == []


def test_credit_from_good_drafts_outlasts_a_few_misses():
    policy = SpeculationPolicy("m", 1000)
    policy.timed(0.010, 1, 1, 0)
    policy.timed(0.040, 1, 1, 1)  # a drafting row costs 3 plain steps
    prompt = [1, 2, 3, 4, 5, 6, 7, 8, 9, 1, 2, 3]
    sequence = row(prompt, [4])
    spec = sequence.speculation
    spec.balance = CREDIT
    for balance in (CREDIT - 3, CREDIT - 6):  # two verifications that kept nothing
        assert draft(policy, [sequence], 16, 1000) == 1
        spec.verified(8, 0)
        assert spec.balance == balance
    assert draft(policy, [sequence], 16, 1000) == 1  # -2 is above -DEBT: it drafts once more
    spec.verified(8, 0)
    assert draft(policy, [sequence], 16, 1000) == 0  # -5: a pause


def test_non_adaptive_rows_draft_their_maximum_at_every_step():
    policy = SpeculationPolicy("m", 1000)
    policy.timed(0.010, 1, 1, 0)
    policy.timed(0.100, 1, 1, 1)
    sequence = row([1, 2, 3, *range(10, 30), 1, 2, 3], [10], adaptive=False, max_draft_tokens=5)
    sequence.speculation.balance = -100.0  # never pauses
    assert draft(policy, [sequence], 16, 1000) == 1
    assert sequence.drafts == [11, 12, 13, 14, 15]


def test_drafts_end_before_an_id_the_model_does_not_have_and_a_failing_proposer_gives_none():
    class Wild(NgramProposer):
        name = "wild"

        def propose(self, rows):
            return [[5, 6, 1000, 7] for _ in rows]

    class Broken(NgramProposer):
        name = "broken"

        async def propose(self, rows):
            raise RuntimeError("the draft service is gone")

    policy = SpeculationPolicy("m", 1000)
    wild = row([1, 2, 3], [4])
    wild.speculation = RowSpeculation.start(Speculation(Wild(), Wild().validate({})))
    assert draft(policy, [wild], 16, 1000) == 1 and wild.drafts == [5, 6]
    broken = row([1, 2, 3], [4])
    broken.speculation = RowSpeculation.start(Speculation(Broken(), Broken().validate({})))
    assert draft(policy, [broken], 16, 1000) == 0 and broken.drafts == []


def test_a_proposer_is_told_when_its_rows_stop_asking():
    idle = []

    class Counting(NgramProposer):
        name = "counting"

        def idle(self, group):
            idle.append(group)

    proposer = Counting()
    policy = SpeculationPolicy("m", 1000)
    asking = row([1, 2, 3, 1, 2, 3], [1])
    asking.speculation = RowSpeculation.start(Speculation(proposer, proposer.validate({})))
    draft(policy, [asking], 16, 1000)
    assert idle == []
    asking.queued = [9]  # not eligible while forced tokens wait
    draft(policy, [asking], 16, 1000)
    assert idle == [policy]
    draft(policy, [asking], 16, 1000)
    assert idle == [policy]  # once


def test_in_a_batch_rows_draft_while_verifications_keep_what_they_need_and_else_probe_now_and_then():
    policy = SpeculationPolicy("m", 1000)
    policy.timed(0.010, 1, 1, 0)
    policy.timed(0.040, 1, 1, 1)  # a drafting row costs 3 plain steps
    prompt = [1, 2, 3, 4, 5, 6, 7, 8, 9, 1, 2, 3]
    rows = [row(prompt, [4]) for _ in range(3)]
    policy.verified(1)  # verifications have kept 1 draft, fewer than the 3 they need
    for _ in range(PROBE_EVERY - 1):
        assert draft(policy, rows, 16, 1000) == 0
    assert draft(policy, rows, 16, 1000) == 1  # a probe: one row drafts
    assert draft(policy, rows, 16, 1000) == 0  # and the count starts again
    # Alone, a row drafts by its own balance whatever the batches' verifications keep.
    assert draft(policy, [row(prompt, [4])], 16, 1000) == 1
    for _ in range(8):
        policy.verified(8)  # verifications keep 8 now
    assert draft(policy, rows, 16, 1000) == 3
    # Rows that are not adaptive draft at every step in any case.
    policy.verified(0)
    policy.kept = 0.0
    fixed = [row(prompt, [4], adaptive=False) for _ in range(2)]
    assert draft(policy, fixed, 16, 1000) == 2

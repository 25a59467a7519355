"""The step policy (greedy bursts, tokens per row, stop ids) and the DetokenizeSteps stream's owner task,
without processes. Bursts through the real lm: tests/gateway/test_greedy_bursts.py."""

from __future__ import annotations

import asyncio
import types

import pytest

from muestra.gateway.engine.clients.progress import Progress
from muestra.gateway.engine.generation.detokenizer import Detokenizer
from muestra.gateway.engine.generation.request import GenerationRequest, Sequence
from muestra.gateway.engine.generation.step_policy import (
    StepPolicy,
    row_invariant,
    stop_ids,
    tokens_per_row,
    wants_row_invariance,
)
from muestra.v1 import lm_pb2


def greedy_row(prompt=3, generated=0, max_tokens=100, **fields) -> Sequence:
    request = GenerationRequest(
        request_id="r", prompt_ids=list(range(prompt)), max_tokens=max_tokens, n=1, seed=0, chain=None, **fields
    )
    row = Sequence(request, 0, types.SimpleNamespace(constraint=None, output_kind=lm_pb2.ARGMAX, mask_in_lm=True))
    row.generated = [9] * generated
    return row


def timed_policy(step_ms: float, burst=8, burst_ms=100.0, context=64) -> StepPolicy:
    policy = StepPolicy(burst, burst_ms, context)
    policy.timed(int(step_ms * 1000), 1)
    return policy


def test_no_burst_before_a_step_was_timed_or_when_a_request_could_join():
    assert StepPolicy(8, 100, 64).burst([greedy_row()], 8, joinable=False) == 1
    assert timed_policy(1).burst([greedy_row()], 8, joinable=True) == 1


def test_a_burst_is_bounded_by_the_flag_the_lm_the_time_the_context_and_max_tokens():
    assert timed_policy(1).burst([greedy_row()], 8, False) == 8
    assert timed_policy(1).burst([greedy_row()], 4, False) == 4  # the lm's max_greedy_steps
    assert timed_policy(30).burst([greedy_row()], 8, False) == 3  # 100 ms at 30 ms a step
    assert timed_policy(1).burst([greedy_row(prompt=60)], 8, False) == 4  # 64 - 60 positions left
    assert timed_policy(1).burst([greedy_row(max_tokens=5, generated=3)], 8, False) == 2
    # The longest remaining max_tokens decides: shorter rows end inside the burst.
    rows = [greedy_row(max_tokens=2), greedy_row(max_tokens=6)]
    assert timed_policy(1).burst(rows, 8, False) == 6


@pytest.mark.parametrize(
    "change",
    [
        lambda row: setattr(row.request, "stop", ["\n"]),  # text ends it, somewhere inside the burst
        lambda row: setattr(row, "queued", [4]),
        lambda row: setattr(row.sampling, "output_kind", lm_pb2.LOGITS),  # a sampled row
        lambda row: setattr(row.sampling, "constraint", object()),
    ],
)
def test_one_row_that_cannot_burst_stops_the_burst(change):
    other = greedy_row()
    change(other)
    assert timed_policy(1).burst([greedy_row(), other], 8, False) == 1


def test_the_step_time_is_a_running_average_per_step():
    policy = timed_policy(10)
    policy.timed(8 * 20_000, 8)  # a burst of 8 at 20 ms a step
    assert policy.step_s == pytest.approx(0.010 + 0.2 * 0.010)
    policy.timed(0, 0)  # an lm that does not time its steps changes nothing
    assert policy.step_s == pytest.approx(0.012)


def test_row_invariance_is_for_seeded_sampled_requests_and_one_of_them_makes_a_step_ask_for_it():
    sampled = types.SimpleNamespace(is_search=False, argmax_only=False)
    greedy = types.SimpleNamespace(is_search=False, argmax_only=True)
    beams = types.SimpleNamespace(is_search=True, argmax_only=False)
    assert wants_row_invariance("seeded", True, sampled)
    assert not wants_row_invariance("seeded", False, sampled)  # no seed to replay
    assert not wants_row_invariance("seeded", True, greedy)  # an argmax moves only at an exact near-tie
    assert not wants_row_invariance("seeded", True, beams)
    assert wants_row_invariance("all", False, greedy) and not wants_row_invariance("off", True, sampled)
    asking, other = greedy_row(row_invariant=True), greedy_row()
    assert row_invariant([other, asking]) and not row_invariant([other])


def test_tokens_per_row_and_stop_ids():
    lone = greedy_row()
    lone.queued = [1] * 40
    assert tokens_per_row([lone]) == 16
    assert tokens_per_row([lone, greedy_row()]) == 1
    rows = [greedy_row(stop_token_ids=frozenset({7})), greedy_row(ignore_eos=True)]
    assert stop_ids(rows, (2,)) == [2, 7]
    assert stop_ids([greedy_row(ignore_eos=True)], (2,)) == []


class FakeStream:
    """A DetokenizeSteps stream that answers each request with its own model name, after `delays`."""

    what = "fake tokenizer"

    def __init__(self, delays: dict[str, float]) -> None:
        self.delays = delays
        self.sent: list[str] = []
        self.busy = False
        self.closed = False

    async def step(self, request):
        assert not self.busy, "two exchanges at once on one stream"
        self.busy = True
        try:
            self.sent.append(request.model)
            await asyncio.sleep(self.delays.get(request.model, 0))
            return request.model
        finally:
            self.busy = False

    def close(self) -> None:
        self.closed = True


def detokenizer(stream: FakeStream) -> Detokenizer:
    model = types.SimpleNamespace(name="m", tokenizer=types.SimpleNamespace(DetokenizeSteps=None))
    detok = Detokenizer(model, Progress(), timeout_s=5)
    detok.stream = stream
    return detok


def test_the_owner_task_sends_one_exchange_at_a_time_in_order_and_survives_a_cancelled_caller():
    async def main():
        stream = FakeStream({"slow": 0.05})
        detok = detokenizer(stream)
        make = lambda name: types.SimpleNamespace(model=name)  # noqa: E731
        slow = asyncio.create_task(detok._exchange(make("slow")))
        gone = asyncio.create_task(detok._exchange(make("gone")))
        fast = asyncio.create_task(detok._exchange(make("fast")))
        await asyncio.sleep(0.01)
        gone.cancel()  # its caller leaves while "slow" is in flight: it is never sent
        assert await slow == "slow" and await fast == "fast"
        assert stream.sent == ["slow", "fast"]
        # A caller cancelled during its own exchange leaves the stream in step for the next one.
        mid = asyncio.create_task(detok._exchange(make("slow")))
        await asyncio.sleep(0.01)
        mid.cancel()
        assert await detok._exchange(make("after")) == "after"
        await detok.close()
        assert stream.closed and detok.owner is None

    asyncio.run(main())

"""The gateway under concurrent traffic, through real processes: the defects of issue 13.

Before the fix, a prefill's DetokenizeStep and the previous step's went over the one DetokenizeSteps
stream at once; a reply (they carry no request id) could be read by the wrong caller, which gave the
wrong text to the wrong rows and, sooner or later, a read that never completed: every stream stopped.
"""

from __future__ import annotations

import asyncio
import json
import random

import grpc
import pytest

from bench.stack import TEXT_FIXTURE, LocalStack, Process
from bench.workload import Spec, Workload, check_text
from muestra.v1 import gateway_pb2, gateway_pb2_grpc
from tests.fixtures.logprob_tokens import joined
from tests.reliability.stutter import stuttering

pytestmark = pytest.mark.slow
EOS_TOKEN = json.loads((TEXT_FIXTURE / "special_tokens_map.json").read_text())["eos_token"]

SAMPLING = [
    [{"name": "temperature", "params": {"temperature": 0.9}}, {"name": "sample"}],
    [{"name": "top_k", "params": {"top_k": 20}}, {"name": "sample"}],
    [{"name": "presence_penalty", "params": {"presence_penalty": 0.5}}, {"name": "sample"}],
    [{"name": "top_p", "params": {"top_p": 0.9}}, {"name": "sample"}],
]


class ShortGenerations(Workload):
    """The workload that hung: 4-24 tokens, n 1-2, half with logprobs, sampling."""

    def _spec(self, kind, rng: random.Random) -> Spec:
        chat = kind == "http_stream"
        spec = super()._spec(kind, rng)
        spec.max_tokens = rng.randint(4, 24)
        spec.n = 2 if chat else rng.randint(1, 2)
        spec.samplers = list(rng.choice(SAMPLING))
        spec.logprobs = chat or rng.random() < 0.5
        spec.top_logprobs = rng.randint(0, 2) if spec.logprobs else 0
        spec.stop = []
        return spec


@pytest.fixture(scope="module")
def one_replica(tmp_path_factory):
    stack = LocalStack(tmp_path_factory.mktemp("one-replica"), lm_replicas=1, image_model=None, redis=False)
    yield stack
    stack.close()


async def greedy(address: str, max_tokens: int = 8, timeout: float = 10.0) -> list[int]:
    """The token ids of one greedy completion, which must come within `timeout` seconds."""
    async with grpc.aio.insecure_channel(address) as channel:
        request = gateway_pb2.GenerateRequest(prompt="def main():", max_tokens=max_tokens, seed=1, ignore_eos=True)
        request.samplers.add(name="greedy")
        ids: list[int] = []
        async for message in gateway_pb2_grpc.GatewayStub(channel).Generate(request, timeout=timeout):
            if message.HasField("delta"):
                ids.extend(message.delta.token_ids)
            else:
                assert message.done.finish_reason == gateway_pb2.LENGTH, message
        return ids


def run_workload(workload: Workload, seconds: float, stutter: Process):
    """Run the workload while `stutter` (the tokenizer) stutters."""
    with stuttering(stutter):
        return asyncio.run(asyncio.wait_for(workload.run(seconds), seconds + 120))


def test_48_concurrent_short_generations_neither_hang_nor_mix_up_text(one_replica):
    before = asyncio.run(greedy(one_replica.gateway.address))
    workload = ShortGenerations(
        one_replica.gateway.address, one_replica.base_url, concurrency=48, seed=13, hang_s=20, images=False,
        kinds={"grpc_stream": 1},
    )  # fmt: skip
    outcomes = run_workload(workload, 30, stutter=one_replica.tokenizer)
    checked = asyncio.run(check_text(outcomes, one_replica.tokenizer.address, one_replica.internal_token))

    by_status = {s: sum(o.status == s for o in outcomes) for s in ("ok", "failed", "lost", "hung", "refused")}
    wrong = [o.describe() + " | " + "; ".join(o.problems) for o in outcomes if o.problems]
    bad = [o.describe() for o in outcomes if o.status != "ok"]
    assert by_status["ok"] >= 200, by_status
    assert not bad, (by_status, bad[:5])
    assert not wrong, wrong[:5]
    assert checked >= by_status["ok"]
    # The gateway still serves, at once, and as it did before the load.
    after = asyncio.run(greedy(one_replica.gateway.address))
    assert after == before and len(after) == 8


def visible(tokens: list[str]) -> str:
    """The text that logprob entries name (a split character's tokens give their bytes back: joined)."""
    return joined([t for t in tokens if t != EOS_TOKEN])


def test_streamed_http_chat_deltas_with_n_2_and_logprobs_are_each_choices_own_tokens(one_replica):
    workload = ShortGenerations(
        one_replica.gateway.address, one_replica.base_url, concurrency=24, seed=5, hang_s=20, images=False,
        kinds={"http_stream": 1},
    )  # fmt: skip
    outcomes = run_workload(workload, 20, stutter=one_replica.tokenizer)
    assert all(o.status == "ok" for o in outcomes), [o.describe() for o in outcomes if o.status != "ok"][:5]
    assert not [o for o in outcomes if o.problems], [o.problems for o in outcomes if o.problems][:5]
    compared = 0
    for outcome in outcomes:
        assert sorted(outcome.texts) == [0, 1]
        for i in (0, 1):
            assert outcome.texts[i] == visible(outcome.logprob_tokens[i]), (i, outcome.texts, outcome.logprob_tokens)
            compared += 1
    assert len(outcomes) >= 40 and compared >= len(outcomes)

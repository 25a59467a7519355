"""Greedy rows run in bursts (the lm feeds its argmax back for several steps in one Decode): through the
whole stack their tokens equal transformers' generate and a Decode per token, they end exactly at EOS, a
stop id or max_tokens inside a burst, and rows of other requests in the batch are unaffected."""

from __future__ import annotations

import threading
import urllib.request

import grpc
import pytest

from muestra.client import Client
from muestra.v1 import gateway_pb2
from tests.gateway.test_generate import PROMPT, hf_generate
from tests.harness import free_port

GREEDY = [{"name": "greedy"}]
NO_DRAFTS = ("--speculation", "off")
PROMPTS = ["The quick brown fox", "Once upon a time", "def main():", "Hola, ¿qué tal?", "1, 2, 3,", "a"]


def burst_metrics(port: int) -> tuple[float, float]:
    """(Decodes, steps they ran) on the gateway's /metrics, over every replica."""
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    count = steps = 0.0
    for line in body.splitlines():
        if line.startswith("muestra_decode_burst_steps_count"):
            count += float(line.split(" ")[1])
        elif line.startswith("muestra_decode_burst_steps_sum"):
            steps += float(line.split(" ")[1])
    return count, steps


@pytest.fixture(scope="module")
def stacks(text_stack):
    """The same tokenizer and lm behind a gateway with bursts (the default) and one without (neither drafts:
    a step with drafts runs no burst; speculation through the stack is tests/gateway/test_speculation.py)."""
    port = free_port()
    bursting = text_stack("llama", "--metrics-port", str(port), *NO_DRAFTS)
    return bursting, port, text_stack("llama", "--greedy-burst", "1", *NO_DRAFTS)


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_bursts_equal_transformers_generate(text_stack, tiny_lm, family):
    port = free_port()
    stack = text_stack(family, "--metrics-port", str(port), *NO_DRAFTS)
    lm = tiny_lm(family)
    with Client(stack.gateway.address, timeout=120) as c:
        generation = c.generate(PROMPT, max_tokens=40, samplers=GREEDY).wait()
    expected = hf_generate((lm.torch_model(), lm.tokenizer()), PROMPT, max_new_tokens=40, do_sample=False)
    assert generation.token_ids[0] == expected
    decodes, steps = burst_metrics(port)
    # The first step times the replica; the rest of the 39 decode steps go in bursts of up to 8.
    assert decodes < 12 and steps >= len(expected) - 2


def test_bursts_end_exactly_at_a_stop_id_and_at_max_tokens(stacks):
    bursting, _, single = stacks
    with Client(bursting.gateway.address, timeout=120) as b, Client(single.gateway.address, timeout=120) as s:
        free = s.generate(PROMPT, max_tokens=30, ignore_eos=True, samplers=GREEDY).wait().token_ids[0]
        # A stop id first produced at position 13 (mid-burst): the completion ends right there.
        position = next(i for i in range(13, 30) if free[i] not in free[:i])
        stopped = b.generate(
            PROMPT, max_tokens=30, ignore_eos=True, stop_token_ids=[free[position]], samplers=GREEDY
        ).wait()
        done = stopped.completions[0]
        assert stopped.token_ids[0] == free[: position + 1]
        assert (done.finish_reason, done.stop_reason, done.completion_tokens) == (
            "stop", f"token:{free[position]}", position + 1,
        )  # fmt: skip
        for max_tokens in (1, 2, 11, 17):
            cut = b.generate(PROMPT, max_tokens=max_tokens, ignore_eos=True, samplers=GREEDY).wait()
            assert cut.token_ids[0] == free[:max_tokens]
            assert (cut.completions[0].finish_reason, cut.completions[0].completion_tokens) == ("length", max_tokens)
            assert (
                cut.texts[0]
                == s.generate(PROMPT, max_tokens=max_tokens, ignore_eos=True, samplers=GREEDY).wait().texts[0]
            )


def test_concurrent_bursts_and_sampled_rows_equal_their_runs_alone(stacks):
    bursting, port, single = stacks
    jobs = [
        {"prompt": p, "max_tokens": 9 + 5 * i, "samplers": GREEDY, "ignore_eos": True} for i, p in enumerate(PROMPTS)
    ]
    # Sampled rows in the same batch make it step one token per Decode while they run.
    jobs += [{"prompt": p, "max_tokens": 12, "temperature": 0.8, "seed": 40 + i} for i, p in enumerate(PROMPTS[:2])]
    with Client(single.gateway.address, timeout=120) as s:
        alone = [s.generate(**job).wait() for job in jobs]
    before = burst_metrics(port)
    got: dict[int, object] = {}

    def run(i: int) -> None:
        with Client(bursting.gateway.address, timeout=120) as b:
            got[i] = b.generate(**jobs[i]).wait()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(jobs))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    for i, job in enumerate(jobs):
        assert got[i].token_ids[0] == alone[i].token_ids[0], job
        assert got[i].texts[0] == alone[i].texts[0], job
        assert got[i].completions[0].completion_tokens == job["max_tokens"]
    after = burst_metrics(port)
    assert after[1] - before[1] > after[0] - before[0], "no Decode ran more than one step"


def test_prefills_cut_by_their_deadline_leave_bursts_running(stacks):
    """A long prompt's prefill whose deadline passes while it waits for the model thread (or in its first
    chunk) must not leave the lm thinking a prefill still waits: a burst ends early only while one does."""
    bursting, port, _ = stacks
    cut = 0
    with Client(bursting.gateway.address, timeout=120) as c:
        bystander = c.generate(PROMPT, max_tokens=400, ignore_eos=True, temperature=1.0, seed=3)
        stream = iter(bystander)
        next(stream)  # steps run on the lm while the prefills queue for its model thread
        for attempt in range(40):
            request = gateway_pb2.GenerateRequest(
                prompt="la " * 200, max_tokens=4, seed=attempt, timeout_ms=(1, 2, 3, 5, 8)[attempt % 5]
            )
            try:
                list(bursting.stub.Generate(request, timeout=30))
            except grpc.RpcError as error:
                assert error.code() == grpc.StatusCode.DEADLINE_EXCEEDED, error.details()
                cut += 1
        assert list(stream) and bystander.wait().completions[0].completion_tokens == 400
    assert cut
    before = burst_metrics(port)
    with Client(bursting.gateway.address, timeout=120) as c:
        generation = c.generate(PROMPT, max_tokens=40, ignore_eos=True, samplers=GREEDY).wait()
    assert generation.completions[0].completion_tokens == 40
    decodes, steps = (a - b for a, b in zip(burst_metrics(port), before, strict=True))
    assert decodes < 12 and steps >= 38, (decodes, steps)

"""Sampled bursts through the whole stack: the lm runs a sampled row's own chain for several steps per Decode
(DecodeBatch.samplers), and the seeded tokens equal a Decode per token with the gateway running the chain, for
the model-style chain, penalties that read the row's ids, and a third-party plugin with per-row state
(mirostat), alone and in a batch of 8 mixed rows, at several burst lengths. A chain the lm cannot run falls
back to a Decode per token and still streams the same tokens."""

from __future__ import annotations

import concurrent.futures
import types
import urllib.request

import pytest

from muestra.client import Client
from tests.fixtures.lm_service import start_lm
from tests.fixtures.text_stack import start_gateway
from tests.gateway.test_greedy_bursts import NO_DRAFTS, PROMPTS, burst_metrics
from tests.harness import ServiceProcess, free_port

# The default model's own chain (its generation_config.json), another common one, penalties reading the row's
# prompt and output ids, and mirostat (a third-party plugin whose mu lives in the row's state).
CHAINS = {
    "model": [
        {"name": "temperature", "params": {"temperature": 0.2}},
        {"name": "top_k", "params": {"top_k": 50}},
        {"name": "top_p", "params": {"top_p": 0.9}},
    ],
    "t07": [
        {"name": "temperature", "params": {"temperature": 0.7}},
        {"name": "top_k", "params": {"top_k": 40}},
        {"name": "top_p", "params": {"top_p": 0.9}},
    ],
    "penalties": [
        {"name": "repetition_penalty", "params": {"repetition_penalty": 1.3}},
        {"name": "presence_penalty", "params": {"presence_penalty": 0.5}},
        {"name": "frequency_penalty", "params": {"frequency_penalty": 0.3}},
        {"name": "logit_bias", "params": {"logit_bias": {"5": -100, "7": 3}}},
        {"name": "min_p", "params": {"min_p": 0.02}},
        {"name": "sample"},
    ],
    "mirostat": [{"name": "temperature", "params": {"temperature": 1.5}}, {"name": "mirostat", "params": {"tau": 3}}],
}
TOKENS = 40


@pytest.fixture(scope="module")
def stacks(text_stack, tiny_lm, tmp_path_factory):
    """The same tokenizer and lm behind gateways bursting up to 8 and 3 steps, and the reference: a gateway running
    a Decode per token over an lm that runs no chains (--samplers false), so the gateway runs every chain."""
    port = free_port()
    eight = text_stack("llama", "--metrics-port", str(port), *NO_DRAFTS)
    three = text_stack("llama", "--greedy-burst", "3", *NO_DRAFTS)
    log_dir = tmp_path_factory.mktemp("reference")
    lm = start_lm(tiny_lm("llama").onnx_dir, "llama", log_dir, "--samplers", "false")
    flags = ["--greedy-burst", "1", *NO_DRAFTS]
    gateway = start_gateway(log_dir, eight.tokenizer.address, lm.address, *flags)
    yield eight, port, three, types.SimpleNamespace(gateway=gateway)
    gateway.stop()
    lm.stop()


def tokens(address: str, chain: str, seed: int, prompt: str = PROMPTS[0], **fields) -> dict[int, list[int]]:
    """Each completion's token ids (by index) of a seeded request with CHAINS[chain] (or fields' samplers)."""
    fields.setdefault("samplers", CHAINS[chain])
    with Client(address, timeout=120) as client:
        generation = client.generate(prompt, max_tokens=TOKENS, ignore_eos=True, seed=seed, **fields).wait()
    assert generation.token_ids and all(len(ids) == TOKENS for ids in generation.token_ids.values())
    return generation.token_ids


@pytest.mark.parametrize("chain", sorted(CHAINS))
def test_a_sampled_row_bursts_with_the_tokens_of_a_decode_per_token(stacks, chain):
    eight, port, three, single = stacks
    for seed in (1, 2):
        expected = tokens(single.gateway.address, chain, seed)
        before = burst_metrics(port)
        assert tokens(eight.gateway.address, chain, seed) == expected
        assert tokens(three.gateway.address, chain, seed) == expected
        decodes, steps = (after - was for after, was in zip(burst_metrics(port), before, strict=True))
        # The lm picked most tokens itself: far fewer Decodes than tokens (the first step only times the replica).
        assert steps >= TOKENS - 2 and decodes <= TOKENS / 3


def test_n_completions_burst_each_with_its_own_generator(stacks):
    eight, _, _, single = stacks
    assert tokens(eight.gateway.address, "t07", 5, n=3) == tokens(single.gateway.address, "t07", 5, n=3)


def test_eight_mixed_rows_in_one_batch_equal_each_alone(stacks):
    """Greedy, sampled rows of every chain, and a row the lm cannot burst (logprobs) share the batch."""
    eight, _, three, single = stacks
    jobs = [(chain, seed, PROMPTS[seed % len(PROMPTS)]) for seed, chain in enumerate([*sorted(CHAINS)] * 2)]
    expected = [tokens(single.gateway.address, chain, seed, prompt) for chain, seed, prompt in jobs]
    for stack in (eight, three):
        with concurrent.futures.ThreadPoolExecutor(len(jobs) + 2) as pool:
            runs = [pool.submit(tokens, stack.gateway.address, chain, seed, prompt) for chain, seed, prompt in jobs]
            greedy = pool.submit(tokens, stack.gateway.address, "model", 9, samplers=[{"name": "greedy"}])
            logprobs = pool.submit(tokens, stack.gateway.address, "t07", 3, PROMPTS[2], logprobs=True)
            assert [run.result() for run in runs] == expected
            assert greedy.result() == tokens(single.gateway.address, "model", 9, samplers=[{"name": "greedy"}])
            assert logprobs.result() == tokens(single.gateway.address, "t07", 3, PROMPTS[2])
        assert stack.lm_rows() == 0


@pytest.fixture(scope="module")
def without_mirostat(text_stack, tiny_lm, tmp_path_factory):
    """A stack whose lm lacks the mirostat plugin (disabled there alone): the gateway still has it."""
    reference = text_stack("llama", *NO_DRAFTS)
    log_dir = tmp_path_factory.mktemp("lm-without-mirostat")
    flags = ["--model", str(tiny_lm("llama").onnx_dir), "--providers", "cpu", "--intra-op-threads", "1"]
    lm = ServiceProcess("lm", flags, log_dir, env={"MUESTRA_DISABLE_PLUGINS": "mirostat"})
    port = free_port()
    gateway = ServiceProcess(
        "gateway",
        [
            "--tokenizer-addr",
            reference.tokenizer.address,
            "--lm-addr",
            lm.address,
            "--metrics-port",
            str(port),
            *NO_DRAFTS,
        ],
        log_dir,
    )
    yield gateway, port
    gateway.stop()
    lm.stop()


def test_a_chain_the_lm_cannot_run_falls_back_and_still_streams(stacks, without_mirostat):
    _, _, _, single = stacks
    gateway, port = without_mirostat
    expected = tokens(single.gateway.address, "mirostat", 4)
    before = burst_metrics(port)
    with Client(gateway.address, timeout=120) as client:
        pieces = list(
            client.generate(PROMPTS[1], max_tokens=TOKENS, ignore_eos=True, seed=4, samplers=CHAINS["mirostat"])
        )
    streamed = [token for piece in pieces for token in piece.token_ids]
    assert streamed == tokens(single.gateway.address, "mirostat", 4, PROMPTS[1])[0] and len(pieces) > 1
    decodes, steps = (after - was for after, was in zip(burst_metrics(port), before, strict=True))
    assert decodes == steps >= TOKENS - 1  # a Decode per token: the gateway ran mirostat
    # The same lm still runs the chains it has.
    assert tokens(gateway.address, "t07", 4) == tokens(single.gateway.address, "t07", 4)
    assert expected == tokens(gateway.address, "mirostat", 4)


@pytest.fixture(scope="module")
def two_replicas(text_stack, tiny_lm, tmp_path_factory):
    """A gateway over two lm replicas of the same model: the stack's own lm and a second one."""
    reference = text_stack("llama", *NO_DRAFTS)
    log_dir = tmp_path_factory.mktemp("second-replica")
    flags = ["--model", str(tiny_lm("llama").onnx_dir), "--providers", "cpu", "--intra-op-threads", "1"]
    second = ServiceProcess("lm", flags, log_dir)
    port = free_port()
    lm_addr = f"{reference.lm.address},{second.address}"
    flags = ["--tokenizer-addr", reference.tokenizer.address, "--lm-addr", lm_addr, "--metrics-port", str(port)]
    gateway = ServiceProcess("gateway", [*flags, *NO_DRAFTS], log_dir)
    yield gateway, port
    gateway.stop()
    second.stop()


def replica_bursts(port: int) -> dict[str, list[float]]:
    """{replica: [Decodes, steps they ran]} on the gateway's /metrics."""
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    found: dict[str, list[float]] = {}
    for line in body.splitlines():
        for position, name in enumerate(("muestra_decode_burst_steps_count", "muestra_decode_burst_steps_sum")):
            if line.startswith(name + "{"):
                replica = line.split('replica="', 1)[1].split('"', 1)[0]
                found.setdefault(replica, [0.0, 0.0])[position] += float(line.rsplit(" ", 1)[1])
    return found


def test_every_replica_runs_sampled_bursts_from_the_start(stacks, two_replicas):
    """The replicas after the first take the samplers they run from their Describe at start-up, as the first
    does: sampled rows burst on both (they ran a Decode per token there until one came back from a restart)."""
    _, _, _, single = stacks
    gateway, port = two_replicas
    jobs = [("t07", seed, PROMPTS[seed % len(PROMPTS)]) for seed in range(6)]
    with concurrent.futures.ThreadPoolExecutor(len(jobs)) as pool:
        runs = [pool.submit(tokens, gateway.address, chain, seed, prompt) for chain, seed, prompt in jobs]
        got = [run.result() for run in runs]
    assert got == [tokens(single.gateway.address, chain, seed, prompt) for chain, seed, prompt in jobs]
    bursts = replica_bursts(port)
    assert len(bursts) == 2, bursts  # both replicas took rows
    for replica, (decodes, steps) in bursts.items():
        assert steps >= TOKENS - 1 and decodes <= steps / 2, (replica, decodes, steps)


@pytest.fixture(scope="module")
def one_step(stacks, tiny_lm, tmp_path_factory):
    """A gateway that never bursts (--greedy-burst 1) over an lm of its own that shows its /metrics: the lm still
    picks sampled rows' tokens, a step at a time."""
    eight = stacks[0]
    log_dir = tmp_path_factory.mktemp("one-step")
    port = free_port()
    lm = start_lm(tiny_lm("llama").onnx_dir, "llama", log_dir, "--metrics-port", str(port))
    gateway = start_gateway(log_dir, eight.tokenizer.address, lm.address, "--greedy-burst", "1", *NO_DRAFTS)
    yield gateway, port
    gateway.stop()
    lm.stop()


def lm_sampled_tokens(port: int) -> float:
    """Tokens the lm picked with rows' own chains (muestra_lm_sampled_tokens_total on its /metrics)."""
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    lines = [line for line in body.splitlines() if line.startswith("muestra_lm_sampled_tokens_total")]
    return sum(float(line.split(" ")[1]) for line in lines)


@pytest.mark.parametrize("chain", ["model", "penalties", "mirostat"])
def test_a_step_of_its_own_has_the_lm_pick_with_the_gateways_tokens(stacks, one_step, chain):
    """A Decode of one step carries the sampled rows' chains too: the lm picks their tokens (and ships no logits
    for them), and the seeded tokens equal those the gateway picks from logits (the reference, whose lm runs no
    chains), alone and beside rows the lm does not pick for (a logprobs row, a greedy row, n=2)."""
    _, _, _, single = stacks
    gateway, port = one_step
    before = lm_sampled_tokens(port)
    assert tokens(gateway.address, chain, 11) == tokens(single.gateway.address, chain, 11)
    assert lm_sampled_tokens(port) - before == TOKENS - 1  # every token after the prefill's, picked in the lm
    jobs = [
        (chain, 12, PROMPTS[1], {}),
        ("t07", 13, PROMPTS[2], {"logprobs": True}),
        ("model", 14, PROMPTS[3], {"samplers": [{"name": "greedy"}]}),
        ("t07", 15, PROMPTS[4], {"n": 2}),
    ]
    expected = [tokens(single.gateway.address, c, seed, prompt, **extra) for c, seed, prompt, extra in jobs]
    with concurrent.futures.ThreadPoolExecutor(len(jobs)) as pool:
        runs = [pool.submit(tokens, gateway.address, c, seed, prompt, **extra) for c, seed, prompt, extra in jobs]
        assert [run.result() for run in runs] == expected

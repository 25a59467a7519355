"""The gateway spreads requests over lm replicas, keeps prefixes together, and survives a dead replica."""

from __future__ import annotations

import concurrent.futures

import pytest

from muestra.client import Client
from tests.fixtures.lm_service import start_lm
from tests.fixtures.text_stack import start_gateway


@pytest.fixture
def two_replicas(tiny_lm, text_stack, tmp_path):
    """Two lm processes on the same model and a gateway in front of both (health checks every 0.3 s)."""
    stack = text_stack("llama")  # reuse its tokenizer
    model_dir = tiny_lm("llama").onnx_dir
    replicas = [start_lm(model_dir, "llama", tmp_path) for _ in range(2)]
    gateway = start_gateway(
        tmp_path, stack.tokenizer.address, ",".join(r.address for r in replicas), "--health-interval-s", "0.3"
    )
    yield gateway, replicas
    gateway.stop()
    for replica in replicas:
        replica.stop()


def complete(address: str, prompt: str) -> tuple[str, str, int]:
    with Client(address, timeout=60) as client:
        _, done = client.complete(prompt, max_tokens=4, ignore_eos=True, samplers=[{"name": "greedy"}])
    return done.replica, done.error, done.completion_tokens


def test_new_prefixes_spread_and_shared_prefixes_stick(two_replicas):
    gateway, replicas = two_replicas
    prompts = [f"Story number {i}: once upon a time" for i in range(8)]
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        served = list(pool.map(lambda p: complete(gateway.address, p)[0], prompts))
    assert set(served) == {r.address for r in replicas}
    shared = "You are a helpful assistant that answers in one word. " * 3
    first = complete(gateway.address, shared + "Question one?")[0]
    for question in ("Question two?", "Question three?", "Question four?"):
        assert complete(gateway.address, shared + question)[0] == first


def test_requests_not_yet_streaming_move_to_a_live_replica_when_one_dies(two_replicas):
    gateway, replicas = two_replicas
    dead, alive = replicas
    dead.proc.kill()
    dead.proc.wait()
    prompts = [f"Request {i} arrives right after the crash" for i in range(10)]
    with concurrent.futures.ThreadPoolExecutor(10) as pool:
        results = list(pool.map(lambda p: complete(gateway.address, p), prompts))
    assert all(error == "" and tokens == 4 for _, error, tokens in results), results
    assert {replica for replica, _, _ in results} == {alive.address}


def test_a_sequence_goes_to_the_replica_holding_its_longest_prefix_else_to_its_key():
    from muestra.gateway.engine.generation.routing import SequenceAffinity

    table = SequenceAffinity("fingerprint", block_size=4)
    system = list(range(100, 110))
    turn = [*system, 1, 2, 3, 4, 5, 6, 7, 8, 9]
    table.record(table.keys(system), "a")  # a prompt sent to a
    table.record(table.keys(turn), "b")  # a finished row on b holds the conversation so far
    both = {"a", "b"}
    assert table.holder(table.keys([*turn, 42, 43]), "", both) == "b"  # the next turn: b holds the most
    assert table.holder(table.keys([*system, 77, 78, 79, 80]), "", both) == "b"  # b's row starts like a's
    # A block remembers its latest replica only: with b out of rotation, the least-loaded replica takes it.
    assert table.holder(table.keys([*turn, 42]), "", {"a"}) is None
    table.record(table.keys([5, 5, 5]), "a", hint="user-1")
    assert table.holder(table.keys([9, 9, 9, 9, 9, 9]), "user-1", both) == "a"  # nothing held: the key's
    assert table.holder(table.keys([9, 9, 9, 9, 9, 9]), "user-2", both) is None  # nothing: least loaded
    assert table.holder(table.keys([5, 5, 5]), "", both) == "a"  # shorter than a block: the whole prompt

"""A long prompt stalls no one: it is prefilled in chunks with the running rows' steps between them, a short request
that arrives meanwhile is served, and the busy replica stays in the rotation. Chunking changes no token."""

from __future__ import annotations

import asyncio
import time

import grpc
import pytest

from bench.stack import LocalStack
from muestra.v1 import gateway_pb2, gateway_pb2_grpc
from tests.fixtures.default_model import default_model_or_skip
from tests.fixtures.lm_service import start_lm
from tests.fixtures.text_stack import start_gateway
from tests.harness import ServiceProcess
from tests.reliability.test_failover import Stream, all_replicas_up, run

CHUNK = 64


def document(tag: str, words: int) -> str:
    """A prompt of about 7 tokens an item, unlike any other test's (nothing of it is cached)."""
    return f"{tag}: " + " ".join(f"item{i % 97} {tag}{i}" for i in range(words)) + "\nSummary:"


@pytest.fixture(scope="module")
def busy_stack(tmp_path_factory):
    """The default model on one replica prefilling CHUNK tokens at a time, and a gateway that checks its health
    every 0.2 s with a deadline too short for any answer (every check times out)."""
    stack = LocalStack(
        tmp_path_factory.mktemp("long-prompts"), text_model=default_model_or_skip(), image_model=None, redis=False,
        lm_args=("--prefill-chunk-tokens", str(CHUNK)),
        gateway_args=("--health-interval-s", "0.2", "--health-timeout-s", "0.000001"),
    )  # fmt: skip
    yield stack
    stack.close()


async def first_token_after(stub, prompt: str, max_tokens: int = 2) -> tuple[float, Stream]:
    started = time.monotonic()
    stream = Stream(stub, prompt, max_tokens=max_tokens)
    await stream.started(timeout=120)
    return time.monotonic() - started, stream


def test_a_running_stream_waits_about_one_chunk_while_a_long_prompt_prefills(busy_stack):
    stack = busy_stack

    async def scenario():
        async with grpc.aio.insecure_channel(stack.gateway.address) as channel:
            stub = gateway_pb2_grpc.GatewayStub(channel)
            await all_replicas_up(stack, stub)
            alone, stream = await first_token_after(stub, document("alpha", 210))
            await asyncio.wait_for(stream.task, 60)
            assert stream.error is None, stream.error
            prompt_tokens = stream.done.usage.prompt_tokens
            bystander = Stream(stub, "Once upon a time", max_tokens=4000, sampler="sample")
            await bystander.started()
            await asyncio.sleep(0.5)
            arrived = time.monotonic()
            during, stream = await first_token_after(stub, document("beta", 210))
            gap = bystander.longest_gap_after(arrived)
            bystander.call.cancel()
            await asyncio.wait_for(stream.task, 60)
            return alone, during, prompt_tokens, gap

    alone, during, prompt_tokens, gap = run(scenario())
    chunks = -(-prompt_tokens // CHUNK)
    chunk_s = alone / chunks
    assert chunks >= 20, prompt_tokens
    # Unchunked, the bystander would wait the whole prefill (`alone`, 20+ chunks); it waits about one chunk.
    assert gap <= 3 * chunk_s, (gap, chunk_s, alone)
    assert during <= 2 * alone, (during, alone)
    log = stack.gateway.log_path.read_text(errors="replace")
    assert "taken out of rotation" not in log


def test_a_short_request_is_served_while_a_long_prompt_prefills_and_the_replica_stays_in_rotation(busy_stack):
    stack = busy_stack

    async def scenario():
        async with grpc.aio.insecure_channel(stack.gateway.address) as channel:
            stub = gateway_pb2_grpc.GatewayStub(channel)
            await all_replicas_up(stack, stub)
            long = Stream(stub, document("gamma", 210), max_tokens=2)
            await asyncio.sleep(0.3)
            _, short = await first_token_after(stub, "x = 1\n", max_tokens=4)
            long_pending = not long.ids
            await asyncio.wait_for(asyncio.gather(long.task, short.task), 120)
            models = await stub.ListModels(gateway_pb2.ListModelsRequest(), timeout=5)
            return long_pending, short, long, models

    long_pending, short, long, models = run(scenario())
    assert long_pending, "the short request was served only after the long prompt's first token"
    assert short.error is None and long.error is None
    assert short.done.finish_reason == gateway_pb2.LENGTH and len(short.ids) == 4
    assert next(m.replicas for m in models.models if m.kind == "text") == 1
    log = stack.gateway.log_path.read_text(errors="replace")
    assert "taken out of rotation" not in log and "no healthy lm replica" not in log
    assert "answers its health check late (busy, or the only replica), so it stays" in log


@pytest.fixture(scope="module")
def chunked_and_whole(tiny_lm, tmp_path_factory):
    """Two gateways on the tests' Llama: one lm prefills 16 tokens at a time, the other in one forward."""
    log_dir = tmp_path_factory.mktemp("chunked")
    model = tiny_lm("llama").onnx_dir
    processes: list[ServiceProcess] = [ServiceProcess("tokenizer", ["--models", str(model)], log_dir)]
    stubs = []
    try:
        for chunk in ("16", "0"):
            lm = start_lm(model, "llama", log_dir, "--prefill-chunk-tokens", chunk, "--prefix-cache", "false")
            gateway = start_gateway(log_dir, processes[0].address, lm.address)
            processes += [lm, gateway]
            stubs.append(gateway_pb2_grpc.GatewayStub(grpc.insecure_channel(gateway.address)))
        yield stubs
    finally:
        for process in reversed(processes):
            process.stop()


def generate(stub, prompt: str, sampler: str, seed: int) -> list[int]:
    request = gateway_pb2.GenerateRequest(prompt=prompt, max_tokens=24, seed=seed, ignore_eos=True)
    request.samplers.append(gateway_pb2.SamplerSpec(name=sampler))
    return [i for m in stub.Generate(request, timeout=120) if m.HasField("delta") for i in m.delta.token_ids]


@pytest.mark.parametrize("sampler", ["greedy", "sample"])
def test_a_long_prompt_gives_the_same_tokens_prefilled_in_chunks_or_in_one_forward(chunked_and_whole, sampler):
    chunked, whole = chunked_and_whole
    prompt = " ".join(f"word{i % 50} and more {i}" for i in range(45))
    for seed in (1, 2, 3):
        assert generate(chunked, prompt, sampler, seed) == generate(whole, prompt, sampler, seed)

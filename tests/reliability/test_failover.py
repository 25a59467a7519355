"""Killed, stopped and restarted lm replicas under a real gateway: failover, the watchdog, deadlines."""

from __future__ import annotations

import asyncio
import itertools
import time

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from bench.stack import LocalStack
from muestra.runtime.channels import metadata_interceptors
from muestra.v1 import gateway_pb2, gateway_pb2_grpc, lm_pb2, lm_pb2_grpc
from tests.reliability.stutter import stuttering

pytestmark = pytest.mark.slow


class Stream:
    """One Generate call read in the background: its token ids, when each came, how it ended."""

    def __init__(self, stub, prompt: str, max_tokens: int, seed: int = 7, sampler: str = "greedy") -> None:
        request = gateway_pb2.GenerateRequest(prompt=prompt, max_tokens=max_tokens, seed=seed, ignore_eos=True)
        request.samplers.add(name=sampler)
        self.call = stub.Generate(request, timeout=120)
        self.ids: list[int] = []
        self.times: list[float] = []
        self.done: gateway_pb2.Done | None = None
        self.error: grpc.aio.AioRpcError | None = None
        self.task = asyncio.ensure_future(self._read())

    async def _read(self) -> None:
        try:
            async for message in self.call:
                if message.HasField("delta"):
                    self.ids.extend(message.delta.token_ids)
                    self.times.append(time.monotonic())
                else:
                    self.done = message.done
        except grpc.aio.AioRpcError as exc:
            self.error = exc

    async def started(self, timeout: float = 20.0) -> None:
        deadline = time.monotonic() + timeout
        while not self.ids and not self.task.done():
            assert time.monotonic() < deadline, "no first token"
            await asyncio.sleep(0.01)

    def longest_gap_after(self, moment: float) -> float:
        times = [moment, *(t for t in self.times if t > moment)]
        return max((b - a for a, b in itertools.pairwise(times)), default=0.0)


async def gateway_replicas(stub) -> int:
    models = await stub.ListModels(gateway_pb2.ListModelsRequest(), timeout=5)
    return next(m.replicas for m in models.models if m.kind == "text")


async def all_replicas_up(stack: LocalStack, stub, timeout: float = 60.0) -> None:
    """Every lm process running and back in the gateway's rotation."""
    for lm in stack.lm:
        if not lm.alive():
            lm.start()
        lm.resume()
    deadline = time.monotonic() + timeout
    while await gateway_replicas(stub) < len(stack.lm):
        assert time.monotonic() < deadline, "a replica did not rejoin"
        await asyncio.sleep(0.2)


async def lm_idle(stack: LocalStack, lm, timeout: float = 10.0) -> None:
    """Wait until the lm replica holds no rows."""
    interceptors = metadata_interceptors(stack.internal_token)
    async with grpc.aio.insecure_channel(lm.address, interceptors=interceptors) as channel:
        stub = lm_pb2_grpc.LanguageModelStub(channel)
        deadline = time.monotonic() + timeout
        while (await stub.Describe(lm_pb2.DescribeModelRequest(), timeout=5)).load.rows:
            assert time.monotonic() < deadline, f"{lm.address} still holds rows"
            await asyncio.sleep(0.02)


async def complete(stub, prompt: str, max_tokens: int = 12, timeout: float = 30.0):
    """One greedy generation to its end: (token ids, the replica that served it)."""
    stream = Stream(stub, prompt, max_tokens)
    await asyncio.wait_for(stream.task, timeout)
    assert stream.error is None, stream.error
    assert stream.done is not None and stream.done.finish_reason == gateway_pb2.LENGTH, stream.done
    return stream.ids, stream.done.replica


def run(coroutine):
    return asyncio.run(asyncio.wait_for(coroutine, 240))


def test_killing_a_replica_leaves_the_other_streaming_and_moves_what_had_not_started(two_replicas):
    stack = two_replicas
    lm0, lm1 = stack.lm

    async def scenario():
        async with grpc.aio.insecure_channel(stack.gateway.address) as channel:
            stub = gateway_pb2_grpc.GatewayStub(channel)
            await all_replicas_up(stack, stub)
            prompts = ["import os\n", "class A:\n", "x = [", "def f(a, b):\n", "# parse\n", "return self.", "if x:\n"]
            references = {p: await complete(stub, p) for p in prompts}
            # One long stream on each replica: the least-loaded one takes a new prefix. They sample, so they
            # step a token per Decode (greedy rows alone would run in bursts and end before the kill).
            first = Stream(stub, "def long_one():\n", max_tokens=450, sampler="sample")
            await first.started()
            second = Stream(stub, "for i in range(10):\n", max_tokens=450, sampler="sample")
            await second.started()
            await asyncio.sleep(0.3)
            killed_at = time.monotonic()

            # New requests right after the kill: the ones routed to lm0 before it leaves the rotation move,
            # and all of them join the survivor's running batch while its detokenization is in flight.
            async def keep_sending(k: int) -> list[tuple[str, tuple]]:
                sent = []
                while not (first.task.done() and second.task.done()) or not sent:
                    prompt = prompts[(k + len(sent)) % len(prompts)]
                    sent.append((prompt, await complete(stub, prompt)))
                return sent

            with stuttering(stack.tokenizer):
                lm0.kill()
                senders = asyncio.gather(*(keep_sending(k) for k in range(4)))
                await asyncio.wait_for(asyncio.gather(first.task, second.task), 60)
                fresh = [one for sent in await asyncio.wait_for(senders, 60) for one in sent]
            return references, fresh, first, second, killed_at

    references, fresh, first, second, killed_at = run(scenario())
    streams = sorted([first, second], key=lambda s: s.done is not None and s.done.finish_reason == gateway_pb2.LENGTH)
    broken, survivor = streams
    # The survivor, on lm1, never stalled and ran to its end.
    assert survivor.error is None and survivor.done.finish_reason == gateway_pb2.LENGTH
    assert survivor.done.replica == lm1.address and len(survivor.ids) == 450
    assert survivor.longest_gap_after(killed_at) < 5.0, survivor.longest_gap_after(killed_at)
    # The stream on lm0 had started: it ends with a status naming the replica and how to retry.
    if broken.error is not None:
        assert broken.error.code() == grpc.StatusCode.UNAVAILABLE, broken.error
        message = broken.error.details()
    else:
        assert broken.done.finish_reason == gateway_pb2.ERROR, broken.done
        message = broken.done.error
    assert lm0.address in message and "retry with seed 7" in message, message
    # Every request sent after the kill completed, on lm1, with the text it gets on a healthy stack.
    assert len(fresh) >= 8
    for prompt, (ids, replica) in fresh:
        assert replica == lm1.address and ids == references[prompt][0], prompt


def test_a_restarted_replica_rejoins_the_rotation(two_replicas):
    stack = two_replicas
    lm0 = stack.lm[0]

    async def scenario():
        async with grpc.aio.insecure_channel(stack.gateway.address) as channel:
            stub = gateway_pb2_grpc.GatewayStub(channel)
            await all_replicas_up(stack, stub)
            lm0.kill()
            deadline = time.monotonic() + 10
            while await gateway_replicas(stub) != 1:
                assert time.monotonic() < deadline, "the killed replica stayed in the rotation"
                await asyncio.sleep(0.1)
            # Down for a while: grpc's reconnect backoff grows meanwhile (to 2 min by default; capped at 2 s).
            await asyncio.sleep(8)
            lm0.start()
            rejoined_in = time.monotonic()
            await all_replicas_up(stack, stub, timeout=10)
            rejoined_in = time.monotonic() - rejoined_in
            # Both idle: a new prefix goes to the first replica again.
            served = [await complete(stub, f"value_{k} = ") for k in range(3)]
            return rejoined_in, served

    rejoined_in, served = run(scenario())
    assert rejoined_in < 4.0, rejoined_in
    replicas = {replica for _, replica in served}
    assert replicas == {lm0.address}, replicas


def test_a_request_that_streamed_nothing_moves_off_a_replica_that_dies(two_replicas):
    stack = two_replicas
    lm0, lm1 = stack.lm
    prompt = "def parse(text):\n"

    async def scenario():
        async with grpc.aio.insecure_channel(stack.gateway.address) as channel:
            stub = gateway_pb2_grpc.GatewayStub(channel)
            await all_replicas_up(stack, stub)
            reference, replica = await complete(stub, prompt, max_tokens=16)
            assert replica == lm0.address  # both idle: the first replica; the prompt's prefix now prefers it
            # The scheduler frees the finished batch after the client has its answer: pausing lm0 before
            # that would hold the new request in lm0's queue, which a failed health check empties early.
            await lm_idle(stack, lm0)
            lm0.pause()  # its prefill will not answer
            stuck = Stream(stub, prompt, max_tokens=16)
            # Less than the health timeout (1 s): the first health check sent after the pause cannot have failed
            # yet, so the request is still waiting on lm0 rather than already moved to lm1 and streaming there.
            await asyncio.sleep(0.5)
            assert not stuck.ids
            lm0.kill()
            await asyncio.wait_for(stuck.task, 30)
            return reference, stuck

    reference, stuck = run(scenario())
    assert stuck.error is None, stuck.error
    assert stuck.done.finish_reason == gateway_pb2.LENGTH and stuck.done.replica == lm1.address
    assert stuck.ids == reference
    log = stack.gateway.log_path.read_text(errors="replace")
    assert f"moving it off {lm0.address}" in log or f"replica {lm0.address} taken out of rotation" in log


@pytest.fixture(scope="module")
def impatient(tmp_path_factory):
    """One replica, a gateway with a 4 s lm deadline and a 1.5 s watchdog."""
    stack = LocalStack(
        tmp_path_factory.mktemp("impatient"), lm_replicas=1, image_model=None, redis=False,
        gateway_args=("--lm-timeout-s", "4", "--watchdog-s", "1.5", "--health-interval-s", "0.5"),
    )  # fmt: skip
    yield stack
    stack.close()


def health(address: str) -> int:
    with grpc.insecure_channel(address) as channel:
        return health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5).status


def test_a_stuck_replica_turns_the_gateway_not_serving_then_its_deadline_fails_the_request(impatient):
    stack = impatient
    lm = stack.lm[0]
    SERVING, NOT_SERVING = health_pb2.HealthCheckResponse.SERVING, health_pb2.HealthCheckResponse.NOT_SERVING

    async def scenario():
        async with grpc.aio.insecure_channel(stack.gateway.address) as channel:
            stub = gateway_pb2_grpc.GatewayStub(channel)
            await all_replicas_up(stack, stub)
            stream = Stream(stub, "def stuck():\n", max_tokens=400, sampler="sample")
            await stream.started()
            lm.pause()
            paused_at = time.monotonic()
            statuses = []
            while not stream.task.done() and time.monotonic() - paused_at < 30:
                statuses.append((time.monotonic() - paused_at, await asyncio.to_thread(health, stack.gateway.address)))
                await asyncio.sleep(0.25)
            ended_after = time.monotonic() - paused_at
            await asyncio.sleep(2.5)  # nothing left to do: the watchdog clears
            after_end = await asyncio.to_thread(health, stack.gateway.address)
            # Meanwhile a new request is refused at once, with a clear status, not queued forever.
            refused = Stream(stub, "x = 1\n", max_tokens=12)
            await asyncio.wait_for(refused.task, 10)
            lm.resume()
            await all_replicas_up(stack, stub, timeout=15)
            ids, _ = await complete(stub, "x = 1\n")
            return stream, statuses, ended_after, after_end, refused.error, ids

    stream, statuses, ended_after, after_end, refused, ids = run(scenario())
    assert NOT_SERVING in [s for _, s in statuses], statuses
    assert 3.5 < ended_after < 10, ended_after
    message = stream.error.details() if stream.error is not None else stream.done.error
    assert lm.address in message and "did not answer within 4 s" in message, message
    assert after_end == SERVING
    assert refused is not None and refused.code() == grpc.StatusCode.UNAVAILABLE
    assert "no healthy lm replica" in refused.details()
    assert len(ids) == 12
    log = stack.gateway.log_path.read_text(errors="replace")
    assert "NOT_SERVING: scheduler of lm" in log and f"lm {lm.address} BatchSteps Decode" in log, log[-3000:]
    assert "SERVING again" in log

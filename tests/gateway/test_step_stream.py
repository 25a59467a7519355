"""StepStream: reopening, and retrying only what may be retried (with a fake stream); no task left behind when the
server ends a stream (with a real one)."""

from __future__ import annotations

import asyncio
import gc

import grpc
import pytest

from muestra.gateway.engine.clients.step_stream import StepStream
from muestra.runtime.channels import service_channel


def rpc_error(code: grpc.StatusCode) -> grpc.aio.AioRpcError:
    return grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(), details=code.name)


class FakeCall:
    """A stream that doubles numbers, or fails every exchange with `error`."""

    def __init__(self, error: grpc.aio.AioRpcError | None = None) -> None:
        self.error = error
        self.ended = False
        self.cancelled = False
        self.requests = None  # the request iterator the stream was opened with

    def done(self) -> bool:
        return self.ended or self.cancelled

    def cancel(self) -> bool:
        self.cancelled = True
        return True

    async def read(self):
        request = await self.requests.__anext__()
        if self.error is not None:
            raise self.error
        return 2 * request


class Opener:
    def __init__(self, *calls: FakeCall) -> None:
        self.calls = list(calls)
        self.opened: list[FakeCall] = []

    def __call__(self, requests) -> FakeCall:
        call = self.calls.pop(0) if self.calls else FakeCall()
        call.requests = requests
        self.opened.append(call)
        return call


def run(coroutine):
    return asyncio.run(coroutine)


def test_one_stream_serves_every_step():
    opener = Opener()
    stream = StepStream(opener, "fake")

    async def steps():
        return [await stream.step(i) for i in range(5)]

    assert run(steps()) == [0, 2, 4, 6, 8]
    assert len(opener.opened) == 1


def test_a_stream_that_ended_while_idle_is_replaced_before_the_step():
    opener = Opener()
    stream = StepStream(opener, "fake", retry=False)

    async def steps():
        first = await stream.step(1)
        opener.opened[0].ended = True  # the server went away
        return first, await stream.step(2)

    assert run(steps()) == (2, 4)
    assert len(opener.opened) == 2


@pytest.mark.parametrize("retry", [True, False])
def test_a_step_that_breaks_a_reused_stream_is_retried_only_when_allowed(retry):
    broken = FakeCall()
    opener = Opener(broken)
    stream = StepStream(opener, "fake", retry=retry)

    async def steps():
        await stream.step(1)
        broken.error = rpc_error(grpc.StatusCode.UNAVAILABLE)
        return await stream.step(3)

    if retry:
        assert run(steps()) == 6
        assert len(opener.opened) == 2 and broken.cancelled
    else:
        with pytest.raises(grpc.aio.AioRpcError):
            run(steps())
        assert len(opener.opened) == 1 and broken.cancelled


def test_a_bad_request_is_not_retried_and_the_next_step_opens_a_new_stream():
    bad = FakeCall()
    opener = Opener(bad)
    stream = StepStream(opener, "fake")

    async def steps():
        await stream.step(1)
        bad.error = rpc_error(grpc.StatusCode.INVALID_ARGUMENT)
        with pytest.raises(grpc.aio.AioRpcError) as raised:
            await stream.step(2)
        assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        return await stream.step(5)

    assert run(steps()) == 10
    assert len(opener.opened) == 2


def test_a_failure_on_a_fresh_stream_is_raised_at_once():
    opener = Opener(FakeCall(rpc_error(grpc.StatusCode.UNAVAILABLE)))
    stream = StepStream(opener, "fake")
    with pytest.raises(grpc.aio.AioRpcError):
        run(stream.step(1))
    assert len(opener.opened) == 1


class QueueCall(FakeCall):
    """A stream like grpc's: replies queue in order of the requests, whoever reads; a read can be made to wait."""

    def __init__(self) -> None:
        super().__init__()
        self.replies: asyncio.Queue = asyncio.Queue()
        self.in_flight = 0
        self.most_in_flight = 0
        self.hold = asyncio.Event()
        self.hold.set()
        self.server: asyncio.Task | None = None

    async def _serve(self) -> None:
        async for request in self.requests:
            self.in_flight += 1
            self.most_in_flight = max(self.most_in_flight, self.in_flight)
            self.replies.put_nowait(2 * request)

    async def read(self):
        if self.server is None:
            self.server = asyncio.ensure_future(self._serve())
        await self.hold.wait()
        reply = await self.replies.get()
        self.in_flight -= 1
        return reply


def test_concurrent_steps_take_turns_and_each_gets_its_own_reply():
    # The gateway's hang: a prefill's DetokenizeStep and the previous step's, on one stream at once.
    call = QueueCall()
    stream = StepStream(Opener(call), "fake")

    async def steps():
        call.hold.clear()
        first = asyncio.ensure_future(stream.step(1))
        second = asyncio.ensure_future(stream.step(10))
        await asyncio.sleep(0.01)
        call.hold.set()
        return await asyncio.gather(first, second)

    assert run(steps()) == [2, 20]
    assert call.most_in_flight == 1


def test_a_step_cancelled_between_its_write_and_its_read_closes_the_stream():
    # Its reply would otherwise be read by the next step as that step's own.
    call = QueueCall()
    opener = Opener(call)
    stream = StepStream(opener, "fake")

    async def steps():
        call.hold.clear()
        waiting = asyncio.ensure_future(stream.step(1))
        await asyncio.sleep(0.01)
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        return await stream.step(5)

    assert run(steps()) == 10
    assert call.cancelled and len(opener.opened) == 2


def test_a_reply_later_than_the_deadline_is_deadline_exceeded_and_closes_the_stream():
    call = QueueCall()
    opener = Opener(call)
    stream = StepStream(opener, "fake", timeout_s=0.05)

    async def steps():
        call.hold.clear()
        with pytest.raises(grpc.aio.AioRpcError) as raised:
            await stream.step(1)
        assert raised.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        assert "did not answer within 0.05 s" in raised.value.details()
        return await stream.step(4)

    assert run(steps()) == 8
    assert call.cancelled and len(opener.opened) == 2


async def _echo(requests, context):
    async for request in requests:
        yield request


@pytest.mark.parametrize("when", ["idle", "mid-step"])
def test_a_stream_its_server_ended_leaves_no_task_behind_once_closed(when):
    # Issue 48: with the services' interceptors, grpc writes a stream's requests from a task of its own; when the
    # server went away first, closing the stream left that task waiting forever ("Task was destroyed but it is
    # pending", then "aclose(): asynchronous generator is already running" when it was collected).
    async def scenario():
        problems = []
        asyncio.get_running_loop().set_exception_handler(lambda loop, context: problems.append(context["message"]))
        server = grpc.aio.server()
        handler = grpc.method_handlers_generic_handler("t.T", {"Echo": grpc.stream_stream_rpc_method_handler(_echo)})
        server.add_generic_rpc_handlers((handler,))
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        channel = service_channel(f"127.0.0.1:{port}")
        stream = StepStream(channel.stream_stream("/t.T/Echo"), "echo", retry=False)
        assert await stream.step(b"one") == b"one"
        await server.stop(0)  # the replica is killed
        if when == "mid-step":
            with pytest.raises(grpc.aio.AioRpcError):
                await stream.step(b"two")
        else:
            await asyncio.sleep(0.2)
        stream.close()
        await asyncio.sleep(0.1)
        left = [task.get_coro() for task in asyncio.all_tasks() if task is not asyncio.current_task()]
        del stream
        gc.collect()
        await asyncio.sleep(0.1)
        await channel.close()
        return left, problems

    left, problems = run(scenario())
    assert left == [] and problems == [], (left, problems)

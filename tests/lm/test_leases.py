"""Leased batches: only the lease that made a batch may use it, and batches whose caller left are freed.

Real lm processes (and a real gateway for the kill case): a batch goes when its lease's step stream
breaks, or when nobody has used it for --batch-idle-s; another caller's Clear frees nothing of it.
"""

from __future__ import annotations

import signal
import threading
import time

import grpc
import pytest

from muestra.client import Client
from muestra.runtime.step_streams import LEASE_HEADER
from muestra.v1 import lm_pb2
from tests.fixtures.text_stack import start_gateway
from tests.harness import ServiceProcess
from tests.lm.lm_client import prefill

IDLE_S = 2


@pytest.fixture(scope="module")
def lm(lm_service):
    return lm_service("llama", "--batch-idle-s", str(IDLE_S))


def rows(lm) -> int:
    return lm.stub.Describe(lm_pb2.DescribeModelRequest()).load.rows


def wait_rows(lm, expected: int, timeout_s: float) -> float:
    started = time.monotonic()
    while rows(lm) != expected:
        assert time.monotonic() - started < timeout_s, f"{rows(lm)} rows held, expected {expected}"
        time.sleep(0.05)
    return time.monotonic() - started


def test_another_lease_cannot_step_or_clear_a_batch(lm):
    mine = ((LEASE_HEADER, "lease-a"),)
    row = lm_pb2.PrefillRow(input_ids=[5, 6, 7], output=lm_pb2.OutputSpec(kind=lm_pb2.ARGMAX))
    batch = lm.stub.Prefill(lm_pb2.PrefillRequest(rows=[row]), metadata=mine).batch_id
    # Without the lease the batch is unknown, and a Clear of everything frees only the caller's own.
    with pytest.raises(grpc.RpcError) as error:
        lm.stub.Decode(lm_pb2.DecodeRequest(batches=[lm_pb2.DecodeBatch(batch_id=batch, next_ids=[1])]))
    assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "unknown batch" in error.value.details()
    lm.stub.Clear(lm_pb2.ClearRequest())
    lm.stub.Clear(lm_pb2.ClearRequest(batch_ids=[batch]), metadata=((LEASE_HEADER, "lease-b"),))
    assert rows(lm) == 1
    step = lm.stub.Decode(lm_pb2.DecodeRequest(batches=[lm_pb2.DecodeBatch(batch_id=batch, next_ids=[1])]),
                          metadata=mine)  # fmt: skip
    lm.stub.Clear(lm_pb2.ClearRequest(), metadata=mine)
    assert step.batch_id and rows(lm) == 0


def test_a_batch_nobody_uses_is_freed_after_the_idle_time(lm):
    prefill(lm.stub, [[5, 6, 7, 8], [9, 10]])  # and never cleared
    assert rows(lm) == 2
    took = wait_rows(lm, 0, IDLE_S + 10)
    assert took >= IDLE_S - 0.5
    assert "unused for 2 s: their caller left without clearing them" in lm.process.log_tail(20)


def test_a_broken_step_stream_frees_its_leases_batches(lm):
    lease = ((LEASE_HEADER, "lease-stream"),)
    row = lm_pb2.PrefillRow(input_ids=[5, 6, 7], output=lm_pb2.OutputSpec(kind=lm_pb2.ARGMAX))
    batch = lm.stub.Prefill(lm_pb2.PrefillRequest(rows=[row]), metadata=lease).batch_id
    go_on = threading.Event()

    def steps():
        yield lm_pb2.BatchStepRequest(
            decode=lm_pb2.DecodeRequest(batches=[lm_pb2.DecodeBatch(batch_id=batch, next_ids=[1])])
        )
        go_on.wait(30)

    stream = lm.stub.BatchSteps(steps(), metadata=lease)
    assert next(stream).decode.batch_id
    assert rows(lm) == 1
    stream.cancel()  # as a caller that dies does
    go_on.set()
    assert wait_rows(lm, 0, IDLE_S - 0.5) < IDLE_S - 0.5  # well before the idle sweep could have


def test_a_killed_gateway_leaves_no_batches_behind(lm, tiny_lm, tmp_path):
    tokenizer_dir = tiny_lm("llama").onnx_dir
    tokenizer = ServiceProcess("tokenizer", ["--models", str(tokenizer_dir)], tmp_path)
    gateway = start_gateway(tmp_path, tokenizer.address, lm.process.address)
    try:
        with Client(gateway.address, timeout=60) as client:
            generations = [client.generate("The quick brown fox", max_tokens=400, ignore_eos=True, seed=i)
                           for i in range(3)]  # fmt: skip
            for generation in generations:
                next(iter(generation))
            assert rows(lm) >= 3
            gateway.proc.send_signal(signal.SIGKILL)
            gateway.proc.wait(10)
            took = wait_rows(lm, 0, IDLE_S - 0.5)
    finally:
        gateway.stop()
        tokenizer.stop()
    assert took < IDLE_S - 0.5

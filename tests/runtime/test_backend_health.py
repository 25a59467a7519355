"""BackendHealth: a failing backend is skipped between probes whose window doubles from 1 s to 16 s,
with one warning when it goes down and one info line when it is back."""

from __future__ import annotations

import logging

import grpc
import pytest
from prometheus_client import CollectorRegistry, Counter

from muestra.runtime.calls import BackendHealth, grpc_error_to_muestra

LOG = logging.getLogger("tests.runtime.backend_health")


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


def _health(clock: FakeClock, by_op: bool = False) -> tuple[BackendHealth, dict[str, Counter]]:
    registry = CollectorRegistry()
    labels = ["op"] if by_op else []
    counters = {
        "errors": Counter("errors_total", "errors", labels, registry=registry),
        "incidents": Counter("incidents_total", "incidents", registry=registry),
        "skipped": Counter("skipped_total", "skipped", labels, registry=registry),
    }
    health = BackendHealth("cache: Redis at test", "every request is a miss", LOG, clock=clock, **counters)
    return health, counters


def _value(counter: Counter, op: str | None = None) -> float:
    return (counter.labels(op=op) if op else counter)._value.get()


def _probes_at(health: BackendHealth, clock: FakeClock) -> list[float]:
    """Seconds after the first failure at which a probe was let through, over 60 s of calls every 0.25 s."""
    start = clock.now
    probes = []
    for _ in range(240):
        clock.now += 0.25  # exact in binary, so windows end on a call
        if health.should_try("read"):
            probes.append(clock.now - start)
            health.failed("read", ConnectionError("refused"))
    return probes


def test_a_healthy_backend_is_always_tried(clock):
    health, counters = _health(clock)
    assert all(health.should_try("read") for _ in range(100))
    assert _value(counters["skipped"]) == 0


def test_probe_windows_double_from_one_second_to_sixteen(clock):
    health, _ = _health(clock)
    health.failed("read", ConnectionError("refused"))
    probes = _probes_at(health, clock)
    gaps = [b - a for a, b in zip([0.0, *probes[:-1]], probes, strict=True)]
    assert gaps[:6] == [1.0, 2.0, 4.0, 8.0, 16.0, 16.0]
    assert set(gaps[4:]) == {16.0}


def test_only_one_caller_probes_per_window(clock):
    health, counters = _health(clock)
    health.failed("read", TimeoutError("slow"))
    assert [health.should_try("read") for _ in range(100)].count(True) == 0
    clock.now += 1.0
    assert [health.should_try("read") for _ in range(100)].count(True) == 1
    assert _value(counters["skipped"]) == 199


def test_one_warning_when_it_goes_down_and_one_line_when_it_is_back(clock, caplog):
    health, counters = _health(clock)
    with caplog.at_level(logging.INFO, logger=LOG.name):
        for _ in range(2):
            health.failed("read", ConnectionError("refused"))
            _probes_at(health, clock)
            health.succeeded("read")
            health.succeeded("read")
    messages = [(r.levelno, r.getMessage()) for r in caplog.records]
    assert [level for level, _ in messages] == [logging.WARNING, logging.INFO] * 2
    assert messages[0][1] == (
        "cache: Redis at test read failed (ConnectionError: refused); every request is a miss until it recovers "
        "(retrying after 1 s, then less often)"
    )
    assert messages[1][1].startswith("cache: Redis at test answers again after 60.0 s (")
    assert _value(counters["incidents"]) == 2


def test_recovery_restarts_the_backoff_at_one_second(clock):
    health, _ = _health(clock)
    health.failed("read", ConnectionError("refused"))
    _probes_at(health, clock)
    health.succeeded("read")
    assert health.healthy
    health.failed("read", ConnectionError("refused"))
    assert _probes_at(health, clock)[:2] == [1.0, 3.0]


def test_only_a_success_of_the_failing_kind_of_call_ends_an_incident(clock):
    health, _ = _health(clock)
    health.failed("read", ConnectionError("refused"))
    health.succeeded("write")
    assert not health.healthy
    health.succeeded("read")
    assert health.healthy


def test_counters_labelled_by_op_count_each_kind_of_call(clock):
    health, counters = _health(clock, by_op=True)
    health.failed("read", ConnectionError("refused"))
    health.should_try("write")
    health.should_try("read")
    assert (_value(counters["errors"], "read"), _value(counters["skipped"], "write")) == (1, 1)
    assert (_value(counters["skipped"], "read"), _value(counters["incidents"])) == (1, 1)


def test_a_backend_status_passes_on_with_its_code_and_message():
    exc = grpc.aio.AioRpcError(grpc.StatusCode.NOT_FOUND, grpc.aio.Metadata(), grpc.aio.Metadata(), "no such model")
    error = grpc_error_to_muestra(exc)
    assert (error.code, str(error)) == (grpc.StatusCode.NOT_FOUND, "no such model")


def test_a_backend_status_without_a_message_passes_on_its_code_name():
    exc = grpc.aio.AioRpcError(grpc.StatusCode.UNAVAILABLE, grpc.aio.Metadata(), grpc.aio.Metadata())
    assert str(grpc_error_to_muestra(exc)) == "UNAVAILABLE"

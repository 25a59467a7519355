"""The gateway admits a request only when the lm's KV budget holds the batch it joins until every row could
reach its end, counted as the lm counts it (padding included); a request too big even alone is refused at once.

First the rule on plain numbers, then through real processes: an lm whose budget holds about two long rows,
six long greedy requests at once."""

from __future__ import annotations

import random
import re
import threading
import time
import types
import urllib.request

import pytest
from prometheus_client import REGISTRY
from prometheus_client.parser import text_string_to_metric_families

from muestra.client import Client, MuestraError, ResourceExhaustedError
from muestra.gateway.engine.clients.backends import LmReplica
from muestra.gateway.engine.clients.kv_budget import KvBudget
from muestra.gateway.engine.generation.kv_admission import KvAdmission, batch_ends, request_ends, row_end
from muestra.gateway.engine.generation.request import BeamRow, GenerationRequest
from muestra.v1 import common_pb2, lm_pb2
from tests.fixtures.text_stack import start_gateway
from tests.harness import ServiceProcess, free_port

# SmolLM2-135M-Instruct, fp32 KV: 30 layers x 3 KV heads x 64 dims, keys and values.
SMOLLM2 = lm_pb2.DescribeModelResponse(
    context_length=8192,
    kv=lm_pb2.KvLayout(num_layers=30, num_kv_heads=3, head_dim=64, dtype=common_pb2.FLOAT32, storage="shared"),
    load=lm_pb2.ServiceLoad(kv_budget_bytes=4 << 30),
)


def request(prompt_tokens: int, max_tokens: int, rows: int = 1) -> GenerationRequest:
    return GenerationRequest("r", [5] * prompt_tokens, max_tokens, n=rows, seed=0, chain=None, rows=rows)


def completion(req: GenerationRequest):
    """A running completion's row, as the scheduler's batch holds it."""
    return types.SimpleNamespace(request=req)


# -- the rule, on plain numbers ---------------------------------------------------------------------


def test_a_rows_end_is_its_prompt_and_max_tokens_plus_a_bursts_overshoot_capped_at_the_context():
    assert row_end(10, 100, 512) == 110
    assert row_end(10, 100, 512, overshoot=7) == 117
    assert row_end(500, 100, 512, overshoot=7) == 512


def test_describe_gives_bytes_per_token_and_budget():
    budget = KvBudget.from_describe(SMOLLM2)
    assert budget == KvBudget("shared", 46_080, 8192, 4 << 30)
    # One row at the full context length: about 377 MB.
    assert budget.batch_bytes([8192]) == 377_487_360
    half = lm_pb2.DescribeModelResponse()
    half.CopyFrom(SMOLLM2)
    half.kv.dtype = common_pb2.FLOAT16
    assert KvBudget.from_describe(half).bytes_per_token == 23_040


@pytest.mark.parametrize(
    "field, value", [("storage", ""), ("storage", "paged"), ("dtype", common_pb2.DTYPE_UNSPECIFIED)]
)
def test_an_lm_that_does_not_describe_its_kv_is_admitted_by_row_count_alone(field, value):
    info = lm_pb2.DescribeModelResponse()
    info.CopyFrom(SMOLLM2)
    setattr(info.kv, field, value)
    assert KvBudget.from_describe(info) is None
    info.CopyFrom(SMOLLM2)
    info.load.kv_budget_bytes = 0
    assert KvBudget.from_describe(info) is None


def test_concat_batches_take_rows_times_their_longest_row():
    budget = KvBudget("concat", 100, 512, 10**9)
    assert budget.batch_bytes([]) == 0
    assert budget.batch_bytes([10, 300, 20]) == 3 * 300 * 100


def test_shared_batches_take_rows_times_the_capacity_of_their_longest_row():
    budget = KvBudget("shared", 100, 600, 10**9)
    assert budget.batch_bytes([1]) == 256 * 100
    assert budget.batch_bytes([10, 256]) == 2 * 256 * 100
    assert budget.batch_bytes([10, 257]) == 2 * 512 * 100
    assert budget.batch_bytes([513, 3]) == 2 * 600 * 100  # the last block stops at the context length


@pytest.mark.parametrize("storage", ["concat", "shared"])
def test_the_bytes_equal_the_lm_services_own_accounting(storage):
    kv = pytest.importorskip("muestra.lm.kv")
    lm_storage = {"concat": kv.ConcatKV, "shared": kv.SharedKV}[storage]
    draw = random.Random(31)
    for _ in range(500):
        context = draw.choice([300, 512, 2048, 8192])
        lengths = [draw.randint(1, context) for _ in range(draw.randint(0, 8))]
        budget = KvBudget(storage, 46_080, context, 1)
        assert budget.batch_bytes(lengths) == lm_storage.bytes_for(lengths, 46_080, context), (context, lengths)


def test_completions_and_beams_count_their_rows():
    assert request_ends(request(10, 20, rows=3), 512, 0) == [30, 30, 30]
    beams = request(10, 20, rows=4)
    group = types.SimpleNamespace(request=beams)
    # A search prefills one row and widens to its beams later: its rows count as all its beams, once.
    assert batch_ends([BeamRow(group), completion(request(5, 5)), BeamRow(group)], 512, 1) == [31] * 4 + [11]


def admission(storage: str, budget_bytes: int, greedy_burst: int = 1, max_greedy_steps: int = 64) -> KvAdmission:
    replica = LmReplica("lm:1", None, None, max_greedy_steps, KvBudget(storage, 10, 512, budget_bytes))
    return KvAdmission("tiny", replica, greedy_burst)


def test_a_request_joins_only_a_batch_that_holds_every_row_until_its_end():
    kv = admission("concat", 3 * 200 * 10)
    running = [completion(request(50, 150)), completion(request(10, 20))]  # ends 200 and 30
    assert kv.reserved_bytes(running) == 2 * 200 * 10
    assert kv.fits(request(100, 100), running)  # 3 rows of 200
    assert not kv.fits(request(100, 101), running)  # 3 rows of 201
    assert not kv.fits(request(10, 10, rows=2), running)  # 4 rows of 200
    # An empty batch takes anything that fits alone.
    assert kv.fits(request(100, 101, rows=3), [])


def test_a_greedy_burst_may_run_rows_past_their_ends():
    # Bursts of up to 8 steps: a row may take 7 positions past its end while a neighbour needs them.
    kv = admission("concat", 2 * 207 * 10, greedy_burst=8)
    running = [completion(request(50, 150))]
    assert kv.reserved_bytes(running) == 207 * 10
    assert kv.fits(request(10, 20), running)
    assert not kv.fits(request(10, 20), running * 2)
    # The lm's own limit on a burst's steps counts too.
    assert admission("concat", 1, greedy_burst=8, max_greedy_steps=2).reserved_bytes(running) == 201 * 10


def test_a_request_too_big_alone_gets_an_error_naming_the_budget_and_its_bytes():
    kv = admission("shared", 6000)
    assert kv.alone_error(request(100, 100, rows=2)) is None  # 2 rows of 256: 5,120 bytes
    error = kv.alone_error(request(100, 200, rows=2))  # 2 rows of 512: 10,240 bytes
    assert error is not None and error.code.name == "RESOURCE_EXHAUSTED"
    assert str(error).startswith("kv_budget_bytes: this request needs 10240 bytes")
    assert "budget of 6000 bytes" in str(error) and "lm:1" in str(error)


def test_an_lm_without_kv_layout_admits_everything():
    kv = KvAdmission("tiny", LmReplica("lm:1", None, None), 8)
    assert kv.fits(request(100, 400, rows=64), [completion(request(10, 500))] * 64)
    assert kv.alone_error(request(100, 400, rows=64)) is None
    assert kv.reserved_bytes([completion(request(10, 500))]) == 0


def test_requests_held_back_by_the_budget_are_counted_once_each():
    kv = admission("concat", 2 * 200 * 10)
    running = [completion(request(50, 150)), completion(request(50, 150))]

    def waits() -> float:
        return REGISTRY.get_sample_value("muestra_kv_admission_waits_total", {"model": "tiny", "replica": "lm:1"}) or 0

    before = waits()
    waiting = [request(10, 10), request(10, 10)]
    assert not kv.admits(waiting, running)
    assert not kv.admits(waiting, running)
    # The head did not fit, and the one behind it waited with it.
    assert waits() == before + 2
    assert kv.admits(waiting, running[:1])
    waiting.append(request(10, 10))
    assert not kv.admits(waiting[1:], running)
    assert waits() == before + 3


# -- through real processes ---------------------------------------------------------------------------

GREEDY = [{"name": "greedy"}]
PROMPTS = ["The quick brown fox", "Once upon a time", "def main():", "Hola, ¿qué tal?", "1, 2, 3,", "a"]
MAX_TOKENS = 300
# The tiny Llama's KV: 2 layers x 2 KV heads x 16 dims, fp32, keys and values.
BYTES_PER_TOKEN = 512
# The gateway's default --greedy-burst is 8: a row may run 7 positions past its end.
OVERSHOOT = 7


def long_row_bytes(model: str) -> int:
    """KV bytes one of the long rows may take: prompts of at most 16 tokens, 300 more, a burst's overshoot."""
    end = 16 + MAX_TOKENS + OVERSHOOT
    return (512 if model == "llama" else end) * BYTES_PER_TOKEN  # a shared buffer grows to 512 positions


def scrape(port: int) -> dict[str, float]:
    """The gateway's muestra_ samples summed over labels, by sample name."""
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    samples: dict[str, float] = {}
    for family in text_string_to_metric_families(body):
        for sample in family.samples:
            samples[sample.name] = samples.get(sample.name, 0.0) + sample.value
    return samples


@pytest.fixture(scope="module", params=["llama", "llama-concat"], ids=["shared-kv", "concat-kv"])
def tight(request, tiny_lm, lm_service, tmp_path_factory):
    """A gateway on an lm whose --kv-budget-bytes holds two long rows (not three): (gateway, metrics port, budget)."""
    model = request.param
    budget = long_row_bytes(model) * 5 // 2
    lm = lm_service(model, "--kv-budget-bytes", str(budget))
    layout = lm.stub.Describe(lm_pb2.DescribeModelRequest()).kv
    assert (layout.storage, 2 * layout.num_layers * layout.num_kv_heads * layout.head_dim * 4) == (
        "shared" if model == "llama" else "concat", BYTES_PER_TOKEN,
    )  # fmt: skip
    log_dir = tmp_path_factory.mktemp("kv-admission")
    tokenizer = ServiceProcess("tokenizer", ["--models", str(tiny_lm("llama").onnx_dir)], log_dir)
    port = free_port()
    gateway = start_gateway(log_dir, tokenizer.address, lm.process.address, "--metrics-port", str(port))
    yield gateway, port, budget
    gateway.stop()
    tokenizer.stop()


def test_long_requests_beyond_the_budget_wait_their_turn_and_equal_their_runs_alone(tight):
    gateway, port, budget = tight
    jobs = [{"prompt": p, "max_tokens": MAX_TOKENS, "ignore_eos": True, "samplers": GREEDY} for p in PROMPTS]
    with Client(gateway.address, timeout=120) as c:
        alone = [c.generate(**job).wait() for job in jobs]
    assert max(a.completions[0].prompt_tokens for a in alone) <= 16
    before = scrape(port)
    got: dict[int, object] = {}
    errors: list[Exception] = []

    def run(i: int) -> None:
        try:
            with Client(gateway.address, timeout=120) as c:
                got[i] = c.generate(**jobs[i]).wait()
        except MuestraError as exc:  # collected: every request must succeed
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(jobs))]
    for thread in threads:
        thread.start()
    reserved = []
    while any(thread.is_alive() for thread in threads):
        reserved.append(scrape(port)["muestra_kv_reserved_bytes"])
        time.sleep(0.02)
    for thread in threads:
        thread.join()
    assert not errors, errors
    for i, job in enumerate(jobs):
        assert got[i].token_ids[0] == alone[i].token_ids[0], job
        assert got[i].texts[0] == alone[i].texts[0], job
        assert got[i].completions[0].completion_tokens == MAX_TOKENS
    after = scrape(port)
    # Two long rows fit at a time: at least three of the six waited for KV, never for rows.
    waits = "muestra_kv_admission_waits_total"
    assert after.get(waits, 0) - before.get(waits, 0) >= 3
    assert 0 < max(reserved) <= budget
    assert after["muestra_kv_reserved_bytes"] == 0
    failures = "muestra_request_failures_total"
    assert after.get(failures, 0) == before.get(failures, 0)


def test_a_request_too_big_even_alone_fails_at_once_even_behind_waiting_requests(tight):
    gateway, port, budget = tight
    jobs = [{"prompt": p, "max_tokens": MAX_TOKENS, "ignore_eos": True, "samplers": GREEDY} for p in PROMPTS]
    started = [threading.Event() for _ in jobs]

    def run(i: int) -> None:
        with Client(gateway.address, timeout=120) as c:
            for _ in c.generate(**jobs[i]):
                started[i].set()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(jobs))]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + 30
    while scrape(port).get("muestra_num_requests_waiting", 0) < 2:
        assert time.monotonic() < deadline, "no request ever waited"
        time.sleep(0.005)
    with Client(gateway.address, timeout=120) as c:
        # Three completions of a long row: more than the budget, even with the batch empty.
        with pytest.raises(ResourceExhaustedError) as error:
            c.generate(**{**jobs[0], "n": 3}).wait()
    not_started = sum(not event.is_set() for event in started)
    for thread in threads:
        thread.join()
    assert not_started > 0, "refused only once every request queued before it had started"
    assert all(event.is_set() for event in started)
    needed = int(re.search(r"needs (\d+) bytes", error.value.details).group(1))
    assert error.value.details.startswith("kv_budget_bytes: ")
    assert needed > budget and f"budget of {budget} bytes" in error.value.details

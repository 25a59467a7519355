"""A Decode with greedy_steps runs several greedy steps in one call: the tokens it lists equal transformers'
generate(do_sample=False), later calls go on from where it stopped, it ends early once every row met a
stop id, and what it cannot do is refused with INVALID_ARGUMENT before any batch changes."""

from __future__ import annotations

import time

import grpc
import pytest

from muestra.v1 import lm_pb2
from tests.fixtures.lm_service import SERVED_MODELS
from tests.lm.lm_client import decode, prefill, prompts
from tests.lm.test_greedy import MAX_NEW_TOKENS, transformers_greedy


def greedy(stub, batch_id: str, next_ids: list[int], steps: int, stop_ids=()) -> lm_pb2.DecodeResponse:
    request = lm_pb2.DecodeRequest(greedy_steps=steps, stop_token_ids=list(stop_ids))
    request.batches.add(batch_id=batch_id, next_ids=next_ids)
    return stub.Decode(request)


def rejected(stub, request: lm_pb2.DecodeRequest) -> str:
    with pytest.raises(grpc.RpcError) as info:
        stub.Decode(request)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    return info.value.details()


@pytest.mark.parametrize("family", SERVED_MODELS)
def test_greedy_steps_equal_transformers_generate(lm_service, served_lm, family):
    service = lm_service(family)
    model = served_lm(family).torch_model()
    batch = prompts([9, 4, 15], model.config.vocab_size, seed=7)
    expected = [transformers_greedy(model, p) for p in batch]
    reply = prefill(service.stub, batch, kind=lm_pb2.ARGMAX)
    generated = [[row.argmax] for row in reply.output.rows]
    batch_id = reply.batch_id
    # Bursts of several sizes, and a single step between them: each goes on from the last.
    for steps in (5, 1, 8, 3, 6):
        steps = min(steps, MAX_NEW_TOKENS - len(generated[0]))
        if steps == 1:
            reply = decode(service.stub, (batch_id, [g[-1] for g in generated]))
            assert not any(row.greedy_ids for row in reply.output.rows)
            tokens = [[row.argmax] for row in reply.output.rows]
        else:
            reply = greedy(service.stub, batch_id, [g[-1] for g in generated], steps)
            tokens = [list(row.greedy_ids) for row in reply.output.rows]
            assert all(len(t) == steps for t in tokens)
            assert [t[-1] for t in tokens] == [row.argmax for row in reply.output.rows]
        assert len(reply.output.logits.data) == 0
        for row, more in zip(generated, tokens, strict=True):
            row.extend(more)
        batch_id = reply.batch_id
    assert [g[:MAX_NEW_TOKENS] for g in generated] == expected
    service.stub.Clear(lm_pb2.ClearRequest(batch_ids=[batch_id]))


def test_greedy_steps_end_once_every_row_met_a_stop_id(lm_service):
    stub = lm_service("llama").stub
    batch = prompts([6, 10], 1024, seed=3)
    first = prefill(stub, batch, kind=lm_pb2.ARGMAX)
    seeds = [row.argmax for row in first.output.rows]
    full = [list(row.greedy_ids) for row in greedy(stub, first.batch_id, seeds, 12).output.rows]
    # Stop ids that row 0 meets at its step 3 and row 1 at its step 6 (and not before): the call runs 6 steps.
    stop_0, stop_1 = full[0][2], full[1][5]
    if stop_0 in full[0][:2] + full[1][:5] or stop_1 in full[1][:5] + full[0][:2]:
        pytest.skip("the random model repeats its tokens too soon for this check")
    again = prefill(stub, batch, kind=lm_pb2.ARGMAX)
    reply = greedy(stub, again.batch_id, seeds, 12, stop_ids=[stop_0, stop_1])
    got = [list(row.greedy_ids) for row in reply.output.rows]
    assert [len(g) for g in got] == [6, 6]
    assert got == [f[:6] for f in full]
    # The batch holds exactly the tokens listed: a single step after it gives full's next token.
    after = decode(stub, (reply.batch_id, [g[-1] for g in got]))
    assert [row.argmax for row in after.output.rows] == [f[6] for f in full]
    stub.Clear(lm_pb2.ClearRequest())


def test_what_greedy_steps_cannot_do_is_refused_and_the_batch_kept(lm_service):
    stub = lm_service("llama").stub
    reply = prefill(stub, prompts([5, 7], 1024, seed=1), kind=lm_pb2.ARGMAX)
    batch_id, ids = reply.batch_id, [row.argmax for row in reply.output.rows]
    cases = []
    too_many = lm_pb2.DecodeRequest(greedy_steps=65)
    too_many.batches.add(batch_id=batch_id, next_ids=ids)
    cases.append((too_many, "greedy_steps: must be between 1 and 64, got 65"))
    with_tokens = lm_pb2.DecodeRequest(greedy_steps=4, tokens_per_row=2)
    with_tokens.batches.add(batch_id=batch_id, next_ids=ids * 2)
    cases.append((with_tokens, "greedy_steps: needs tokens_per_row 1"))
    logits = lm_pb2.DecodeRequest(greedy_steps=4)
    logits.batches.add(batch_id=batch_id, next_ids=ids, outputs=[lm_pb2.OutputSpec(kind=lm_pb2.ARGMAX)] * 2)
    logits.batches[0].outputs[1].kind = lm_pb2.LOGITS
    cases.append((logits, "greedy_steps: every row must want ARGMAX outputs or have a sampler chain; row 1 does not"))
    masked = lm_pb2.DecodeRequest(greedy_steps=4)
    masked.batches.add(batch_id=batch_id, next_ids=ids)
    masked.batches[0].outputs.add(kind=lm_pb2.ARGMAX, allowed_tokens=b"\xff")
    masked.batches[0].outputs.add(kind=lm_pb2.ARGMAX)
    cases.append((masked, "greedy_steps: rows with allowed_tokens masks take one step per call"))
    stops = lm_pb2.DecodeRequest(greedy_steps=4, stop_token_ids=range(1025))
    stops.batches.add(batch_id=batch_id, next_ids=ids)
    cases.append((stops, "stop_token_ids: must be between 0 and 1024, got 1025"))
    for request, message in cases:
        assert message in rejected(stub, request)
    # Nothing changed: the batch steps on as if those calls never came.
    expected = [list(row.greedy_ids) for row in greedy(stub, batch_id, ids, 4).output.rows]
    assert all(len(e) == 4 for e in expected)
    stub.Clear(lm_pb2.ClearRequest())


def test_greedy_steps_may_not_pass_the_context_length(lm_service, served_lm):
    stub = lm_service("llama").stub
    context = stub.Describe(lm_pb2.DescribeModelRequest()).context_length
    reply = prefill(stub, prompts([context - 4], 1024, seed=2), kind=lm_pb2.ARGMAX)
    ids = [reply.output.rows[0].argmax]
    request = lm_pb2.DecodeRequest(greedy_steps=5)
    request.batches.add(batch_id=reply.batch_id, next_ids=ids)
    assert f"holds {context - 4} tokens; 5 more would pass the context length {context}" in rejected(stub, request)
    assert len(greedy(stub, reply.batch_id, ids, 4).output.rows[0].greedy_ids) == 4
    stub.Clear(lm_pb2.ClearRequest())


def test_a_burst_ends_at_its_next_step_when_a_prompt_waits_for_the_model(lm_service):
    """A Prefill that arrives during a long greedy burst runs after the step in progress, not after the burst:
    the burst answers with the steps it ran, and its caller goes on from there."""
    import concurrent.futures
    import time

    service = lm_service("llama")
    reply = prefill(service.stub, prompts([90, 120, 70, 100] * 4, 1024, seed=3), kind=lm_pb2.ARGMAX)
    started = time.monotonic()
    alone = greedy(service.stub, reply.batch_id, [row.argmax for row in reply.output.rows], 64)
    took = time.monotonic() - started
    assert len(alone.output.rows[0].greedy_ids) == 64  # with nobody waiting, a burst runs its whole length
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        burst = pool.submit(greedy, service.stub, alone.batch_id, [row.argmax for row in alone.output.rows], 64)
        time.sleep(took / 4)  # a quarter of the way through
        other = prefill(service.stub, prompts([30], 1024, seed=4), kind=lm_pb2.ARGMAX)
        ran = len(burst.result().output.rows[0].greedy_ids)
    assert 1 <= ran < 64, (ran, took)
    service.stub.Clear(lm_pb2.ClearRequest(batch_ids=[burst.result().batch_id, other.batch_id]))


def test_prefills_cut_while_they_wait_for_the_model_leave_bursts_whole_and_nothing_held(lm_service):
    """Prefills whose caller leaves (a deadline of a few ms) while they wait for the model thread, or in their
    first chunk, are forgotten: later bursts run their whole length (none is cut for a prompt that no longer
    waits) and no KV reservation of theirs stays. A caller whose deadline passes while the reply is on its way
    cannot be told from one that got it: that batch goes after batch_idle_s (1 s here), and the KV held drops
    to nothing then only if no reservation was left behind."""
    import concurrent.futures

    service = lm_service("llama", "--prefill-chunk-tokens", "32", "--batch-idle-s", "1")
    stub = service.stub
    cut = 0
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        for attempt in range(24):
            # A long prompt in chunks, and a row's bursts, keep the model thread busy while the short-lived
            # prefills queue.
            busy = pool.submit(prefill, stub, prompts([400], 1024, seed=attempt), lm_pb2.ARGMAX)
            running = prefill(stub, prompts([20], 1024, seed=50 + attempt), kind=lm_pb2.ARGMAX)
            bursts = pool.submit(greedy, stub, running.batch_id, [row.argmax for row in running.output.rows], 64)
            for timeout_s in (0.001, 0.004, 0.02):
                request = lm_pb2.PrefillRequest(
                    rows=[lm_pb2.PrefillRow(input_ids=prompts([300], 1024, seed=99 + attempt)[0])]
                )
                try:
                    made = stub.Prefill(request, timeout=timeout_s)
                except grpc.RpcError as error:
                    assert error.code() == grpc.StatusCode.DEADLINE_EXCEEDED, error.details()
                    cut += 1
                else:
                    stub.Clear(lm_pb2.ClearRequest(batch_ids=[made.batch_id]))
            stub.Clear(lm_pb2.ClearRequest(batch_ids=[busy.result().batch_id, bursts.result().batch_id]))
    assert cut
    load = stub.Describe(lm_pb2.DescribeModelRequest()).load
    deadline = time.monotonic() + 8
    while (load.rows or load.kv_bytes) and time.monotonic() < deadline:
        time.sleep(0.05)
        load = stub.Describe(lm_pb2.DescribeModelRequest()).load
    assert (load.batches, load.rows, load.kv_bytes) == (0, 0, 0)
    reply = prefill(stub, prompts([40], 1024, seed=7), kind=lm_pb2.ARGMAX)
    burst = greedy(stub, reply.batch_id, [row.argmax for row in reply.output.rows], 32)
    assert len(burst.output.rows[0].greedy_ids) == 32
    stub.Clear(lm_pb2.ClearRequest(batch_ids=[burst.batch_id]))

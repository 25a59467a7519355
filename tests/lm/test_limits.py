"""Limits and bad input: clear gRPC errors naming the field or budget, and the service keeps serving."""

from __future__ import annotations

import subprocess
import sys

import grpc
import pytest

from muestra.v1 import lm_pb2, lm_pb2_grpc
from tests.harness import ServiceProcess
from tests.lm.lm_client import decode, prefill, prompts, spec

CONTEXT = 32
BUDGET = 65536  # 128 tokens of the tiny Llama's KV (512 bytes a token)
LIMITS = ("--context-length", str(CONTEXT), "--kv-budget-bytes", str(BUDGET), "--max-batch-rows", "16")


@pytest.fixture(scope="module")
def stub(lm_service):
    return lm_service("llama", *LIMITS).stub


def assert_still_serving(stub) -> None:
    reply = prefill(stub, [[5, 6, 7]], kind=lm_pb2.ARGMAX)
    decode(stub, (reply.batch_id, [reply.output.rows[0].argmax]))
    stub.Clear(lm_pb2.ClearRequest())


def rpc_error(call, *args) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as caught:
        call(*args)
    return caught.value


def test_prompts_over_the_kv_budget_get_resource_exhausted(stub):
    error = rpc_error(prefill, stub, prompts([30] * 8, 1024))
    assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "kv_budget_bytes" in error.details() and str(BUDGET) in error.details()
    # The Llama's shared buffers hold rows x capacity: 256-position blocks, capped at the context.
    assert str(8 * CONTEXT * 512) in error.details()
    assert_still_serving(stub)


def test_filter_over_the_kv_budget_gets_resource_exhausted_and_keeps_the_batch(stub):
    reply = prefill(stub, prompts([30], 1024), kind=lm_pb2.ARGMAX)
    error = rpc_error(stub.Filter, lm_pb2.FilterRequest(batch_id=reply.batch_id, rows=[0] * 8))
    assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "kv_budget_bytes" in error.details()
    decode(stub, (reply.batch_id, [1]))
    assert_still_serving(stub)


def test_decode_past_the_context_length_is_invalid_argument(stub):
    reply = prefill(stub, prompts([CONTEXT - 1], 1024), kind=lm_pb2.ARGMAX)
    reply = decode(stub, (reply.batch_id, [1]))  # the row now holds CONTEXT tokens
    error = rpc_error(decode, stub, (reply.batch_id, [1]))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error.details().startswith("batches[0].next_ids:") and f"context length {CONTEXT}" in error.details()
    assert_still_serving(stub)


def _prefill_rows(*rows: lm_pb2.PrefillRow):
    return lambda stub: stub.Prefill(lm_pb2.PrefillRequest(rows=list(rows)))


def _with_batch(call):
    """A bad request against a real two-row batch."""

    def run(stub):
        reply = prefill(stub, [[3, 4, 5], [6, 7]], kind=lm_pb2.ARGMAX)
        return call(stub, reply.batch_id)

    return run


BAD_INPUT = {
    "empty prompt": (_prefill_rows(lm_pb2.PrefillRow(input_ids=[])), "rows[0].input_ids: the prompt is empty"),
    "no rows": (_prefill_rows(), "rows: must be between 1 and 16, got 0"),
    "more rows than max_batch_rows": (
        _prefill_rows(*[lm_pb2.PrefillRow(input_ids=[3])] * 17),
        "rows: must be between 1 and 16, got 17",
    ),
    "token id >= vocab": (
        _prefill_rows(lm_pb2.PrefillRow(input_ids=[5]), lm_pb2.PrefillRow(input_ids=[3, 4, 1024])),
        "rows[1].input_ids[2]: token id 1024 is out of range (vocab_size 1024)",
    ),
    "prompt longer than the context": (
        _prefill_rows(lm_pb2.PrefillRow(input_ids=[3] * CONTEXT)),
        f"rows[0].input_ids: the prompt has {CONTEXT} tokens; it must be shorter than the context length {CONTEXT}",
    ),
    "top_n over the limit": (
        _prefill_rows(lm_pb2.PrefillRow(input_ids=[3], output=spec(lm_pb2.TOP_N, 1000))),
        "rows[0].output.top_n: must be between 1 and 64",
    ),
    "unknown batch id in Decode": (
        lambda stub: decode(stub, ("no-such-batch", [1])),
        "batches[0].batch_id: unknown batch 'no-such-batch'",
    ),
    "unknown batch id in Filter": (
        lambda stub: stub.Filter(lm_pb2.FilterRequest(batch_id="no-such-batch", rows=[0])),
        "batch_id: unknown batch 'no-such-batch'",
    ),
    "next token id >= vocab": (
        _with_batch(lambda stub, batch_id: decode(stub, (batch_id, [1, 5000]))),
        "batches[0].next_ids[1]: token id 5000 is out of range",
    ),
    "wrong next_ids count": (
        _with_batch(lambda stub, batch_id: decode(stub, (batch_id, [1]))),
        "batches[0].next_ids: got 1 ids for a batch of 2 rows",
    ),
    "filter row out of range": (
        _with_batch(lambda stub, batch_id: stub.Filter(lm_pb2.FilterRequest(batch_id=batch_id, rows=[1, 2]))),
        "rows[1]: row 2 is out of range for a batch of 2 rows",
    ),
}


@pytest.mark.parametrize("case", list(BAD_INPUT))
def test_bad_input_is_invalid_argument_naming_the_field(stub, case):
    call, message = BAD_INPUT[case]
    error = rpc_error(call, stub)
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error.details().startswith(message)
    assert_still_serving(stub)


def test_the_model_folder_can_come_from_the_environment(tiny_lm, tmp_path):
    process = ServiceProcess(
        "lm", ["--intra-op-threads", "1"], tmp_path, env={"MUESTRA_LM_MODEL": str(tiny_lm("gpt2").onnx_dir)}
    )
    try:
        with grpc.insecure_channel(process.address) as channel:
            info = lm_pb2_grpc.LanguageModelStub(channel).Describe(lm_pb2.DescribeModelRequest())
    finally:
        process.stop()
    assert info.kv.num_kv_heads == 4 and info.vocab_size == 1024


def test_a_folder_without_model_onnx_is_a_startup_error_that_says_so(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    done = subprocess.run(
        [sys.executable, "-m", "muestra.lm", "--model", str(tmp_path), "--port", "0"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode != 0
    assert f"cannot serve {tmp_path}: {tmp_path} has no model.onnx" in done.stderr

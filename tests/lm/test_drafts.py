"""Speculative verification in the lm: a Decode scores each row's next id and its draft ids in one forward.

Rows with different draft lengths and rows without drafts share a batch; every position's logits equal a
full recompute; a LOGITS row's rejected drafts leave with the next Decode's rollback, an ARGMAX row's at
once (the lm accepts what equals its argmax), and either way the row then steps exactly as a row that
never drafted them (logits equal a full recompute of the accepted text).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import grpc
import numpy as np
import onnx
import onnx.numpy_helper
import pytest

from muestra.lm.export.families import LOGITS_POSITIONS
from muestra.v1 import lm_pb2, lm_pb2_grpc
from tests.fixtures.lm_service import SERVED_MODELS, start_lm
from tests.lm.lm_client import logits, prefill, prompts, spec, torch_last_logits
from tests.models.test_tiny_text_fixture import FIXTURE

TOLERANCE = 1e-4


def verify(stub, batch_id: str, next_ids, drafts, kind=None, rollback=None):
    request = lm_pb2.DecodeRequest()
    batch = request.batches.add(batch_id=batch_id, next_ids=next_ids)
    if kind is not None:
        batch.outputs.extend([spec(kind)] * len(next_ids))
    if drafts is not None:
        batch.draft_lengths.extend(len(d) for d in drafts)
        batch.draft_ids.extend(t for d in drafts for t in d)
    if rollback is not None:
        batch.rollback.extend(rollback)
    return stub.Decode(request)


def row_positions(output: lm_pb2.BatchOutput, row: int) -> np.ndarray:
    """Row `row`'s logits rows: its next id's, then each draft's."""
    out = output.rows[row]
    return logits(output)[out.logits_row : out.logits_row + max(1, out.positions)]


@pytest.mark.parametrize("family", SERVED_MODELS)
def test_drafts_of_different_lengths_equal_a_full_recompute_and_rollback_forgets_them(lm_service, served_lm, family):
    service = lm_service(family)
    if not service.stub.Describe(lm_pb2.DescribeModelRequest()).max_draft_tokens:
        pytest.skip(f"{family}'s graph gives only its last position's logits")
    model = served_lm(family).torch_model()
    vocab = model.config.vocab_size
    sequences = prompts((3, 11, 6, 8), vocab, seed=11)
    reply = prefill(service.stub, sequences)
    rng = np.random.default_rng(3)
    worst = 0.0
    rollback = None
    for lengths, keep in (((4, 0, 2, 7), (1, 0, 2, 0)), ((0, 3, 1, 0), (0, 3, 0, 0)), ((5, 5, 0, 1), (5, 2, 0, 1))):
        next_ids = rng.integers(2, vocab, len(sequences)).tolist()
        drafts = [rng.integers(2, vocab, n).tolist() for n in lengths]
        reply = verify(service.stub, reply.batch_id, next_ids, drafts, rollback=rollback)
        for row, sequence in enumerate(sequences):
            got = row_positions(reply.output, row)
            assert got.shape[0] == 1 + lengths[row]
            fed = [*sequence, next_ids[row]]
            for position in range(1 + lengths[row]):
                worst = max(worst, float(np.abs(got[position] - torch_last_logits(model, fed)).max()))
                if position < lengths[row]:
                    fed.append(drafts[row][position])
            # The caller accepts the first keep[row] drafts and rejects the rest.
            sequence.extend([next_ids[row], *drafts[row][: keep[row]]])
        rollback = [n - k for n, k in zip(lengths, keep, strict=True)]
    # After the last rollback, a plain step: each row continues from its accepted text only.
    last = rng.integers(2, vocab, len(sequences)).tolist()
    reply = verify(service.stub, reply.batch_id, last, None, rollback=rollback)
    got = logits(reply.output)
    for row, sequence in enumerate(sequences):
        worst = max(worst, float(np.abs(got[row] - torch_last_logits(model, [*sequence, last[row]])).max()))
    assert worst <= TOLERANCE
    service.stub.Clear(lm_pb2.ClearRequest(batch_ids=[reply.batch_id]))


@pytest.mark.parametrize("family", ["llama", "llama-concat"])
def test_argmax_rows_accept_drafts_equal_to_their_argmax_and_drop_the_rest(lm_service, served_lm, family):
    service = lm_service(family)
    model = served_lm(family).torch_model()
    vocab = model.config.vocab_size
    sequences = prompts((5, 9, 7), vocab, seed=4)
    reply = prefill(service.stub, sequences, kind=lm_pb2.ARGMAX)
    # Drafts made of the model's own greedy continuation, cut wrong at a chosen place.
    next_ids = [int(reply.output.rows[row].argmax) for row in range(len(sequences))]
    greedy = []
    for row, sequence in enumerate(sequences):
        fed, tokens = [*sequence, next_ids[row]], []
        for _ in range(5):
            tokens.append(int(np.argmax(torch_last_logits(model, fed))))
            fed.append(tokens[-1])
        greedy.append(tokens)
    right = (5, 2, 0)  # row 0: all 5 right; row 1: 2 right then a wrong one; row 2: the first one wrong
    drafts = []
    for row, tokens in enumerate(greedy):
        draft = tokens[: right[row]]
        if right[row] < 5:
            draft.append((tokens[right[row]] + 1) % vocab)
        drafts.append(draft)
    reply = verify(service.stub, reply.batch_id, next_ids, drafts)
    for row, sequence in enumerate(sequences):
        out = reply.output.rows[row]
        assert out.accepted_drafts == right[row]
        # The argmax after the last accepted draft (the greedy text's next token).
        expected_next = greedy[row][right[row]] if right[row] < 5 else None
        if expected_next is not None:
            assert out.argmax == expected_next
        sequence.extend([next_ids[row], *drafts[row][: right[row]]])
    # The lm dropped the rejected drafts itself: a plain step continues the accepted text.
    follow = [int(out.argmax) for out in reply.output.rows]
    reply = verify(service.stub, reply.batch_id, follow, None, kind=lm_pb2.LOGITS)
    got = logits(reply.output)
    for row, sequence in enumerate(sequences):
        assert float(np.abs(got[row] - torch_last_logits(model, [*sequence, follow[row]])).max()) <= TOLERANCE
    service.stub.Clear(lm_pb2.ClearRequest(batch_ids=[reply.batch_id]))


def test_bad_drafts_and_rollbacks_are_invalid_argument_naming_the_field(lm_service):
    stub = lm_service("llama").stub
    limit = stub.Describe(lm_pb2.DescribeModelRequest()).max_draft_tokens
    assert limit == 16
    reply = prefill(stub, prompts((4, 5), 1024, seed=1))
    batch_id = reply.batch_id

    def call(**fields):
        request = lm_pb2.DecodeRequest(**{k: v for k, v in fields.items() if k in ("greedy_steps", "tokens_per_row")})
        batch = request.batches.add(batch_id=batch_id, next_ids=fields.get("next_ids", [5, 6]))
        batch.draft_lengths.extend(fields.get("draft_lengths", []))
        batch.draft_ids.extend(fields.get("draft_ids", []))
        batch.rollback.extend(fields.get("rollback", []))
        batch.outputs.extend(fields.get("outputs", []))
        with pytest.raises(grpc.RpcError) as info:
            stub.Decode(request)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        return info.value.details()

    assert "batches[0].draft_ids: got 2 ids; draft_lengths add up to 3" in call(draft_lengths=[1, 2], draft_ids=[7, 8])
    assert "batches[0].draft_lengths: got 1 lengths for a batch of 2 rows" in call(draft_lengths=[1], draft_ids=[7])
    assert "batches[0].draft_lengths[1]: " in call(draft_lengths=[0, limit + 1], draft_ids=[7] * (limit + 1))
    assert "batches[0].draft_ids[0]: token id 5000 is out of range" in call(draft_lengths=[1, 0], draft_ids=[5000])
    assert "batches[0].rollback[1]: row 1 holds 5 tokens; it cannot drop 5" in call(rollback=[0, 5])
    assert "batches[0].rollback: got 1 counts for a batch of 2 rows" in call(rollback=[1])
    assert "greedy_steps: a Decode with draft tokens" in call(draft_lengths=[1, 0], draft_ids=[7], greedy_steps=3)
    assert "tokens_per_row: a Decode with draft tokens" in call(
        next_ids=[5, 6, 7, 8], draft_lengths=[1, 0], draft_ids=[7], tokens_per_row=2
    )
    assert "row 0 has drafts and wants TOP_N" in call(
        draft_lengths=[1, 0], draft_ids=[7], outputs=[spec(lm_pb2.TOP_N, 3), spec()]
    )
    masked = lm_pb2.OutputSpec(kind=lm_pb2.LOGITS, allowed_tokens=b"\xff" * 4)
    assert "row 0 has drafts and an allowed_tokens mask" in call(
        draft_lengths=[1, 0], draft_ids=[7], outputs=[masked, spec()]
    )
    # Nothing changed: the batch still steps, from where it was.
    ok = stub.Decode(lm_pb2.DecodeRequest(batches=[lm_pb2.DecodeBatch(batch_id=batch_id, next_ids=[5, 6])]))
    stub.Clear(lm_pb2.ClearRequest(batch_ids=[ok.batch_id]))


def last_logits_only(src: Path, out: Path) -> Path:
    """A copy of a folder whose graph keeps only the last position's logits, as exports before
    logits_positions did (its Gather of the positions becomes a Slice of the last one)."""
    shutil.copytree(src, out)
    model = onnx.load(str(out / "model.onnx"))
    graph = model.graph
    gather = next(node for node in graph.node if LOGITS_POSITIONS in node.input)
    graph.initializer.extend(
        onnx.numpy_helper.from_array(np.array([value], np.int64), name)
        for name, value in (("last_start", -1), ("last_end", 2**62), ("last_axis", 1))
    )
    index = list(graph.node).index(gather)
    graph.node.remove(gather)
    graph.node.insert(
        index, onnx.helper.make_node("Slice", [gather.input[0], "last_start", "last_end", "last_axis"], gather.output)
    )
    graph.input.remove(next(i for i in graph.input if i.name == LOGITS_POSITIONS))
    onnx.save_model(model, str(out / "model.onnx"))
    return out


def served_without_drafts(folder: Path, log_dir: Path) -> tuple[int, str, str]:
    """Serve `folder`, ask for one draft, then take a plain step: (Describe's max_draft_tokens, the refusal's
    message, the service's log)."""
    service = start_lm(folder, "llama", log_dir)
    try:
        with grpc.insecure_channel(service.address) as channel:
            stub = lm_pb2_grpc.LanguageModelStub(channel)
            limit = stub.Describe(lm_pb2.DescribeModelRequest()).max_draft_tokens
            reply = prefill(stub, [[5, 6, 7]])
            request = lm_pb2.DecodeRequest()
            request.batches.add(batch_id=reply.batch_id, next_ids=[8], draft_lengths=[1], draft_ids=[9])
            with pytest.raises(grpc.RpcError) as info:
                stub.Decode(request)
            assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            step = stub.Decode(
                lm_pb2.DecodeRequest(batches=[lm_pb2.DecodeBatch(batch_id=reply.batch_id, next_ids=[8])])
            )
            assert logits(step.output).shape[0] == 1
    finally:
        service.stop()
    return limit, info.value.details(), service.log_path.read_text()


def test_a_graph_with_last_logits_only_says_it_cannot_verify(served_lm, tmp_path):
    """A graph exported before logits_positions: Describe says max_draft_tokens 0, and drafts are refused with
    the reason (the gateway then never drafts for it); it still serves plain steps."""
    folder = last_logits_only(served_lm("llama").onnx_dir, tmp_path / "old")
    limit, refusal, log = served_without_drafts(folder, tmp_path)
    assert limit == 0
    reason = "this model's graph gives only its last position's logits"
    assert f"batches[0].draft_lengths: {reason}" in refusal
    assert log.count(f"drafts off: {reason}") == 1


def test_a_graph_with_int8_activations_before_its_kv_refuses_drafts(tmp_path):
    """The fixture's layers run MatMulNBits at accuracy level 4 (tests/lm/test_int8_activations.py): a drafted
    position's KV could differ from a one-token step's by an int8 step and change later tokens, so Describe says
    max_draft_tokens 0 and drafts are refused with the reason; plain steps still serve."""
    limit, refusal, log = served_without_drafts(FIXTURE, tmp_path)
    assert limit == 0
    reason = "this graph quantizes activations to int8 before its KV (node "
    assert f"batches[0].draft_lengths: {reason}" in refusal
    assert ", MatMulNBits accuracy_level 4), so a drafted position's KV would differ from a one-token step's" in (
        refusal
    )
    assert "drafts are refused" in refusal
    assert log.count(f"drafts off: {reason}") == 1

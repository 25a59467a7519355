"""PrefillRow.suppressed_token_ids: a row never picks those ids, in any output and for its whole life (greedy
bursts, Filter copies, Decode joins), and its greedy tokens equal transformers' generate(suppress_tokens=...);
rows without it are unchanged, and a step's allowed-token mask decides alone for its row."""

from __future__ import annotations

import grpc
import numpy as np
import pytest
import torch

from muestra.v1 import lm_pb2
from tests.lm.lm_client import logits, prompts, spec, torch_last_logits

STEPS = 12


def hf_greedy(model, prompt: list[int], suppressed: list[int]) -> list[int]:
    with torch.no_grad():
        out = model.generate(
            torch.tensor([prompt]),
            attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
            do_sample=False,
            max_new_tokens=STEPS,
            suppress_tokens=suppressed or None,
        )
    return out[0, len(prompt) :].tolist()


def row(prompt, suppressed=(), kind=lm_pb2.ARGMAX, top_n=0, allowed=b"") -> lm_pb2.PrefillRow:
    output = lm_pb2.OutputSpec(kind=kind, top_n=top_n, allowed_tokens=allowed)
    return lm_pb2.PrefillRow(input_ids=prompt, output=output, suppressed_token_ids=list(suppressed))


def greedy_burst(stub, batch_id, next_ids, steps) -> lm_pb2.DecodeResponse:
    request = lm_pb2.DecodeRequest(greedy_steps=steps)
    request.batches.add(batch_id=batch_id, next_ids=next_ids)
    return stub.Decode(request)


def winners(model, prompt: list[int], count: int) -> list[int]:
    """The ids greedy decoding would pick first: suppressing them changes what it picks."""
    first = torch_last_logits(model, prompt)
    return np.argsort(-first)[:count].tolist()


def test_suppressed_ids_are_never_picked_and_greedy_equals_transformers(lm_service, served_lm):
    stub = lm_service("llama").stub
    model = served_lm("llama").torch_model()
    a, b = prompts([7, 11], model.config.vocab_size, seed=5)
    suppressed = sorted(set(winners(model, a, 3) + hf_greedy(model, a, [])[:4]))
    expected_a, expected_b = hf_greedy(model, a, suppressed), hf_greedy(model, b, [])
    assert not set(expected_a) & set(suppressed)
    assert expected_a != hf_greedy(model, a, [])  # the suppression matters for this prompt

    first = stub.Prefill(lm_pb2.PrefillRequest(rows=[row(a, suppressed)]))
    second = stub.Prefill(lm_pb2.PrefillRequest(rows=[row(b)]))
    got_a, got_b = [first.output.rows[0].argmax], [second.output.rows[0].argmax]
    # Filter repeats row a (as n > 1 does); Decode joins it with b's batch: every copy keeps its suppression.
    kept = stub.Filter(lm_pb2.FilterRequest(batch_id=first.batch_id, rows=[0, 0]))
    request = lm_pb2.DecodeRequest()
    request.batches.add(batch_id=kept.batch_id, next_ids=[got_a[-1]] * 2)
    request.batches.add(batch_id=second.batch_id, next_ids=[got_b[-1]])
    reply = stub.Decode(request)
    assert reply.output.rows[0].argmax == reply.output.rows[1].argmax
    got_a.append(reply.output.rows[0].argmax)
    got_b.append(reply.output.rows[2].argmax)
    burst = greedy_burst(stub, reply.batch_id, [got_a[-1], got_a[-1], got_b[-1]], STEPS - 2)
    rows = burst.output.rows
    assert list(rows[0].greedy_ids) == list(rows[1].greedy_ids)
    got_a.extend(rows[0].greedy_ids)
    got_b.extend(rows[2].greedy_ids)
    assert got_a == expected_a
    assert got_b == expected_b
    stub.Clear(lm_pb2.ClearRequest(batch_ids=[burst.batch_id]))


def test_suppressed_ids_are_minus_infinity_in_logits_and_left_out_of_top_n(lm_service, served_lm):
    stub = lm_service("llama").stub
    model = served_lm("llama").torch_model()
    (prompt,) = prompts([9], model.config.vocab_size, seed=8)
    suppressed = winners(model, prompt, 4)
    reply = stub.Prefill(
        lm_pb2.PrefillRequest(
            rows=[row(prompt, suppressed, lm_pb2.LOGITS), row(prompt, suppressed, lm_pb2.TOP_N, top_n=8)]
        )
    )
    full, top = logits(reply.output)[0], reply.output.rows[1]
    reference = torch_last_logits(model, prompt)
    assert np.isneginf(full[suppressed]).all()
    others = np.setdiff1d(np.arange(full.size), suppressed)
    np.testing.assert_allclose(full[others], reference[others], rtol=1e-4, atol=1e-4)
    assert not set(top.top_ids) & set(suppressed)
    assert (
        list(top.top_ids)
        == np.argsort(-np.where(np.isin(np.arange(full.size), suppressed), -np.inf, reference))[:8].tolist()
    )
    masked = reference[others]
    peak = masked.max()
    assert top.logsumexp == pytest.approx(peak + np.log(np.exp(masked - peak).sum()), abs=1e-4)
    stub.Clear(lm_pb2.ClearRequest(batch_ids=[reply.batch_id]))


def test_an_allowed_tokens_mask_decides_alone_for_its_step(lm_service, served_lm):
    stub = lm_service("llama").stub
    model = served_lm("llama").torch_model()
    (prompt,) = prompts([6], model.config.vocab_size, seed=9)
    vocab = model.config.vocab_size
    special = 3
    mask = np.zeros(vocab, dtype=np.uint8)
    mask[[special, 10, 11]] = 1
    allowed = np.packbits(mask, bitorder="little").tobytes()
    reference = torch_last_logits(model, prompt)
    reply = stub.Prefill(lm_pb2.PrefillRequest(rows=[row(prompt, [special], lm_pb2.LOGITS, allowed=allowed)]))
    # The grammar's word wins: the suppressed id stays as the mask leaves it.
    assert logits(reply.output)[0][special] == pytest.approx(reference[special], abs=1e-4)
    # The next step without a mask suppresses it again.
    step = stub.Decode(
        lm_pb2.DecodeRequest(
            batches=[lm_pb2.DecodeBatch(batch_id=reply.batch_id, next_ids=[10], outputs=[spec(lm_pb2.LOGITS)])]
        )
    )
    assert np.isneginf(logits(step.output)[0][special])
    stub.Clear(lm_pb2.ClearRequest(batch_ids=[step.batch_id]))


def test_suppressed_ids_past_the_vocabulary_are_refused(lm_service):
    stub = lm_service("llama").stub
    with pytest.raises(grpc.RpcError) as info:
        stub.Prefill(lm_pb2.PrefillRequest(rows=[row([5, 6, 7], [3, 1024])]))
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "rows[0].suppressed_token_ids" in info.value.details()

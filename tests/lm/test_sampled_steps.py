"""Sampled bursts in the lm (DecodeBatch.samplers): the lm picks a sampled row's tokens with the row's own chain
exactly as the gateway's runner would (same tokens, same generator and sampler state after), over random logits
for every shipped sampler and mirostat; a burst through the real service lists the tokens a step-by-step run
with the gateway's runner picks from the shipped logits; a failing chain fails only its rows; and what a
RowSampler cannot be is refused with INVALID_ARGUMENT naming the field, the batch kept."""

from __future__ import annotations

import grpc
import numpy as np
import pytest

from muestra.gateway.engine.sampling import ModelInfo, SamplerRegistry, new_rows, sample_next_tokens, validate_chain
from muestra.lm.sampling import LmChain, LmSamplers, SampledRow, pick
from muestra.plugin import RowContext, TokenSelector
from muestra.v1 import lm_pb2
from tests.lm.lm_client import logits as shipped_logits
from tests.lm.lm_client import prefill, prompts

VOCAB = 1024
MODEL = ModelInfo(VOCAB, (2,), 256)
CHAINS = [
    [{"name": "temperature", "params": {"temperature": 0.2}}, {"name": "top_k", "params": {"top_k": 50}},
     {"name": "top_p", "params": {"top_p": 0.9}}],
    [{"name": "repetition_penalty", "params": {"repetition_penalty": 1.3}},
     {"name": "presence_penalty", "params": {"presence_penalty": 0.5}},
     {"name": "frequency_penalty", "params": {"frequency_penalty": 0.3}},
     {"name": "logit_bias", "params": {"logit_bias": {"5": -100, "7": 3}}},
     {"name": "min_p", "params": {"min_p": 0.05}}, {"name": "typical_p", "params": {"typical_p": 0.8}}],
    [{"name": "temperature", "params": {"temperature": 1.5}}, {"name": "mirostat", "params": {"tau": 3.0}}],
    [{"name": "logit_bias", "params": {"logit_bias": {"11": 4.5}}}, {"name": "greedy"}],
]  # fmt: skip


@pytest.fixture(scope="module")
def registry():
    return SamplerRegistry.load()


def gateway_rows(registry, seed: int):
    """One gateway row per chain (each with its own seed), with a few ids generated already."""
    rows = []
    for k, specs in enumerate(CHAINS):
        (row,) = new_rows(validate_chain(registry, specs, MODEL), [3, 1, 4, 1, 5], seed + k)
        for token in (9, 2, 6):
            row.context.append(token)
        rows.append(row)
    return rows


def test_the_lm_picks_what_the_gateway_runner_picks(registry):
    lm = LmSamplers.load(MODEL)
    runnable = {(s.name, s.distribution, s.version) for s in lm.sources()}
    reference = gateway_rows(registry, 11)
    assert all(row.runs_in_lm(frozenset(runnable)) for row in reference)
    sampled = [lm.row(f"row {i}", row.lm_sampler()) for i, row in enumerate(reference)]
    rng = np.random.default_rng(0)
    for _ in range(12):
        logits = (rng.standard_normal((len(reference), VOCAB)) * 4).astype(np.float32)
        expected = sample_next_tokens(reference, logits)
        tokens, errors = pick(sampled, logits)
        assert errors == [None] * len(reference)
        assert tokens.tolist() == expected.token_ids.tolist()
    for row, mine in zip(reference, sampled, strict=True):
        assert mine.context.output_ids.tolist() == row.context.output_ids.tolist()
        assert mine.context.rng.bit_generator.state == row.context.rng.bit_generator.state
        assert mine.context.state == row.context.state
    # Their states go back to the gateway as JSON and draw on from there.
    assert reference[2].context.state["mirostat"]["mu"] != 6.0
    twin = gateway_rows(registry, 11)[2]
    twin.went_on_in_lm(*sampled[2].state())
    assert twin.context.rng.random() == reference[2].context.rng.random()
    assert twin.context.state == reference[2].context.state


class Broken(TokenSelector):
    name = "broken"
    runs_in_lm = True

    def select(self, logits, params, rows):
        raise ValueError("no token today")


def test_a_failing_chain_fails_its_rows_alone(registry):
    lm = LmSamplers.load(MODEL)
    good = lm.row("good", gateway_rows(registry, 3)[0].lm_sampler())
    broken = SampledRow(LmChain((Broken(),), ({},)), RowContext([1], np.random.default_rng(1)))
    before = good.context.rng.bit_generator.state
    logits = np.random.default_rng(2).standard_normal((3, VOCAB)).astype(np.float32)
    tokens, errors = pick([good, None, broken], logits)
    assert tokens[0] >= 0 and tokens[1] == tokens[2] == -1
    assert errors[:2] == [None, None] and errors[2] == "sampler chain failed: no token today"
    assert good.context.rng.bit_generator.state != before and broken.context.output_ids.size == 0


def burst(stub, batch_id: str, next_ids: list[int], samplers, steps: int, kinds=()) -> lm_pb2.DecodeResponse:
    request = lm_pb2.DecodeRequest(greedy_steps=steps)
    outputs = [lm_pb2.OutputSpec(kind=kind) for kind in kinds]
    request.batches.add(batch_id=batch_id, next_ids=next_ids, samplers=samplers, outputs=outputs)
    return stub.Decode(request)


def test_a_sampled_burst_lists_the_tokens_of_steps_sampled_by_the_gateway(lm_service, registry):
    """Two rows, a sampled one and a greedy one: a burst of 6 equals 6 single LOGITS steps sampled by the
    gateway's runner from the shipped logits, and the next burst goes on from the state it returned."""
    service = lm_service("llama")
    info = service.stub.Describe(lm_pb2.DescribeModelRequest())
    model = ModelInfo(info.vocab_size, tuple(info.eos_token_ids), info.context_length)
    batch = prompts([6, 9], info.vocab_size, seed=5)
    chain = validate_chain(registry, CHAINS[1], model)

    def start():
        reply = prefill(service.stub, batch, kind=lm_pb2.LOGITS)
        (row,) = new_rows(chain, batch[0], 7)
        first = sample_next_tokens([row], shipped_logits(reply.output)[:1]).token_ids[0]
        return reply.batch_id, row, [int(first), int(reply.output.rows[1].argmax)]

    batch_id, row, ids = start()
    expected = [[], []]
    for _ in range(12):
        step = lm_pb2.DecodeRequest()
        step.batches.add(batch_id=batch_id, next_ids=ids)
        reply = service.stub.Decode(step)
        batch_id = reply.batch_id
        logits = shipped_logits(reply.output)
        ids = [int(sample_next_tokens([row], logits[:1]).token_ids[0]), int(np.argmax(logits[1]))]
        expected[0].append(ids[0])
        expected[1].append(ids[1])
    service.stub.Clear(lm_pb2.ClearRequest(batch_ids=[batch_id]))

    batch_id, twin, ids = start()
    got = [[], []]
    for steps in (6, 6):
        kinds = (lm_pb2.LOGITS, lm_pb2.ARGMAX)
        reply = burst(service.stub, batch_id, ids, [twin.lm_sampler(), lm_pb2.RowSampler()], steps, kinds)
        batch_id, (mine, greedy) = reply.batch_id, reply.output.rows
        assert not reply.output.HasField("logits") and not mine.sampler_error
        for token in mine.greedy_ids:
            twin.context.append(token)
        twin.went_on_in_lm(mine.rng_json, mine.state_json)
        got[0] += mine.greedy_ids
        got[1] += greedy.greedy_ids
        ids = [mine.greedy_ids[-1], greedy.greedy_ids[-1]]
    assert got == expected
    service.stub.Clear(lm_pb2.ClearRequest(batch_ids=[batch_id]))


def test_what_a_row_sampler_cannot_be_is_refused_and_the_batch_kept(lm_service, registry):
    service = lm_service("llama")
    info = service.stub.Describe(lm_pb2.DescribeModelRequest())
    assert {"temperature", "top_p", "sample", "mirostat"} <= {s.name for s in info.samplers}
    assert "beam_search" not in {s.name for s in info.samplers}
    model = ModelInfo(info.vocab_size, tuple(info.eos_token_ids), info.context_length)
    reply = prefill(service.stub, prompts([5, 7], info.vocab_size, seed=1), kind=lm_pb2.LOGITS)
    batch_id, ids = reply.batch_id, [row.argmax for row in reply.output.rows]
    (row,) = new_rows(validate_chain(registry, CHAINS[0], model), [1, 2], 3)
    good = row.lm_sampler()

    def variant(**fields) -> lm_pb2.RowSampler:
        message = lm_pb2.RowSampler()
        message.CopyFrom(good)
        for name, value in fields.items():
            if isinstance(value, list):
                getattr(message, name)[:] = value
            else:
                setattr(message, name, value)
        return message

    field = "batches[0].samplers[1]"
    cases = [
        (variant(chain_json="[{"), f"{field}.chain_json: is not JSON"),
        (variant(chain_json='[{"name": "beam_search"}]'), f"{field}.chain_json[0].name: 'beam_search' does not run"),
        (variant(chain_json='[{"name": "sample"}, {"name": "top_k"}]'), f"{field}.chain_json[0]: only the last"),
        (variant(chain_json='[{"name": "temperature"}]'), f"{field}.chain_json[0]: the last sampler must pick"),
        (
            variant(chain_json='[{"name": "temperature", "params": {"temperature": -1}}, {"name": "sample"}]'),
            f"{field}.chain_json[0].params.temperature:",
        ),
        (variant(rng_json='{"bit_generator": "MT19937"}'), f"{field}.rng_json: must be numpy's PCG64 state"),
        (variant(state_json="[1]"), f"{field}.state_json: must be a JSON object"),
        (variant(output_ids=[1] * info.context_length), f"{field}.output_ids: must be between 0 and"),
        (variant(prompt_ids=[info.vocab_size]), f"{field}.prompt_ids: ids must be below the vocabulary size"),
        (variant(chain_json="x" * (64 * 1024 + 1)), f"{field}.chain_json: must be between 1 and 65536"),
    ]
    for sampler, message in cases:
        request = lm_pb2.DecodeRequest(greedy_steps=4)
        request.batches.add(batch_id=batch_id, next_ids=ids, samplers=[good, sampler])
        with pytest.raises(grpc.RpcError) as error:
            service.stub.Decode(request)
        assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert message in error.value.details()
    short = lm_pb2.DecodeRequest(greedy_steps=4)
    short.batches.add(batch_id=batch_id, next_ids=ids, samplers=[good])
    with pytest.raises(grpc.RpcError) as error:
        service.stub.Decode(short)
    assert "batches[0].samplers: got 1 samplers for a batch of 2 rows" in error.value.details()
    # Nothing changed: the batch bursts on with both rows sampled.
    reply = burst(service.stub, batch_id, ids, [good, good], 4)
    assert [len(out.greedy_ids) for out in reply.output.rows] == [4, 4]
    service.stub.Clear(lm_pb2.ClearRequest(batch_ids=[reply.batch_id]))

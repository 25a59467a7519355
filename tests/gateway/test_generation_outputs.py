"""The finish rules and token bookkeeping of generation/outputs.py, on rows built without any process.

The rows are the scheduler's own (GenerationRequest, Sequence) with a real sampler chain; constraints are
small fakes that follow a scripted grammar. The same rules are exercised through real processes in
tests/gateway/test_generate.py, test_greedy_bursts.py and tests/constraints.
"""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from muestra.gateway.engine.generation import outputs
from muestra.gateway.engine.generation.outputs import OutputProcessor
from muestra.gateway.engine.generation.request import GenerationRequest, Sequence
from muestra.gateway.engine.sampling import ModelInfo, new_rows, validate_chain
from muestra.v1 import gateway_pb2, lm_pb2

VOCAB = 64
EOS = 2


@dataclasses.dataclass
class Model:
    name: str = "test-model"
    eos_token_ids: tuple[int, ...] = (EOS,)
    tokenizer_vocab_size: int = 60  # ids 60-63: padding rows of the lm's vocabulary, never text
    context_length: int = 32


class ScriptedConstraint:
    """A grammar that accepts exactly `text` (a list of ids), one at a time; forced where `forced` says."""

    def __init__(self, text: list[int], forced: set[int] = frozenset()) -> None:
        self.text = text
        self.at = 0
        self.forced_at = forced
        self.error = ""
        self.forced = None
        self.forced_count = 0

    def consume(self, token: int) -> bool:
        if self.at >= len(self.text) or token != self.text[self.at]:
            self.error = f"token {token} not allowed"
            return False
        self.at += 1
        return True

    @property
    def complete(self) -> bool:
        return self.at == len(self.text)

    def mask_bytes(self) -> bytes:
        return b""

    def refill(self) -> None:
        self.forced = self.text[self.at] if self.at in self.forced_at and self.at < len(self.text) else None


@pytest.fixture(autouse=True)
def scripted_masks(monkeypatch):
    # The budgets (tokens left, max_tokens) steer JSON endings, which these scripted constraints have none of.
    monkeypatch.setattr(outputs, "fill_masks", lambda constraints, *budgets: [c.refill() for c in constraints])


def make_row(registry, *, max_tokens=10, prompt=(5, 6, 7), chain=(("greedy", {}),), logprobs=False, **request_fields):
    model_info = ModelInfo(VOCAB, (EOS,), Model.context_length)
    specs = [{"name": name, "params": params} for name, params in chain]
    request = GenerationRequest(
        request_id="r",
        prompt_ids=list(prompt),
        max_tokens=max_tokens,
        n=1,
        seed=1,
        chain=validate_chain(registry, specs, model_info),
        logprobs=logprobs,
        top_logprobs=2 if logprobs else 0,
        **request_fields,
    )
    (sampling,) = new_rows(request.chain, request.prompt_ids, 1, 1, logprobs, request.top_logprobs)
    return Sequence(request, 0, sampling)


def peaked(token: int, rows: int = 1) -> np.ndarray:
    logits = np.zeros((rows, VOCAB), dtype=np.float32)
    logits[:, token] = 10.0
    return logits


def take(processor, row, token):
    processor.accept([row], peaked(token), [0], [token])


def test_a_taken_token_is_streamed_fed_next_and_detokenized(sampler_registry):
    processor, row = OutputProcessor(Model()), make_row(sampler_registry)
    take(processor, row, 11)
    assert (row.generated, row.unsent_ids, row.pending_token, row.finished) == ([11], [11], 11, False)
    assert row.detok.pending


@pytest.mark.parametrize(
    "fields, token, reason, stop_reason",
    [
        ({}, EOS, gateway_pb2.STOP, f"eos:{EOS}"),
        ({"stop_token_ids": frozenset({9})}, 9, gateway_pb2.STOP, "token:9"),
        ({"max_tokens": 1}, 11, gateway_pb2.LENGTH, ""),
        ({"prompt": tuple(range(3, 34))}, 11, gateway_pb2.LENGTH, ""),  # 31 + 1 reaches the context of 32
    ],
)
def test_finish_rules(sampler_registry, fields, token, reason, stop_reason):
    processor = OutputProcessor(Model())
    row = make_row(sampler_registry, **fields)
    take(processor, row, token)
    assert (row.finish_reason, row.stop_reason) == (reason, stop_reason)
    assert row.generated == [token]


def test_eos_ends_a_row_but_is_never_text_nor_fed(sampler_registry):
    row = make_row(sampler_registry)
    take(OutputProcessor(Model()), row, EOS)
    assert row.pending_token is None and not row.detok.pending and row.unsent_ids == [EOS]


def test_ignore_eos_goes_on_past_eos(sampler_registry):
    row = make_row(sampler_registry, ignore_eos=True)
    take(OutputProcessor(Model()), row, EOS)
    assert not row.finished and row.pending_token == EOS


def test_ids_past_the_tokenizer_vocabulary_are_fed_but_not_detokenized(sampler_registry):
    row = make_row(sampler_registry)
    take(OutputProcessor(Model()), row, 61)
    assert row.pending_token == 61 and row.generated == [61] and not row.detok.pending


def burst(*picks: list[int]) -> list[lm_pb2.RowOutput]:
    """RowOutputs of a greedy burst: each row's picks."""
    return [lm_pb2.RowOutput(greedy_ids=ids) for ids in picks]


def test_a_burst_is_cut_after_the_row_ends(sampler_registry):
    processor = OutputProcessor(Model())
    ends_at_eos, ends_at_length = make_row(sampler_registry), make_row(sampler_registry, max_tokens=2)
    processor.accept_burst([ends_at_eos, ends_at_length], burst([11, EOS, 12, 13], [21, 22, 23, 24]))
    assert ends_at_eos.generated == [11, EOS] and ends_at_eos.finish_reason == gateway_pb2.STOP
    assert ends_at_length.generated == [21, 22] and ends_at_length.finish_reason == gateway_pb2.LENGTH
    # The samplers' context holds what the row took, and nothing is left to feed.
    assert ends_at_eos.sampling.context.output_ids.tolist() == [11, EOS] and ends_at_eos.pending_token is None


def test_a_sampled_burst_row_goes_on_from_the_lms_state_or_ends_with_its_chains_error(sampler_registry):
    chain = (("temperature", {"temperature": 0.5}), ("sample", {}))
    goes_on, fails = make_row(sampler_registry, chain=chain), make_row(sampler_registry, chain=chain)
    moved = np.random.default_rng(99)
    moved.random()
    state = json.dumps(moved.bit_generator.state)
    outputs = [
        lm_pb2.RowOutput(greedy_ids=[11, 12], rng_json=state, state_json='{"x": {"mu": 1.5}}'),
        lm_pb2.RowOutput(greedy_ids=[21], sampler_error="sampler chain failed: no token today"),
    ]
    OutputProcessor(Model()).accept_burst([goes_on, fails], outputs)
    assert goes_on.generated == [11, 12] and not goes_on.finished
    assert goes_on.sampling.context.rng.random() == moved.random()
    assert goes_on.sampling.context.state == {"x": {"mu": 1.5}}
    assert fails.generated == [21] and fails.finish_reason == gateway_pb2.ERROR
    assert fails.error == "sampler chain failed: no token today"


def test_a_burst_row_keeps_its_last_token_pending(sampler_registry):
    row = make_row(sampler_registry)
    OutputProcessor(Model()).accept_burst([row], burst([11, 12, 13]))
    # The lm fed every burst token but the last itself: that one is fed with the next step.
    assert row.generated == [11, 12, 13] and row.pending_token == 13 and not row.finished


def test_a_complete_constraint_stops_its_row(sampler_registry):
    row = make_row(sampler_registry)
    row.sampling.constraint = ScriptedConstraint([11, 12])
    processor = OutputProcessor(Model())
    take(processor, row, 11)
    assert not row.finished
    take(processor, row, 12)
    assert (row.finish_reason, row.stop_reason) == (gateway_pb2.STOP, "constraint")


def test_a_token_the_constraint_refuses_ends_the_row_with_its_error(sampler_registry):
    row = make_row(sampler_registry)
    row.sampling.constraint = ScriptedConstraint([11, 12])
    take(OutputProcessor(Model()), row, 13)
    assert row.finish_reason == gateway_pb2.ERROR and row.error == "token 13 not allowed"


def test_forced_tokens_are_taken_at_once_and_queued_behind_the_pending_one(sampler_registry):
    row = make_row(sampler_registry)
    row.sampling.constraint = ScriptedConstraint([11, 12, 13, 14], forced={1, 2})
    take(OutputProcessor(Model()), row, 11)
    assert row.generated == [11, 12, 13]
    assert (row.pending_token, row.queued) == (11, [12, 13])
    assert row.sampling.forced_token is None  # token 14 is the chain's to pick again


def test_fast_forward_stops_at_max_tokens(sampler_registry):
    row = make_row(sampler_registry, max_tokens=2)
    row.sampling.constraint = ScriptedConstraint([11, 12, 13, 14], forced={1, 2, 3})
    take(OutputProcessor(Model()), row, 11)
    assert row.generated == [11, 12] and row.finish_reason == gateway_pb2.LENGTH


def test_logprobs_follow_the_sampled_tokens_only(sampler_registry):
    row = make_row(sampler_registry, logprobs=True, chain=(("temperature", {"temperature": 1.0}), ("sample", {})))
    row.sampling.constraint = ScriptedConstraint([11, 12, 13], forced={1})
    processor = OutputProcessor(Model())
    take(processor, row, 11)
    # A row that wants logprobs is never fast-forwarded: every token carries its logprob.
    assert row.generated == [11] and [e.token_id for e in row.unsent_logprobs] == [11]
    entry = row.unsent_logprobs[0]
    assert entry.logprob == pytest.approx(10.0 - np.log(np.exp(10.0) + VOCAB - 1), abs=1e-4)
    assert len(entry.top) == 2 and entry.top[0].token_id == 11


def test_a_row_finished_by_a_stop_string_takes_nothing_more(sampler_registry):
    row = make_row(sampler_registry)
    row.finish(gateway_pb2.STOP, "stop")
    take(OutputProcessor(Model()), row, 11)
    assert row.generated == []


def test_rows_in_flight_skip_sampling(sampler_registry):
    """A row that fed only part of its tokens last step gets no new token from that step's output."""
    processor = OutputProcessor(Model())
    busy, free = make_row(sampler_registry), make_row(sampler_registry)
    busy.in_flight = True
    processor.accept([busy, free], peaked(11, rows=2), [0, 1], [11, 11])
    assert busy.generated == [] and free.generated == [11]

"""Greedy decoding through the lm service equals transformers' generate(do_sample=False)."""

from __future__ import annotations

import pytest
import torch

from muestra.v1 import lm_pb2
from tests.fixtures.lm_service import SERVED_MODELS
from tests.lm.lm_client import decode, prefill, prompts

MAX_NEW_TOKENS = 24


def transformers_greedy(model, prompt: list[int]) -> list[int]:
    with torch.no_grad():
        out = model.generate(
            torch.tensor([prompt]),
            attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
            do_sample=False,
            max_new_tokens=MAX_NEW_TOKENS,
        )
    return out[0, len(prompt) :].tolist()


def service_greedy(stub, prompt_batch: list[list[int]], eos: set[int]) -> list[list[int]]:
    """A client-side argmax loop over gRPC, ARGMAX outputs only; a row stops at EOS like generate."""
    reply = prefill(stub, prompt_batch, kind=lm_pb2.ARGMAX)
    generated: list[list[int]] = [[] for _ in prompt_batch]
    live = list(range(len(prompt_batch)))  # batch row -> prompt index
    batch_id = reply.batch_id
    for step in range(MAX_NEW_TOKENS):
        assert len(reply.output.logits.data) == 0, "ARGMAX rows must not carry logits"
        tokens = [row.argmax for row in reply.output.rows]
        for index, token in zip(live, tokens, strict=True):
            generated[index].append(token)
        keep = [r for r, token in enumerate(tokens) if token not in eos]
        if step == MAX_NEW_TOKENS - 1 or not keep:
            stub.Clear(lm_pb2.ClearRequest(batch_ids=[batch_id]))
            break
        if len(keep) < len(live):
            batch_id = stub.Filter(lm_pb2.FilterRequest(batch_id=batch_id, rows=keep)).batch_id
            live, tokens = [live[r] for r in keep], [tokens[r] for r in keep]
        reply = decode(stub, (batch_id, tokens))
        batch_id = reply.batch_id
    return generated


@pytest.mark.parametrize("family", SERVED_MODELS)
def test_greedy_tokens_equal_transformers_generate(lm_service, served_lm, family):
    service = lm_service(family)
    model = served_lm(family).torch_model()
    eos = set(service.stub.Describe(lm_pb2.DescribeModelRequest()).eos_token_ids)
    batch = prompts([9, 4, 15], model.config.vocab_size, seed=7)
    expected = [transformers_greedy(model, p) for p in batch]
    assert service_greedy(service.stub, batch[:1], eos) == expected[:1]
    assert service_greedy(service.stub, batch, eos) == expected

"""Special tokens that do not end text are never sampled by default, so every completion's logprob tokens join
to its content (issue 33 item 4); GenerateRequest.allow_special_tokens lets them back in.

Runs on the text fixture's stack, whose tokenizer has <|bos|> (0) and <|pad|> (2) besides <|eos|> (1)."""

from __future__ import annotations

import pytest

from muestra.v1 import gateway_pb2
from tests.fixtures.logprob_tokens import joined

SPECIAL = {0, 2}  # <|bos|>, <|pad|>; <|eos|> (1) ends text and stays allowed
HOT = 1.8
MESSAGES = [{"role": "user", "content": "Tell me a story about a robot."}]


def sampled(prompt: str, seed: int, **fields) -> gateway_pb2.GenerateRequest:
    request = gateway_pb2.GenerateRequest(prompt=prompt, max_tokens=40, seed=seed, logprobs=True, **fields)
    request.samplers.add(name="temperature").params.update({"temperature": HOT})
    request.samplers.add(name="sample")
    return request


def bias_toward_specials(request: gateway_pb2.GenerateRequest) -> gateway_pb2.GenerateRequest:
    """A logit_bias that makes <|bos|> and <|pad|> the likeliest tokens, were they allowed."""
    spec = gateway_pb2.SamplerSpec(name="logit_bias")
    spec.params.update({"logit_bias": {"0": 30.0, "2": 30.0}})
    request.samplers.insert(0, spec)
    return request


def generated_ids(stub, request) -> list[int]:
    ids = []
    for message in stub.Generate(request, timeout=60):
        if message.HasField("delta"):
            ids.extend(message.delta.token_ids)
    return ids


@pytest.fixture(scope="module")
def stub(text_fixture_tools_stack):
    return text_fixture_tools_stack.stub


def test_hot_sampling_never_picks_a_special_token(stub):
    ids = []
    for seed in range(24):
        ids.extend(generated_ids(stub, sampled("Once upon a time", seed)))
        ids.extend(generated_ids(stub, bias_toward_specials(sampled("The robot said", seed))))
    assert len(ids) > 24 * 40
    assert not SPECIAL & set(ids)


def test_greedy_and_beam_search_never_pick_a_special_token(stub):
    for seed in range(4):
        greedy = gateway_pb2.GenerateRequest(prompt=f"Story {seed}:", max_tokens=32)
        greedy.samplers.add(name="greedy")
        assert not SPECIAL & set(generated_ids(stub, bias_toward_specials(greedy)))
    beams = gateway_pb2.GenerateRequest(prompt="The robot", max_tokens=16, n=2)
    beams.samplers.add(name="beam_search").params.update({"num_beams": 3})
    assert not SPECIAL & set(generated_ids(stub, beams))


def test_allow_special_tokens_lets_them_be_sampled(stub):
    ids = []
    for seed in range(4):
        request = bias_toward_specials(sampled("Once upon a time", seed, allow_special_tokens=True))
        ids.extend(generated_ids(stub, request))
    assert SPECIAL & set(ids)


def test_stop_token_ids_are_never_suppressed(stub):
    request = bias_toward_specials(sampled("Once upon a time", 3, stop_token_ids=[2]))
    ids = generated_ids(stub, request)
    assert ids[-1] == 2  # <|pad|> as a stop id ends the text instead of being suppressed


def chat(stack, seed: int, stream: bool, **extra) -> tuple[str, list[str]]:
    """One hot chat completion with logprobs: its content and its logprob tokens, in order."""
    reply = stack.client().chat.completions.create(
        model=stack.model, messages=MESSAGES, max_tokens=40, temperature=HOT, seed=seed, logprobs=True,
        top_logprobs=2, stream=stream, extra_body=extra,
    )  # fmt: skip
    if not stream:
        choice = reply.choices[0]
        return choice.message.content or "", [e.token for e in choice.logprobs.content]
    content, tokens = [], []
    for chunk in reply:
        for choice in chunk.choices:
            content.append(choice.delta.content or "")
            if choice.logprobs is not None:
                tokens.extend(e.token for e in choice.logprobs.content or [])
    return "".join(content), tokens


def completion(stack, seed: int, **extra) -> tuple[str, list[str]]:
    reply = stack.client().completions.create(
        model=stack.model, prompt="Once upon a time", max_tokens=40, temperature=HOT, seed=seed, logprobs=2,
        extra_body=extra,
    )  # fmt: skip
    return reply.choices[0].text, reply.choices[0].logprobs.tokens


@pytest.mark.parametrize("stream", [False, True])
def test_logprob_tokens_join_to_the_chat_content(text_fixture_tools_stack, stream):
    stack = text_fixture_tools_stack
    for seed in range(20):
        bias = {"logit_bias": {"0": 30, "2": 30}} if seed % 2 else {}
        content, tokens = chat(stack, seed, stream, **bias)
        assert tokens
        assert joined(tokens) == content, f"seed {seed}"


def test_logprob_tokens_join_to_the_completion_text(text_fixture_tools_stack):
    stack = text_fixture_tools_stack
    for seed in range(20):
        bias = {"logit_bias": {"0": 30, "2": 30}} if seed % 2 else {}
        text, tokens = completion(stack, seed, **bias)
        assert joined(tokens) == text, f"seed {seed}"


@pytest.mark.parametrize("stream", [False, True])
def test_allow_special_tokens_over_http_shows_them_in_the_content(text_fixture_tools_stack, stream):
    stack = text_fixture_tools_stack
    tokens = []
    for seed in range(4):
        content, more = chat(stack, seed, stream, logit_bias={"0": 30, "2": 30}, allow_special_tokens=True)
        assert joined(more) == content, f"seed {seed}"  # the logprob tokens still join to the content
        tokens.extend(more)
    assert {"<|bos|>", "<|pad|>"} & set(tokens)


def test_allow_special_tokens_must_be_a_boolean(text_fixture_tools_stack):
    import openai

    stack = text_fixture_tools_stack
    with pytest.raises(openai.BadRequestError):
        stack.client().chat.completions.create(
            model=stack.model, messages=MESSAGES, max_tokens=4, extra_body={"allow_special_tokens": "maybe"}
        )

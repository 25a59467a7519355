"""The OpenAI-compatible HTTP API, text: the official `openai` client against a real gateway, tokenizer and lm.

References: transformers' generate and the model's own logits (through the chat template as transformers renders
it), and the gateway's gRPC Generate for the same request.
"""

from __future__ import annotations

import math

import pytest
import torch

from muestra.client import Client
from tests.fixtures.lm_models import default_suppressed_ids

PROMPT = "The quick brown fox"
MESSAGES = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Name a colour."},
]


@pytest.fixture(scope="module")
def stack(openai_stack):
    return openai_stack


@pytest.fixture(scope="module")
def client(stack):
    with stack.client(max_retries=0, timeout=120) as c:
        yield c


@pytest.fixture(scope="module")
def reference(tiny_lm, stack):
    """The transformers model and a transformers tokenizer with the same chat template as the service's."""
    from transformers import AutoTokenizer

    return tiny_lm("llama").torch_model(), AutoTokenizer.from_pretrained(stack.chat_tokenizer_dir)


def chat_prompt_ids(tokenizer, messages) -> list[int]:
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    return list(ids["input_ids"] if hasattr(ids, "keys") else ids)


def hf_greedy(model, tokenizer, prompt_ids: list[int], max_new_tokens: int, **kwargs) -> list[int]:
    """generate(do_sample=False), with the suppression of special tokens the gateway applies by default."""
    kwargs.setdefault("suppress_tokens", default_suppressed_ids(model, tokenizer))
    ids = torch.tensor([prompt_ids])
    with torch.no_grad():
        out = model.generate(
            ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens, do_sample=False, pad_token_id=1,
            **kwargs,
        )  # fmt: skip
    generated = out[0, len(prompt_ids) :].tolist()
    eos = model.generation_config.eos_token_id
    return generated[: generated.index(eos) + 1] if eos in generated else generated


def text_in_context(tokenizer, prompt_ids: list[int], generated: list[int]) -> str:
    """What a stream of `generated` after `prompt_ids` reads as (the decode of the whole, minus the prompt's)."""
    whole = tokenizer.decode(prompt_ids + generated, skip_special_tokens=True)
    return whole[len(tokenizer.decode(prompt_ids, skip_special_tokens=True)) :]


def test_streamed_chat_deltas_concatenate_to_the_non_streamed_message(client, stack):
    kwargs = dict(model=stack.text_model, messages=MESSAGES, max_tokens=40, temperature=0.9, seed=7)
    whole = client.chat.completions.create(**kwargs)
    stream = client.chat.completions.create(**kwargs, stream=True)
    chunks = []
    for chunk in stream:  # as in OpenAI's streaming example
        chunks.append(chunk)
        print(chunk.choices[0].delta.content or "" if chunk.choices else "", end="")
    assert chunks[0].choices[0].delta.role == "assistant"
    assert all(c.object == "chat.completion.chunk" and c.id == chunks[0].id for c in chunks)
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks)
    assert streamed == whole.choices[0].message.content
    assert len(streamed) > 0
    assert chunks[-1].choices[0].finish_reason == whole.choices[0].finish_reason
    assert sum(1 for c in chunks if c.choices[0].finish_reason) == 1


def test_greedy_chat_equals_transformers_generate_over_the_chat_template(client, stack, reference):
    model, tokenizer = reference
    response = client.chat.completions.create(model=stack.text_model, messages=MESSAGES, max_tokens=24, temperature=0)
    prompt_ids = chat_prompt_ids(tokenizer, MESSAGES)
    expected = hf_greedy(model, tokenizer, prompt_ids, 24)
    choice = response.choices[0]
    assert choice.message.role == "assistant"
    assert choice.message.content == text_in_context(tokenizer, prompt_ids, expected)
    assert response.usage.prompt_tokens == len(prompt_ids)
    assert response.usage.completion_tokens == len(expected)
    assert response.usage.total_tokens == len(prompt_ids) + len(expected)
    assert choice.finish_reason == ("stop" if expected[-1] == model.generation_config.eos_token_id else "length")


def test_greedy_completion_over_http_equals_grpc_generate(client, stack):
    response = client.completions.create(
        model=stack.text_model, prompt=PROMPT, max_tokens=20, temperature=0, extra_body={"ignore_eos": True}
    )
    with Client(stack.gateway.address, api_key=stack.api_key, timeout=120) as grpc_client:
        generation = grpc_client.generate(PROMPT, max_tokens=20, ignore_eos=True, samplers=[{"name": "greedy"}]).wait()
    assert response.object == "text_completion"
    assert response.choices[0].text == generation.texts[0]
    assert response.choices[0].finish_reason == "length"
    assert (response.usage.prompt_tokens, response.usage.completion_tokens) == (4, 20)


def test_streamed_completion_reports_usage_in_a_final_chunk_when_asked(client, stack):
    kwargs = dict(model=stack.text_model, prompt=PROMPT, max_tokens=12, temperature=1.0, seed=3)
    whole = client.completions.create(**kwargs, extra_body={"ignore_eos": True})
    chunks = list(
        client.completions.create(
            **kwargs, stream=True, stream_options={"include_usage": True}, extra_body={"ignore_eos": True}
        )
    )
    assert "".join(c.choices[0].text for c in chunks if c.choices) == whole.choices[0].text
    assert all(c.usage is None for c in chunks[:-1])
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 12
    assert chunks[-1].usage.prompt_tokens == 4 and chunks[-1].usage.total_tokens == 16
    assert [c.choices[0].finish_reason for c in chunks[:-1]][-1] == "length"


def test_chat_logprobs_are_the_log_softmax_of_the_model_logits(client, stack, reference):
    model, tokenizer = reference
    response = client.chat.completions.create(
        model=stack.text_model, messages=MESSAGES, max_tokens=4, temperature=0, logprobs=True, top_logprobs=3,
        extra_body={"ignore_eos": True},
    )  # fmt: skip
    prompt_ids = chat_prompt_ids(tokenizer, MESSAGES)
    generated = hf_greedy(model, tokenizer, prompt_ids, 4, min_new_tokens=4)
    with torch.no_grad():
        logits = model(torch.tensor([prompt_ids + generated])).logits[0].double()
    logits[:, default_suppressed_ids(model, tokenizer)] = -math.inf
    expected = torch.log_softmax(logits, dim=-1)
    entries = response.choices[0].logprobs.content
    assert len(entries) == 4
    for step, entry in enumerate(entries):
        row = expected[len(prompt_ids) - 1 + step]
        assert math.isclose(entry.logprob, row[generated[step]].item(), abs_tol=1e-4)
        top = torch.topk(row, 3).values.tolist()
        assert [t.logprob for t in entry.top_logprobs] == pytest.approx(top, abs=1e-4)
        assert entry.top_logprobs[0].logprob == pytest.approx(entry.logprob, abs=1e-6)
        assert entry.bytes == list(entry.token.encode())


def test_completion_logprobs_use_the_legacy_format(client, stack, reference):
    model, _ = reference
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(stack.chat_tokenizer_dir)
    response = client.completions.create(
        model=stack.text_model, prompt=PROMPT, max_tokens=5, temperature=0, logprobs=2, extra_body={"ignore_eos": True}
    )
    logprobs = response.choices[0].logprobs
    prompt_ids = tokenizer(PROMPT).input_ids
    generated = hf_greedy(model, tokenizer, prompt_ids, 5, min_new_tokens=5)
    with torch.no_grad():
        logits = model(torch.tensor([prompt_ids + generated])).logits[0].double()
    logits[:, default_suppressed_ids(model, tokenizer)] = -math.inf
    expected = torch.log_softmax(logits, dim=-1)
    assert len(logprobs.tokens) == len(logprobs.token_logprobs) == len(logprobs.top_logprobs) == 5
    for step, token_logprob in enumerate(logprobs.token_logprobs):
        assert math.isclose(token_logprob, expected[len(prompt_ids) - 1 + step, generated[step]].item(), abs_tol=1e-4)
        assert 1 <= len(logprobs.top_logprobs[step]) <= 2
    offsets = [0]
    for token in logprobs.tokens[:-1]:
        offsets.append(offsets[-1] + len(token))
    assert logprobs.text_offset == offsets


def test_n_choices_are_independent_and_reproducible_with_a_seed(client, stack):
    kwargs = dict(model=stack.text_model, prompt=PROMPT, n=2, max_tokens=10, temperature=1.0, seed=42)
    first = client.completions.create(**kwargs, extra_body={"ignore_eos": True})
    again = client.completions.create(**kwargs, extra_body={"ignore_eos": True})
    assert [c.index for c in first.choices] == [0, 1]
    assert first.choices[0].text != first.choices[1].text
    assert [c.text for c in first.choices] == [c.text for c in again.choices]
    # The two completions share one prompt: its tokens count once.
    assert (first.usage.prompt_tokens, first.usage.completion_tokens) == (4, 20)


def test_stop_strings_cut_the_text_and_finish_with_stop(client, stack):
    kwargs = dict(model=stack.text_model, prompt=PROMPT, max_tokens=40, temperature=1.0, seed=11)
    free = client.completions.create(**kwargs, extra_body={"ignore_eos": True}).choices[0].text
    stop = free[6:11]
    for given in (stop, ["never-appears", stop]):
        cut = client.completions.create(**kwargs, stop=given, extra_body={"ignore_eos": True}).choices[0]
        assert cut.text == free[: free.index(stop)]
        assert cut.finish_reason == "stop"
        assert cut.model_extra["stop_reason"] == stop


def test_max_completion_tokens_ends_chat_with_length(client, stack):
    response = client.chat.completions.create(
        model=stack.text_model, messages=MESSAGES, max_completion_tokens=5, temperature=0.5, seed=1,
        extra_body={"ignore_eos": True},
    )  # fmt: skip
    assert response.choices[0].finish_reason == "length"
    assert response.usage.completion_tokens == 5


def test_logit_bias_can_force_a_token(client, stack, reference):
    _, tokenizer = reference
    token = tokenizer(" fox").input_ids[-1]
    response = client.completions.create(
        model=stack.text_model, prompt=PROMPT, max_tokens=4, temperature=0, logit_bias={str(token): 100},
        extra_body={"ignore_eos": True},
    )  # fmt: skip
    assert response.choices[0].text == tokenizer.decode([token]) * 4


def test_logprobs_cover_the_text_only_not_the_token_that_ended_it(client, stack, reference):
    model, tokenizer = reference
    eos = model.generation_config.eos_token_id
    fox = tokenizer(" fox").input_ids[-1]
    chat = dict(model=stack.text_model, messages=MESSAGES, max_tokens=4, temperature=0, logprobs=True)
    # EOS comes first: no text, so no logprob entries (there used to be one, for EOS).
    ended = client.chat.completions.create(**chat, logit_bias={str(eos): 100})
    assert ended.choices[0].finish_reason == "stop" and ended.choices[0].message.content == ""
    assert ended.choices[0].logprobs.content == []
    chunks = list(client.chat.completions.create(**chat, logit_bias={str(eos): 100}, stream=True))
    assert [e for c in chunks if c.choices and c.choices[0].logprobs for e in c.choices[0].logprobs.content] == []
    # A stop token id ends it the same way; tokens before it keep their entries.
    stopped = client.completions.create(
        model=stack.text_model, prompt=PROMPT, max_tokens=4, temperature=0, logprobs=1, logit_bias={str(fox): 100},
        extra_body={"stop_token_ids": [fox]},
    )  # fmt: skip
    assert stopped.choices[0].text == "" and stopped.choices[0].logprobs.tokens == []
    kept = client.completions.create(
        model=stack.text_model, prompt=PROMPT, max_tokens=3, temperature=0, logprobs=1, logit_bias={str(fox): 100},
        extra_body={"ignore_eos": True},
    )  # fmt: skip
    assert "".join(kept.choices[0].logprobs.tokens) == kept.choices[0].text == tokenizer.decode([fox]) * 3


def test_explicit_sampler_chain_overrides_the_openai_fields(client, stack, reference):
    model, tokenizer = reference
    beams = {"name": "beam_search", "params": {"num_beams": 3, "length_penalty": 1.0, "early_stopping": False}}
    response = client.completions.create(
        model=stack.text_model, prompt=PROMPT, max_tokens=8, temperature=1.5, extra_body={"samplers": [beams]}
    )
    prompt_ids = tokenizer(PROMPT).input_ids
    expected = hf_greedy(model, tokenizer, prompt_ids, 8, num_beams=3, early_stopping=False)
    assert response.choices[0].text == tokenizer.decode(expected, skip_special_tokens=True)


def test_a_list_of_prompts_gives_n_choices_per_prompt_in_order(client, stack):
    prompts = [PROMPT, "Once upon a time"]
    kwargs = dict(model=stack.text_model, max_tokens=6, temperature=0, extra_body={"ignore_eos": True})
    both = client.completions.create(prompt=prompts, n=2, **kwargs)
    alone = [client.completions.create(prompt=p, **kwargs).choices[0].text for p in prompts]
    assert [c.index for c in both.choices] == [0, 1, 2, 3]
    assert [c.text for c in both.choices] == [alone[0], alone[0], alone[1], alone[1]]
    assert both.usage.completion_tokens == 24


def test_echo_puts_the_prompt_before_the_completion(client, stack):
    kwargs = dict(model=stack.text_model, prompt=PROMPT, max_tokens=5, temperature=0)
    plain = client.completions.create(**kwargs).choices[0].text
    echoed = client.completions.create(**kwargs, echo=True).choices[0].text
    assert echoed == PROMPT + plain
    streamed = "".join(c.choices[0].text for c in client.completions.create(**kwargs, echo=True, stream=True))
    assert streamed == PROMPT + plain


def test_models_list_names_the_text_and_image_models(client, stack):
    models = {m.id: m for m in client.models.list()}
    assert models[stack.text_model].kind == "text" and models[stack.text_model].max_model_len == 512
    assert models[stack.image_model].kind == "image"
    assert client.models.retrieve(stack.text_model).id == stack.text_model

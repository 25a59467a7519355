"""The default text model, SmolLM2-135M-Instruct imported from its GGUF by `make default-model`, end to end
through the real tokenizer, lm and gateway processes.

The reference is transformers on the same GGUF file: it loads the dequantized weights, and its greedy
generate() gives the tokens the stack must give for a chat, prompt template included.
"""

from __future__ import annotations

import json

import jsonschema
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from muestra.client import Client
from tests.fixtures.default_model import SOURCE_GGUF, default_model_or_skip
from tests.harness import ServiceProcess

CHATS = {
    "capital": [{"role": "user", "content": "What is the capital of France?"}],
    "haiku": [{"role": "user", "content": "Write a haiku about the sea."}],
    "system": [
        {"role": "system", "content": "You are a concise assistant. Answer in one sentence."},
        {"role": "user", "content": "Why is the sky blue?"},
    ],
}
GREEDY_TOKENS = 24
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 32},
                "unit": {"enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
    },
}


@pytest.fixture(scope="module")
def stack(default_model_stack):
    return default_model_stack


@pytest.fixture(scope="module")
def reference():
    """transformers' model and tokenizer, both read from the GGUF the default model was imported from."""
    default_model_or_skip()
    folder, name = SOURCE_GGUF.parent, SOURCE_GGUF.name
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    return model.eval(), tokenizer


def transformers_greedy(reference, chat: list[dict], steps: int) -> tuple[list[int], list[int]]:
    """(prompt ids, greedy ids) from transformers; the ids end at the first EOS, as muestra's do."""
    model, tokenizer = reference
    prompt = tokenizer.apply_chat_template(chat, add_generation_prompt=True, return_dict=True, return_tensors="pt")
    ids = prompt["input_ids"]
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=steps, do_sample=False)
    generated = out[0, ids.shape[1] :].tolist()
    eos = model.generation_config.eos_token_id
    eos_ids = set(eos if isinstance(eos, list) else [eos])
    ends = [i for i, token in enumerate(generated) if token in eos_ids]
    return ids[0].tolist(), generated[: ends[0] + 1] if ends else generated


def divergence(reference, prompt_ids: list[int], expected: list[int], served: list[int]) -> str:
    """Where the stack's greedy tokens leave transformers', and how near a tie transformers saw there."""
    step = next((i for i, (a, b) in enumerate(zip(expected, served, strict=False)) if a != b), None)
    if step is None:
        return f"transformers gave {len(expected)} tokens, the stack {len(served)}"
    model, _ = reference
    with torch.no_grad():
        logits = model(torch.tensor([prompt_ids + expected[:step]])).logits[0, -1]
    margin = float(logits[expected[step]] - logits[served[step]])
    return f"token {step}: the stack chose {served[step]}, transformers {expected[step]} (by a logit of {margin:.3f})"


@pytest.mark.parametrize("chat", CHATS.values(), ids=CHATS.keys())
def test_greedy_chat_through_the_stack_equals_transformers_on_the_dequantized_gguf(stack, reference, chat):
    prompt_ids, expected = transformers_greedy(reference, chat, GREEDY_TOKENS)
    with Client(stack.gateway.address, timeout=120) as client:
        assert list(client.tokenize(messages=chat).ids) == prompt_ids  # the same chat template and tokenizer
        generation = client.generate(messages=chat, max_tokens=GREEDY_TOKENS, samplers=[{"name": "greedy"}]).wait()
    served = generation.token_ids[0]
    assert served == expected, divergence(reference, prompt_ids, expected, served)


def test_it_knows_the_capital_of_france_through_the_openai_client(stack):
    client = stack.openai()
    model = client.models.list().data[0].id
    reply = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "What is the capital of France?"}],
        max_tokens=32,
        temperature=0,
    )
    assert "Paris" in reply.choices[0].message.content


def test_a_required_tool_call_has_arguments_valid_against_the_tools_parameters(stack):
    client = stack.openai()
    model = client.models.list().data[0].id
    reply = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "What is the weather like in Paris today?"}],
        tools=[WEATHER],
        tool_choice="required",
        parallel_tool_calls=False,
        max_tokens=64,
        temperature=0,
    )
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert [call.function.name for call in choice.message.tool_calls] == ["get_weather"]
    arguments = json.loads(choice.message.tool_calls[0].function.arguments)
    jsonschema.validate(arguments, WEATHER["function"]["parameters"])


GROUNDED = [
    {
        "role": "user",
        "content": "Rewrite this function with type hints and change nothing else.\n\n"
        'def add(a, b):\n    """Return the sum of a and b."""\n    return a + b\n\n'
        'def scale(values, factor):\n    """Return every value times factor."""\n'
        "    return [v * factor for v in values]\n",
    }
]
ALWAYS_DRAFT = {"proposer": "ngram", "params": {"adaptive": False, "min_ngram": 3}}


@pytest.mark.parametrize(
    "sampling",
    [{"samplers": [{"name": "greedy"}]}, {"temperature": 0.7, "top_p": 0.9}, {}],
    ids=["greedy", "temperature-top_p", "generation_config"],
)
def test_speculation_on_the_default_model_gives_the_same_tokens_for_the_same_seed(stack, sampling):
    """Drafts at every step where the prompt lookup finds one, against none: the same tokens, for greedy,
    sampled and the model's own chain. A difference would be a near-tie whose rounding differs between the
    lm's one-position and several-position forwards; none is expected, and one would fail with its place."""
    with Client(stack.gateway.address, timeout=300) as client:
        job = {"messages": GROUNDED, "max_tokens": 64, "seed": 7, **sampling}
        plain = client.generate(**job, speculation="off").wait()
        drafted = client.generate(**job, speculation=ALWAYS_DRAFT).wait()
    done = drafted.completions[0]
    assert done.draft_tokens > 0 and done.accepted_draft_tokens > 0, done
    ours, theirs = drafted.token_ids[0], plain.token_ids[0]
    first = next((i for i, (a, b) in enumerate(zip(ours, theirs, strict=False)) if a != b), None)
    assert ours == theirs, (
        f"speculation changed token {first}: {ours[first : first + 4]} against {theirs[first : first + 4]}"
    )
    assert drafted.texts == plain.texts


@pytest.fixture(scope="module")
def drafting_stack(tmp_path_factory):
    """The default model as "smollm2", and the same folder on a second lm as "smollm2-draft", drafting for it."""
    folder = default_model_or_skip()
    log_dir = tmp_path_factory.mktemp("default-model-draft")
    processes = [ServiceProcess("tokenizer", ["--models", str(folder)], log_dir)]
    try:
        flags = ["--model", str(folder), "--providers", "cpu", "--intra-op-threads", "1"]
        processes += [ServiceProcess("lm", flags, log_dir), ServiceProcess("lm", flags, log_dir)]
        tokenizer = processes[0].address
        models = {
            "smollm2": {"tokenizer": tokenizer, "lm": [processes[1].address]},
            "smollm2-draft": {"tokenizer": tokenizer, "lm": [processes[2].address]},
        }
        config = log_dir / "models.json"
        config.write_text(json.dumps({"text": models}))
        processes.append(ServiceProcess("gateway", ["--models-config", str(config)], log_dir))
        yield processes[-1]
    finally:
        for process in reversed(processes):
            process.stop()


@pytest.mark.parametrize(
    "sampling", [{"samplers": [{"name": "greedy"}]}, {"temperature": 0.7, "top_p": 0.9}], ids=["greedy", "sampled"]
)
def test_a_draft_model_on_the_default_model_gives_the_same_tokens_for_the_same_seed(drafting_stack, sampling):
    """draft_model with the real model and tokenizer: the draft is the same weights on another lm, so a greedy
    row keeps nearly every draft (which holds only if the draft KV followed the row), and the tokens are those
    without drafts."""
    draft = {"proposer": "draft_model", "params": {"model": "smollm2-draft", "adaptive": False}}
    with Client(drafting_stack.address, timeout=300) as client:
        job = {"model": "smollm2", "messages": GROUNDED, "max_tokens": 64, "seed": 7, **sampling}
        plain = client.generate(**job, speculation="off").wait()
        drafted = client.generate(**job, speculation=draft).wait()
    done = drafted.completions[0]
    assert done.draft_tokens > 0 and done.accepted_draft_tokens > 0, done
    if "samplers" in sampling:
        # The draft model does not stop at the end of the text: the last verification may propose up to
        # max_draft_tokens past the target's EOS, and those are dropped.
        assert done.accepted_draft_tokens >= 0.9 * (done.draft_tokens - 16), done
    ours, theirs = drafted.token_ids[0], plain.token_ids[0]
    first = next((i for i, (a, b) in enumerate(zip(ours, theirs, strict=False)) if a != b), None)
    assert ours == theirs, (
        f"speculation changed token {first}: {ours[first : first + 4]} against {theirs[first : first + 4]}"
    )
    assert drafted.texts == plain.texts

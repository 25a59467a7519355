"""with_tool_calling: a ChatML template that ignores tools (SmolLM2's) renders plain chat byte for byte as before,
and tools, tool calls and tool answers the way Qwen2.5's template does (Hermes's format, which the gateway reads)."""

from __future__ import annotations

import json

import pytest
from transformers import AutoTokenizer

from muestra.gateway.engine.tool_calls import parse_tool_calls
from muestra.lm.export.chat_template import with_tool_calling
from muestra.tokenizer.chat import ChatTemplate
from tests.fixtures.tokenizers import (
    CHATML_TEMPLATE,
    FEATURES_TEMPLATE,
    HERMES_TOOLS_TEMPLATE,
    LLAMA3_TEMPLATE,
    train_byte_level_bpe,
)

# SmolLM2-135M-Instruct's tokenizer.chat_template, as its GGUF file holds it (real newlines in the strings).
SMOLLM2_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\n"
    "You are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}{% endif %}"
    "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
SMOLLM2_SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
# ChatML that leans on trim_blocks and lstrip_blocks at its first and last lines: wrapping must not change them.
INDENTED_CHATML_TEMPLATE = (
    "  {% for message in messages %}\n"
    "    {{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' -}}\n"
    "  {% endfor %}\n"
    "  {% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}\n"
)
CHATML_TEMPLATES = {"smollm2": SMOLLM2_TEMPLATE, "chatml": CHATML_TEMPLATE, "indented": INDENTED_CHATML_TEMPLATE}

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city, «today».",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
CLOCK = {"type": "function", "function": {"name": "now", "description": "The time.", "parameters": {"type": "object"}}}
CALLS = [
    {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Málaga"}}},
    {"id": "call_2", "type": "function", "function": {"name": "now", "arguments": {}}},
]
PLAIN_CHATS = {
    "question": [{"role": "user", "content": "¿Qué tiempo hace? 🙂"}],
    "system": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
    "turns": [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello!\nHow can I help?"},
        {"role": "user", "content": "  spaces  "},
    ],
}
TOOL_CHATS = {
    "after calls": [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather in Málaga, and the time?"},
        {"role": "assistant", "content": "", "tool_calls": CALLS},
        {"role": "tool", "tool_call_id": "call_1", "content": '{"sky": "clear", "c": 24}'},
        {"role": "tool", "tool_call_id": "call_2", "content": "12:00"},
        {"role": "assistant", "content": "Clear, 24 °C; it is noon."},
        {"role": "user", "content": "Thanks!"},
    ],
    "text and a call": [
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": "Let me look.", "tool_calls": CALLS[:1]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
    ],
}
TOOLS_SECTION = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
    '{"type": "function", "function": {"name": "get_weather", "description": "The weather in a city, «today».", '
    '"parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}\n'
    "</tools>\n\nFor each function call, return a json object with function name and arguments within "
    '<tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n'
    "</tool_call>"
)


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    """A transformers tokenizer whose vocabulary holds <|im_start|> and <|im_end|>; the templates come per call."""
    return AutoTokenizer.from_pretrained(train_byte_level_bpe(tmp_path_factory.mktemp("chatml") / "bpe"))


def transformers_render(tokenizer, template: str, messages: list[dict], tools=None, add_generation_prompt=True):
    return tokenizer.apply_chat_template(
        messages, tools=tools, chat_template=template, tokenize=False, add_generation_prompt=add_generation_prompt
    )


@pytest.mark.parametrize("add_generation_prompt", [True, False], ids=["prompt", "no prompt"])
@pytest.mark.parametrize("tools", [None, []], ids=["tools None", "tools []"])
@pytest.mark.parametrize("chat", sorted(PLAIN_CHATS))
@pytest.mark.parametrize("name", sorted(CHATML_TEMPLATES))
def test_plain_chat_renders_byte_identical_to_the_original(tokenizer, name, chat, tools, add_generation_prompt):
    original = CHATML_TEMPLATES[name]
    wrapped = with_tool_calling(original)
    assert wrapped != original
    messages = PLAIN_CHATS[chat]
    expected = transformers_render(tokenizer, original, messages, None, add_generation_prompt)
    assert transformers_render(tokenizer, wrapped, messages, tools, add_generation_prompt) == expected


def test_tools_are_listed_in_the_system_turn_after_the_default_system_text(tokenizer):
    text = transformers_render(tokenizer, with_tool_calling(SMOLLM2_TEMPLATE), PLAIN_CHATS["question"], [WEATHER])
    assert text == (
        f"<|im_start|>system\n{SMOLLM2_SYSTEM}\n\n{TOOLS_SECTION}<|im_end|>\n"
        "<|im_start|>user\n¿Qué tiempo hace? 🙂<|im_end|>\n<|im_start|>assistant\n"
    )


def test_tools_follow_a_system_message(tokenizer):
    text = transformers_render(tokenizer, with_tool_calling(SMOLLM2_TEMPLATE), PLAIN_CHATS["system"], [WEATHER])
    assert text == (
        f"<|im_start|>system\nBe brief.\n\n{TOOLS_SECTION}<|im_end|>\n"
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    )


def test_tools_alone_make_the_system_turn_of_a_template_without_default_system_text(tokenizer):
    text = transformers_render(tokenizer, with_tool_calling(CHATML_TEMPLATE), PLAIN_CHATS["question"], [WEATHER])
    assert text == (
        f"<|im_start|>system\n{TOOLS_SECTION}<|im_end|>\n"
        "<|im_start|>user\n¿Qué tiempo hace? 🙂<|im_end|>\n<|im_start|>assistant\n"
    )


def test_tool_calls_render_as_tool_call_blocks_and_answers_as_one_user_turn(tokenizer):
    text = transformers_render(tokenizer, with_tool_calling(SMOLLM2_TEMPLATE), TOOL_CHATS["after calls"])
    assert text == (
        "<|im_start|>system\nBe brief.<|im_end|>\n"
        "<|im_start|>user\nWeather in Málaga, and the time?<|im_end|>\n"
        "<|im_start|>assistant\n"
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Málaga"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "now", "arguments": {}}\n</tool_call><|im_end|>\n'
        "<|im_start|>user\n"
        '<tool_response>\n{"sky": "clear", "c": 24}\n</tool_response>\n'
        "<tool_response>\n12:00\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\nClear, 24 °C; it is noon.<|im_end|>\n"
        "<|im_start|>user\nThanks!<|im_end|>\n"
        "<|im_start|>assistant\n"
    )


def test_text_before_a_call_and_the_default_system_text_stay(tokenizer):
    text = transformers_render(tokenizer, with_tool_calling(SMOLLM2_TEMPLATE), TOOL_CHATS["text and a call"])
    assert text == (
        f"<|im_start|>system\n{SMOLLM2_SYSTEM}<|im_end|>\n"
        "<|im_start|>user\nWeather?<|im_end|>\n"
        "<|im_start|>assistant\nLet me look.\n"
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Málaga"}}\n</tool_call><|im_end|>\n'
        "<|im_start|>user\n<tool_response>\nsunny\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n"
    )


def test_arguments_given_as_json_text_are_written_as_they_are(tokenizer):
    call = {"id": "c", "type": "function", "function": {"name": "now", "arguments": '{"tz": "UTC"}'}}
    messages = [{"role": "user", "content": "Time?"}, {"role": "assistant", "content": "", "tool_calls": [call]}]
    text = transformers_render(tokenizer, with_tool_calling(CHATML_TEMPLATE), messages, [CLOCK], False)
    assert text.endswith('<tool_call>\n{"name": "now", "arguments": {"tz": "UTC"}}\n</tool_call><|im_end|>\n')


def test_rendered_calls_are_what_the_gateway_parses_from_a_reply(tokenizer):
    prompt = transformers_render(tokenizer, with_tool_calling(SMOLLM2_TEMPLATE), TOOL_CHATS["after calls"][:2])
    history = transformers_render(tokenizer, with_tool_calling(SMOLLM2_TEMPLATE), TOOL_CHATS["after calls"][:3], None)
    reply = history[len(prompt) :].removesuffix("<|im_end|>\n<|im_start|>assistant\n")
    content, calls = parse_tool_calls(reply, final=True)
    assert content == ""
    parsed = [(c.name, json.loads(c.arguments), c.complete) for c in calls]
    assert parsed == [(c["function"]["name"], c["function"]["arguments"], True) for c in CALLS]


@pytest.mark.parametrize("tools", [None, [WEATHER], [WEATHER, CLOCK]], ids=["no tools", "one tool", "two tools"])
@pytest.mark.parametrize("chat", sorted({**PLAIN_CHATS, **TOOL_CHATS}))
@pytest.mark.parametrize("name", sorted(CHATML_TEMPLATES))
def test_the_tokenizer_service_renders_the_wrapped_template_as_transformers_does(tokenizer, name, chat, tools):
    wrapped = with_tool_calling(CHATML_TEMPLATES[name])
    messages = {**PLAIN_CHATS, **TOOL_CHATS}[chat]
    special_tokens = {"bos_token": "<|bos|>", "eos_token": "<|eos|>", "pad_token": "<|pad|>"}
    ours = ChatTemplate(wrapped).render(messages, True, special_tokens, tools)
    assert ours == transformers_render(tokenizer, wrapped, messages, tools)


@pytest.mark.parametrize(
    "template",
    [
        HERMES_TOOLS_TEMPLATE,  # renders tools its own way
        LLAMA3_TEMPLATE,  # not ChatML
        FEATURES_TEMPLATE,  # not ChatML
        "{{ bos_token }}" + CHATML_TEMPLATE,  # ChatML behind a special token
        CHATML_TEMPLATE.replace("message['content']", "message['content'] | upper"),  # rewrites the content
        "{% for message in messages %}",  # does not compile
    ],
    ids=["tools", "llama3", "features", "bos", "rewrites", "broken"],
)
def test_a_template_it_cannot_or_need_not_wrap_is_returned_unchanged(template):
    assert with_tool_calling(template) == template

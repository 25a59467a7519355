"""Tool calling over the OpenAI HTTP API with the official `openai` client, against the text fixture's real stack
(its tokenizer with a Hermes-style template that renders tools, HERMES_TOOLS_TEMPLATE).

The text fixture was never trained on tool calls: with tool_choice auto it answers in text, so the calls it
makes are the ones `required` or a named function hold it to. Their arguments must be valid all the same.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import grpc
import jsonschema
import llguidance
import openai
import pydantic
import pytest

from muestra.gateway.engine.tool_calls import CALL_END, CALL_START, SEPARATOR, TRIGGER, tool_call_grammar
from muestra.gateway.http.openai.tools import ToolCallDeltas, message_with_calls
from muestra.v1 import common_pb2, gateway_pb2
from tests.fixtures.structured import TEXT_FIXTURE

MESSAGES = [{"role": "user", "content": "What is the weather in Paris, and what time is it?"}]
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 16},
                "unit": {"enum": ["celsius", "fahrenheit"]},
                "days": {"type": "integer", "minimum": 1, "maximum": 7},
            },
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
    },
}
CLOCK = {"type": "function", "function": {"name": "now", "description": "The time."}}
TIMER = {
    "type": "function",
    "function": {
        "name": "set_timer",
        "parameters": {
            "type": "object",
            "properties": {"minutes": {"type": "number", "exclusiveMinimum": 0, "maximum": 60}},
            "required": ["minutes"],
            "additionalProperties": False,
        },
    },
}
TOOLS = [WEATHER, CLOCK, TIMER]
PARAMETERS = {
    tool["function"]["name"]: tool["function"].get("parameters", {"type": "object", "additionalProperties": False})
    for tool in TOOLS
}
N = 4


class GetWeather(pydantic.BaseModel):
    """The weather in a city."""

    city: str = pydantic.Field(max_length=16)
    unit: str


@pytest.fixture(scope="module")
def stack(text_fixture_tools_stack):
    return text_fixture_tools_stack


@pytest.fixture(scope="module")
def client(stack):
    with stack.client() as c:
        yield c


def ask(client, stack, stream: bool, **kwargs) -> list[dict]:
    """Each choice as {content, tool_calls: [(id, name, arguments)], finish_reason}, streamed or not."""
    common = {"model": stack.model, "messages": MESSAGES, "max_tokens": 100, "n": N, "seed": 11, **kwargs}
    if not stream:
        reply = client.chat.completions.create(**common)
        return [
            {
                "content": c.message.content,
                "tool_calls": [
                    (t.id, t.type, t.function.name, t.function.arguments) for t in c.message.tool_calls or ()
                ],
                "finish_reason": c.finish_reason,
            }
            for c in sorted(reply.choices, key=lambda c: c.index)
        ]
    choices = [{"content": None, "calls": {}, "finish_reason": None} for _ in range(N)]
    for chunk in client.chat.completions.create(stream=True, **common):
        for c in chunk.choices:
            into = choices[c.index]
            if c.delta.content:
                into["content"] = (into["content"] or "") + c.delta.content
            for delta in c.delta.tool_calls or ():
                if delta.index not in into["calls"]:  # a call's first delta names it
                    assert delta.id and delta.type == "function" and delta.function.name
                    into["calls"][delta.index] = [delta.id, delta.type, delta.function.name, ""]
                else:
                    assert delta.id is None and delta.function.name is None
                into["calls"][delta.index][3] += delta.function.arguments or ""
            into["finish_reason"] = c.finish_reason or into["finish_reason"]
    return [
        {
            "content": c["content"],
            "tool_calls": [tuple(c["calls"][i]) for i in sorted(c["calls"])],
            "finish_reason": c["finish_reason"],
        }
        for c in choices
    ]


def assert_valid_calls(choice: dict, names: set[str]) -> None:
    assert choice["finish_reason"] == "tool_calls", choice
    assert choice["tool_calls"], choice
    for call_id, kind, name, arguments in choice["tool_calls"]:
        assert call_id.startswith("call_") and kind == "function"
        assert name in names
        jsonschema.validate(json.loads(arguments), PARAMETERS[name])


@pytest.mark.parametrize("stream", [False, True])
def test_required_gives_one_valid_call(client, stack, stream):
    for choice in ask(client, stack, stream, tools=TOOLS, tool_choice="required", parallel_tool_calls=False):
        assert_valid_calls(choice, {"get_weather", "now", "set_timer"})
        assert len(choice["tool_calls"]) == 1
        assert choice["content"] is None


@pytest.mark.parametrize("stream", [False, True])
def test_a_named_function_is_the_one_called(client, stack, stream):
    named = {"type": "function", "function": {"name": "set_timer"}}
    for choice in ask(client, stack, stream, tools=TOOLS, tool_choice=named, parallel_tool_calls=False):
        assert_valid_calls(choice, {"set_timer"})
        assert len(choice["tool_calls"]) == 1


@pytest.mark.parametrize("stream", [False, True])
def test_parallel_calls_are_each_valid(client, stack, stream):
    """With parallel_tool_calls (OpenAI's default) the model may call again after each call; the untrained model
    often does until max_tokens, so only the choices that ended on their own are checked whole."""
    choices = ask(client, stack, stream, tools=TOOLS, tool_choice="required", temperature=0.7)
    for choice in choices:
        assert choice["tool_calls"]
        if choice["finish_reason"] == "tool_calls":
            assert_valid_calls(choice, {"get_weather", "now", "set_timer"})
        else:
            assert choice["finish_reason"] == "length"
            for _, _, name, arguments in choice["tool_calls"][:-1]:  # all but a last one cut short
                jsonschema.validate(json.loads(arguments), PARAMETERS[name])


def cut_answer(client, stack, stream: bool, max_tokens: int) -> tuple[str | None, list, str, dict | None]:
    """A required call cut by max_tokens: (content, [(name, arguments)], finish_reason, incomplete_tool_call)."""
    common = {"model": stack.model, "messages": MESSAGES, "max_tokens": max_tokens, "seed": 5}
    common |= {"tools": TOOLS, "tool_choice": "required", "parallel_tool_calls": False}
    if not stream:
        choice = client.chat.completions.create(**common).choices[0]
        calls = [(t.function.name, t.function.arguments) for t in choice.message.tool_calls or ()]
        incomplete = (choice.message.model_extra or {}).get("incomplete_tool_call")
        return choice.message.content, calls, choice.finish_reason, incomplete
    content, calls, finish, incomplete = None, {}, None, None
    for chunk in client.chat.completions.create(stream=True, **common):
        for c in chunk.choices:
            if c.delta.content:
                content = (content or "") + c.delta.content
            for delta in c.delta.tool_calls or ():
                calls.setdefault(delta.index, [delta.function.name, ""])[1] += delta.function.arguments or ""
            incomplete = (c.delta.model_extra or {}).get("incomplete_tool_call", incomplete)
            finish = c.finish_reason or finish
    return content, [tuple(calls[i]) for i in sorted(calls)], finish, incomplete


@pytest.mark.parametrize("stream", [False, True])
def test_a_call_cut_by_max_tokens_is_not_content_and_is_named_as_cut(client, stack, stream):
    for max_tokens in range(2, 21):
        content, calls, finish, incomplete = cut_answer(client, stack, stream, max_tokens)
        at = f"max_tokens={max_tokens}: {content!r} {calls} {finish} {incomplete}"
        assert not content, at  # never the call's markup
        if finish == "tool_calls":  # the whole call fitted
            assert len(calls) == 1 and incomplete is None, at
            continue
        assert finish == "length", at
        # The cut call as written; in tool_calls (its arguments cut short) once its name was written whole.
        cut = incomplete["text"]
        assert cut and (CALL_START.startswith(cut) or cut.startswith(CALL_START)), at
        if calls:
            ((name, arguments),) = calls
            assert incomplete["index"] == 0 and f'"name": "{name}"' in cut and cut.endswith(arguments), at
        else:
            assert incomplete["index"] == 0 and '"arguments": ' not in cut, at


def test_streamed_calls_equal_the_whole_answer_but_for_ids(client, stack):
    def without_ids(choices):
        return [{**c, "tool_calls": [call[1:] for call in c["tool_calls"]]} for c in choices]

    for tool_choice in ("required", "auto"):
        kwargs = {"tools": TOOLS, "tool_choice": tool_choice, "temperature": 1.0}
        assert without_ids(ask(client, stack, True, **kwargs)) == without_ids(ask(client, stack, False, **kwargs))


def test_parse_with_a_pydantic_tool(client, stack):
    completion = client.chat.completions.parse(
        model=stack.model,
        messages=MESSAGES,
        tools=[openai.pydantic_function_tool(GetWeather)],
        tool_choice="required",
        parallel_tool_calls=False,
        temperature=0,
        max_tokens=100,
    )
    call = completion.choices[0].message.tool_calls[0]
    assert completion.choices[0].finish_reason == "tool_calls"
    assert call.function.name == "GetWeather"
    assert isinstance(call.function.parsed_arguments, GetWeather)


def test_stream_helper_assembles_the_call(client, stack):
    with client.chat.completions.stream(
        model=stack.model, messages=MESSAGES, tools=[WEATHER], tool_choice="required", parallel_tool_calls=False,
        seed=3, max_tokens=100,
    ) as stream:  # fmt: skip
        done = [event for event in stream if event.type == "tool_calls.function.arguments.done"]
        final = stream.get_final_completion()
    assert [event.name for event in done] == ["get_weather"]
    call = final.choices[0].message.tool_calls[0]
    assert call.function.arguments == done[0].arguments
    jsonschema.validate(json.loads(call.function.arguments), PARAMETERS["get_weather"])


@pytest.mark.parametrize("stream", [False, True])
def test_none_never_calls(client, stack, stream):
    for choice in ask(client, stack, stream, tools=TOOLS, tool_choice="none", temperature=1.2):
        assert choice["tool_calls"] == [] and choice["finish_reason"] in ("stop", "length")


def test_none_returns_call_shaped_text_as_content(client, stack):
    """Text in the call format is still content under `none`: a regex makes the model write one."""
    call = CALL_START + '{"name": "now", "arguments": {}}' + CALL_END
    reply = client.chat.completions.create(
        model=stack.model, messages=MESSAGES, tools=TOOLS, tool_choice="none", max_tokens=60,
        extra_body={"guided_regex": call.replace("{", r"\{").replace("}", r"\}")},
    )  # fmt: skip
    choice = reply.choices[0]
    assert (choice.message.content, choice.message.tool_calls, choice.finish_reason) == (call, None, "stop")


@pytest.mark.parametrize("stream", [False, True])
def test_auto_answers_in_text_or_with_a_valid_call(client, stack, stream):
    for choice in ask(client, stack, stream, tools=TOOLS, tool_choice="auto", temperature=1.0):
        if choice["tool_calls"] and choice["finish_reason"] == "tool_calls":
            assert_valid_calls(choice, {"get_weather", "now", "set_timer"})
        else:
            assert choice["finish_reason"] in ("stop", "length")
            assert TRIGGER not in (choice["content"] or "") or choice["finish_reason"] == "length"


def test_auto_text_is_free_text(client, stack):
    """Until a call starts, auto allows every token valid text can hold: greedy writes what it writes unconstrained."""

    def greedy(**kwargs) -> tuple[str, str]:
        reply = client.chat.completions.create(
            model=stack.model, messages=MESSAGES, tools=TOOLS, temperature=0, max_tokens=120, **kwargs
        )
        return reply.choices[0].message.content, reply.choices[0].finish_reason

    assert greedy(tool_choice="auto") == greedy(tool_choice="none")


def test_tools_reach_the_chat_template(client, stack):
    def prompt_tokens(**kwargs) -> int:
        reply = client.chat.completions.create(model=stack.model, messages=MESSAGES, max_tokens=1, **kwargs)
        return reply.usage.prompt_tokens

    bare = prompt_tokens()
    assert prompt_tokens(tools=[CLOCK], tool_choice="none") > bare
    assert prompt_tokens(tools=TOOLS, tool_choice="none") > prompt_tokens(tools=[CLOCK], tool_choice="none")
    assert prompt_tokens(tools=TOOLS) == prompt_tokens(tools=TOOLS, tool_choice="none")


def test_earlier_calls_and_answers_reach_the_template(client, stack):
    arguments = '{"city": "Lima", "unit": "celsius"}'
    history = [
        *MESSAGES,
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_a", "type": "function", "function": {"name": "get_weather", "arguments": arguments}}]},
        {"role": "tool", "tool_call_id": "call_a", "content": "24 °C, clear"},
    ]  # fmt: skip
    reply = client.chat.completions.create(model=stack.model, messages=history, tools=TOOLS, max_tokens=1)
    shorter = client.chat.completions.create(model=stack.model, messages=history[:2], tools=TOOLS, max_tokens=1)
    assert reply.usage.prompt_tokens > shorter.usage.prompt_tokens > 0


# -- the format's grammar and reader, on the text fixture's tokenizer ------------------------------------


@pytest.fixture(scope="module")
def tokenizer():
    return llguidance.LLTokenizer((TEXT_FIXTURE / "tokenizer.json").read_text())


def accepts(tokenizer, grammar: str, text: str) -> tuple[bool, bool]:
    """(every token of `text` allowed, the grammar finished) for `text` fed token by token."""
    matcher = llguidance.LLMatcher(tokenizer, llguidance.LLMatcher.grammar_from_lark(grammar), log_level=0)
    assert not matcher.is_error(), matcher.get_error()
    ok = all(matcher.consume_token(token) for token in tokenizer.tokenize_str(text))
    return ok, matcher.is_stopped()


def call_text(name: str, arguments: dict) -> str:
    return CALL_START + json.dumps({"name": name, "arguments": arguments}) + CALL_END


def test_auto_grammar_frees_text_until_a_call_starts(tokenizer):
    grammar = tool_call_grammar(TOOLS, required=False, parallel=False)
    good = call_text("get_weather", {"city": "Lima", "unit": "celsius"})
    assert accepts(tokenizer, grammar, "Any text at all, <tool> or <tool_cal, is free.\n") == (True, False)
    assert accepts(tokenizer, grammar, "Let me look. " + good) == (True, True)
    assert accepts(tokenizer, grammar, good) == (True, True)
    for bad in (
        call_text("get_weather", {"city": "Lima"}),  # a required argument missing
        call_text("get_weather", {"city": "Lima", "unit": "kelvin"}),
        call_text("delete_everything", {}),
        TRIGGER + " and then some prose",
    ):
        assert accepts(tokenizer, grammar, "Sure. " + bad)[0] is False, bad


def test_required_grammar_allows_calls_only(tokenizer):
    one = call_text("now", {})
    two = one + SEPARATOR + call_text("set_timer", {"minutes": 5})
    assert accepts(tokenizer, tool_call_grammar(TOOLS, required=True, parallel=False), one) == (True, True)
    assert accepts(tokenizer, tool_call_grammar(TOOLS, required=True, parallel=False), two)[0] is False
    assert accepts(tokenizer, tool_call_grammar(TOOLS, required=True, parallel=True), two)[0] is True
    assert accepts(tokenizer, tool_call_grammar(TOOLS, required=True, parallel=True), "Hi. " + one)[0] is False


def test_stream_deltas_add_up_to_the_whole_message():
    text = "Checking.\n" + call_text("get_weather", {"city": "Lima", "unit": "celsius"}) + SEPARATOR
    text += call_text("set_timer", {"minutes": 2.5})
    for cut in (len(text), len(text) - 5, len(text) - 40):  # whole, and cut short as max_tokens would
        deltas = ToolCallDeltas()
        pieces = [deltas.delta(ch) for ch in text[:cut]] + [deltas.delta("", final=True)]
        content = "".join(p.get("content", "") for p in pieces)
        calls: dict[int, list[str]] = {}
        for p in pieces:
            for call in p.get("tool_calls", ()):
                calls.setdefault(call["index"], [call["function"].get("name"), ""])[1] += call["function"]["arguments"]
        whole = message_with_calls(text[:cut])
        assert content == (whole["content"] or "")
        assert [tuple(c) for c in calls.values()] == [
            (c["function"]["name"], c["function"]["arguments"]) for c in whole["tool_calls"]
        ]


# -- bad input ------------------------------------------------------------------------------------------

BAD = [
    ({"tools": [WEATHER, {"type": "function", "function": {"name": "f", "parameters": {"type": "nope"}}}]},
     "tools[1].function.parameters"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"$ref": "#/missing"}}}]},
     "tools[0].function.parameters"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "string", "pattern": "("}}}]},
     "tools[0].function.parameters"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": "object"}}]},
     "tools[0].function.parameters"),
    ({"tools": [{"type": "function", "function": {"name": "has space"}}]}, "tools[0].function.name"),
    ({"tools": [CLOCK, CLOCK]}, "tools[1].function.name"),
    ({"tools": [{"type": "retrieval", "function": {"name": "f"}}]}, "tools[0].type"),
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "missing"}}},
     "tool_choice.function.name"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"tools": TOOLS, "tool_choice": "sometimes"}, "tool_choice"),
    ({"tools": TOOLS, "response_format": {"type": "json_object"}}, "response_format"),
    ({"tools": TOOLS, "tool_choice": "required", "guided_regex": "a"}, "guided_regex"),
    ({"functions": [{"name": "f"}]}, "functions"),
]  # fmt: skip


def test_bad_tools_are_400_naming_the_field_while_a_stream_runs(client, stack):
    kwargs = {"model": stack.model, "messages": MESSAGES, "tools": TOOLS, "tool_choice": "required", "seed": 4}
    alone = client.chat.completions.create(max_tokens=100, **kwargs).choices[0].message.tool_calls
    stream = iter(client.chat.completions.create(stream=True, max_tokens=100, **kwargs))
    next(stream)
    for extra, param in BAD:
        with pytest.raises(openai.BadRequestError) as error:
            client.chat.completions.create(model=stack.model, messages=MESSAGES, max_tokens=4, extra_body=extra)
        assert error.value.status_code == 400
        assert error.value.param == param, error.value.message
        assert error.value.body["message"].startswith(param), error.value.message
    arguments = [""] * len(alone)
    for chunk in stream:
        for delta in chunk.choices[0].delta.tool_calls or ():
            arguments[delta.index] += delta.function.arguments or ""
    assert arguments == [call.function.arguments for call in alone]


def grpc_request(tools_json: str, **fields) -> gateway_pb2.GenerateRequest:
    if "prompt" not in fields:
        fields["messages"] = common_pb2.ChatMessages(messages=[common_pb2.ChatMessage(**MESSAGES[0])])
    return gateway_pb2.GenerateRequest(max_tokens=2, tools_json=tools_json, **fields)


@pytest.mark.parametrize(
    ("tools_json", "fields", "field"),
    [
        (json.dumps([WEATHER, {"type": "function", "function": {"name": "f", "parameters": {"type": "nope"}}}]), {},
         "tools_json[1].function.parameters"),
        ("[{", {}, "tools_json"),
        (json.dumps({"type": "function"}), {}, "tools_json"),
        (json.dumps([CLOCK]), {"prompt": "Hola"}, "tools_json"),
        (json.dumps([{**CLOCK, "description": "x" * 300_000}]), {}, "tools_json"),  # over --max-prompt-bytes
    ],
)  # fmt: skip
def test_grpc_bad_tools_json_is_invalid_argument(stack, tools_json, fields, field):
    with pytest.raises(grpc.RpcError) as error:
        list(stack.stub.Generate(grpc_request(tools_json, **fields)))
    assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error.value.details().startswith(f"{field}: "), error.value.details()


def test_grpc_tools_reach_the_template(stack):
    def prompt_tokens(tools_json: str) -> int:
        done = [m.done for m in stack.stub.Generate(grpc_request(tools_json)) if m.HasField("done")]
        return done[-1].usage.prompt_tokens

    assert prompt_tokens(json.dumps(TOOLS)) > prompt_tokens("")


# -- docs/openai.md -------------------------------------------------------------------------------------

DOC = Path(__file__).resolve().parents[2] / "docs" / "openai.md"


@pytest.mark.parametrize("section", ["## Structured outputs", "## Tools"])
def test_the_docs_examples_run(stack, section):
    text = DOC.read_text()
    start = text.index(f"\n{section}\n")
    body = text[start : text.index("\n## ", start + 1)]
    examples = re.findall(r"```python\n(.*?)```", body, re.S)
    assert examples
    for code in examples:
        code = code.replace("http://127.0.0.1:8000/v1", stack.base_url)
        run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
        assert run.returncode == 0, run.stderr[-3000:]

"""ApplyChatTemplate with tools: the template sees `tools`, an assistant's `tool_calls` and a tool turn's
`tool_call_id` exactly as transformers' apply_chat_template(..., tools=...) passes them."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import grpc
import pytest
from transformers import AutoTokenizer

from muestra.v1 import common_pb2, tokenizer_pb2, tokenizer_pb2_grpc
from tests.fixtures.tokenizers import HERMES_TOOLS_TEMPLATE
from tests.harness import ServiceProcess

TEXT_FIXTURE = Path(__file__).resolve().parents[2] / "models" / "tiny-text-fixture"

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city, «today».",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "unit": {"enum": ["celsius", "fahrenheit"]}},
            "required": ["city"],
        },
    },
}
CLOCK = {"type": "function", "function": {"name": "now", "description": "The time.", "parameters": {"type": "object"}}}
CALLS = [
    {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Málaga"}}},
    {"id": "call_2", "type": "function", "function": {"name": "now", "arguments": {}}},
]
CONVERSATIONS = {
    "question": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "¿Qué tiempo hace?"}],
    "after calls": [
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


@pytest.fixture(scope="module")
def tools_folder(tmp_path_factory) -> Path:
    """The text fixture's tokenizer with a Hermes-style template that renders tools."""
    folder = tmp_path_factory.mktemp("tools-tokenizer") / "hermes"
    folder.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        shutil.copy(TEXT_FIXTURE / name, folder / name)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    (folder / "chat_template.jinja").write_text(HERMES_TOOLS_TEMPLATE)
    return folder


@pytest.fixture(scope="module")
def stub(tools_folder, tmp_path_factory):
    service = ServiceProcess("tokenizer", ["--models", str(tools_folder)], tmp_path_factory.mktemp("tools-logs"))
    with grpc.insecure_channel(service.address) as channel:
        yield tokenizer_pb2_grpc.TokenizerStub(channel)
    service.stop()


def chat_message(message: dict) -> common_pb2.ChatMessage:
    return common_pb2.ChatMessage(
        role=message["role"],
        content=message["content"],
        tool_calls_json=json.dumps(message["tool_calls"]) if "tool_calls" in message else "",
        tool_call_id=message.get("tool_call_id", ""),
    )


def render(stub, messages: list[dict], tools: list | None, **fields) -> tokenizer_pb2.ApplyChatTemplateResponse:
    return stub.ApplyChatTemplate(
        tokenizer_pb2.ApplyChatTemplateRequest(
            messages=[chat_message(m) for m in messages],
            add_generation_prompt=True,
            tokenize=True,
            tools_json=json.dumps(tools) if tools is not None else "",
            **fields,
        )
    )


@pytest.mark.parametrize("conversation", sorted(CONVERSATIONS))
@pytest.mark.parametrize("tools", [None, [WEATHER], [WEATHER, CLOCK]], ids=["no tools", "one tool", "two tools"])
def test_tools_in_the_template_equal_transformers(stub, tools_folder, conversation, tools):
    reference = AutoTokenizer.from_pretrained(tools_folder)
    messages = CONVERSATIONS[conversation]
    expected = reference.apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=True)
    reply = render(stub, messages, tools)
    assert reply.text == expected
    expected_ids = reference.apply_chat_template(
        messages, tools=tools, tokenize=True, return_dict=False, add_generation_prompt=True
    )
    assert list(reply.ids) == list(expected_ids)


def test_tools_reach_the_template(stub):
    with_tools = render(stub, CONVERSATIONS["question"], [WEATHER]).text
    assert '"name": "get_weather"' in with_tools and "<tools>" in with_tools
    assert "<tools>" not in render(stub, CONVERSATIONS["question"], None).text


@pytest.mark.parametrize(
    ("fields", "messages", "field"),
    [
        ({"tools_json": "[{"}, CONVERSATIONS["question"], "tools_json"),
        ({"tools_json": '{"type": "function"}'}, CONVERSATIONS["question"], "tools_json"),
        ({}, [{"role": "assistant", "content": "", "tool_calls_json": "nope"}], "messages[0].tool_calls_json"),
        ({}, [{"role": "assistant", "content": "", "tool_calls_json": '"x"'}], "messages[0].tool_calls_json"),
    ],
)  # fmt: skip
def test_bad_tool_json_is_invalid_argument_naming_the_field(stub, fields, messages, field):
    request = tokenizer_pb2.ApplyChatTemplateRequest(
        messages=[common_pb2.ChatMessage(**m) for m in messages], add_generation_prompt=True, **fields
    )
    with pytest.raises(grpc.RpcError) as error:
        stub.ApplyChatTemplate(request)
    assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error.value.details().startswith(f"{field}: "), error.value.details()

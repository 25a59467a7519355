"""The Responses API's pieces: the in-process store (TTL, bound, owners), items as chat messages, chat deltas as
events; and, through the real stack without Redis (the tiny llama), a conversation kept in process and a stream
the client leaves."""

from __future__ import annotations

import asyncio
import json
import time

import httpx2 as httpx
import openai
import pytest

from muestra.gateway.http.openai.response_items import chat_messages, responses_param
from muestra.gateway.http.openai.response_routes import EventStream
from muestra.gateway.http.openai.response_store import MemoryStore, owner_of


def test_the_memory_store_keeps_each_owners_records_for_the_ttl_and_the_latest_only():
    async def scenario():
        store = MemoryStore(ttl_s=0.3, max_records=3)
        one, two = owner_of("key-one"), owner_of("key-two")
        assert one != two and owner_of(None) == owner_of("") == "-"
        await store.put(one, "resp_a", {"n": 1})
        assert await store.get(one, "resp_a") == {"n": 1}
        assert await store.get(two, "resp_a") is None
        assert not await store.delete(two, "resp_a")
        for name in ("resp_b", "resp_c", "resp_d"):
            await store.put(one, name, {"n": name})
        assert await store.get(one, "resp_a") is None  # the oldest went first
        assert await store.get(one, "resp_d") == {"n": "resp_d"}
        time.sleep(0.35)
        assert await store.get(one, "resp_d") is None
        await store.put(one, "resp_e", {})
        assert await store.delete(one, "resp_e") and await store.get(one, "resp_e") is None

    asyncio.run(scenario())


def test_the_memory_store_drops_the_oldest_past_its_bytes():
    async def scenario():
        store = MemoryStore(ttl_s=60, max_records=100, max_bytes=1000)
        for i in range(5):
            await store.put("-", f"resp_{i}", {"text": "x" * 300})
        kept = [i for i in range(5) if await store.get("-", f"resp_{i}") is not None]
        assert kept == [2, 3, 4] and store.nbytes <= 1000
        await store.put("-", "resp_4", {"text": "y"})  # a record written again counts once
        assert await store.get("-", "resp_4") == {"text": "y"}
        assert store.nbytes == sum(len(text) for _, text in store.records.values())
        await store.put("-", "resp_big", {"text": "z" * 5000})  # larger than the whole bound: not kept
        assert await store.get("-", "resp_big") is None and store.nbytes <= 1000

    asyncio.run(scenario())


def test_function_calls_join_the_assistant_message_before_them_and_outputs_are_tool_messages():
    conversation = [
        {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "Be brief."}]},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": t} for t in "ab"]},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Checking."}]},
        {"type": "function_call", "call_id": "call_1", "name": "f", "arguments": "{}"},
        {"type": "function_call", "call_id": "call_2", "name": "g", "arguments": "{\"x\": 1}"},
        {"type": "function_call_output", "call_id": "call_1", "output": "one"},
        {"type": "function_call_output", "call_id": "call_2", "output": "two"},
        {"type": "function_call", "call_id": "call_3", "name": "f", "arguments": "{}"},
    ]  # fmt: skip
    messages = chat_messages("Instructions.", conversation)
    assert messages[0] == {"role": "system", "content": "Instructions."}
    assert messages[1] == {"role": "system", "content": "Be brief."}
    assert messages[2] == {"role": "user", "content": "a\nb"}
    assert messages[3]["content"] == "Checking." and [c["id"] for c in messages[3]["tool_calls"]] == [
        "call_1",
        "call_2",
    ]
    assert messages[4:6] == [
        {"role": "tool", "tool_call_id": "call_1", "content": "one"},
        {"role": "tool", "tool_call_id": "call_2", "content": "two"},
    ]
    assert messages[6]["role"] == "assistant" and messages[6]["content"] is None
    assert messages[6]["tool_calls"][0]["function"] == {"name": "f", "arguments": "{}"}


@pytest.mark.parametrize(
    "chat, ours",
    [
        ("max_completion_tokens", "max_output_tokens"),
        ("response_format.json_schema.schema", "text.format.schema"),
        ("response_format.type", "text.format.type"),
        ("messages[3].content", "input"),
        ("tools[1].function.parameters", "tools[1].parameters"),
        ("tool_choice.function.name", "tool_choice.name"),
        ("temperature", "temperature"),
    ],
)
def test_chat_parameters_are_named_as_the_responses_api_names_them(chat, ours):
    assert responses_param(chat) == ours


def events_of(lines: list[str]) -> list[dict]:
    return [json.loads(line.split("data: ", 1)[1]) for line in lines]


def test_deltas_become_numbered_item_events_that_add_up_to_the_items():
    stream = EventStream()
    sent = []
    sent += stream.delta({"content": "Let me "})
    sent += stream.delta({"content": "check."})
    sent += stream.delta({"tool_calls": [{"index": 0, "id": "call_1", "function": {"name": "f", "arguments": '{"a"'}}]})
    sent += stream.delta({"tool_calls": [{"index": 0, "function": {"arguments": ": 1}"}}]})
    sent += stream.delta({"tool_calls": [{"index": 1, "id": "call_2", "function": {"name": "g", "arguments": "{}"}}]})
    sent += stream.close()
    events = events_of(sent)
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert [e["type"] for e in events] == [
        "response.output_item.added", "response.content_part.added", "response.output_text.delta",
        "response.output_text.delta", "response.output_text.done", "response.content_part.done",
        "response.output_item.done", "response.output_item.added", "response.function_call_arguments.delta",
        "response.function_call_arguments.delta", "response.function_call_arguments.done", "response.output_item.done",
        "response.output_item.added", "response.function_call_arguments.delta",
        "response.function_call_arguments.done", "response.output_item.done",
    ]  # fmt: skip
    message, first, second = stream.items
    assert message["content"][0]["text"] == "Let me check." and message["status"] == "completed"
    assert (first["call_id"], first["arguments"]) == ("call_1", '{"a": 1}')
    assert (second["call_id"], second["name"], second["arguments"]) == ("call_2", "g", "{}")
    added = [e for e in events if e["type"] == "response.output_item.added"]
    assert [e["output_index"] for e in added] == [0, 1, 2]
    assert added[1]["item"]["arguments"] == "" and added[1]["item"]["status"] == "in_progress"


def test_without_redis_a_conversation_is_kept_in_process(openai_stack):
    with openai_stack.client(max_retries=0, timeout=60) as client:
        first = client.responses.create(
            model=openai_stack.text_model, input="one two three", temperature=0, max_output_tokens=12
        )
        second = client.responses.create(
            model=openai_stack.text_model, input="four", previous_response_id=first.id, temperature=0,
            max_output_tokens=12,
        )  # fmt: skip
        assert client.responses.retrieve(second.id).previous_response_id == first.id
        assert len(client.responses.input_items.list(second.id).data) == 3
        assert second.usage.input_tokens > first.usage.input_tokens + first.usage.output_tokens


def test_a_client_that_leaves_a_stream_frees_its_row(openai_stack):
    assert openai_stack.lm_rows() == 0
    body = {"model": openai_stack.text_model, "input": "go", "stream": True, "max_output_tokens": 400,
            "ignore_eos": True, "temperature": 0.8}  # fmt: skip
    headers = {"Authorization": f"Bearer {openai_stack.api_key}"}
    with httpx.stream("POST", openai_stack.base_url + "/responses", json=body, headers=headers, timeout=60) as reply:
        assert reply.status_code == 200
        for line in reply.iter_lines():
            if '"response.output_text.delta"' in line:
                break
    deadline = time.monotonic() + 10
    while openai_stack.lm_rows() > 0:
        assert time.monotonic() < deadline, "the lm kept the row of a stream its client left"
        time.sleep(0.02)
    with openai.OpenAI(base_url=openai_stack.base_url, api_key=openai_stack.api_key, max_retries=0) as client:
        assert client.responses.create(model=openai_stack.text_model, input="still here", max_output_tokens=4).output

"""The Responses API through the official openai client, against a real stack on the default model: a gateway with
two API keys, Redis, a tokenizer and an lm.

Stored conversations continue with previous_response_id from the prefix cache and give the tokens of chat
completions sent the whole history; a stored response is another key's 404, survives a gateway restart (Redis)
and expires with its TTL."""

from __future__ import annotations

import json
import time

import httpx2 as httpx
import jsonschema
import openai
import pytest
import redis

from bench.stack import LocalStack
from tests.fixtures.default_model import default_model_or_skip

KEYS = ("key-one", "key-two")
WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "The current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}
PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 20}, "age": {"type": "integer", "minimum": 0}},
    "required": ["name", "age"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    folder = default_model_or_skip()
    stack = LocalStack(
        tmp_path_factory.mktemp("responses"), text_model=folder, image_model=None,
        gateway_args=("--api-keys", ",".join(KEYS)),
    )  # fmt: skip
    yield stack
    stack.close()


@pytest.fixture(scope="module")
def client(stack):
    with openai.OpenAI(base_url=stack.base_url, api_key=KEYS[0], max_retries=0, timeout=120) as client:
        yield client


@pytest.fixture(scope="module")
def other(stack):
    with openai.OpenAI(base_url=stack.base_url, api_key=KEYS[1], max_retries=0, timeout=120) as client:
        yield client


@pytest.fixture(scope="module")
def model(client) -> str:
    return client.models.list().data[0].id


def test_a_string_and_a_list_of_items_give_a_stored_response(client, model):
    plain = client.responses.create(model=model, input="What is the capital of France?", temperature=0)
    assert plain.id.startswith("resp_") and plain.object == "response" and plain.status == "completed"
    assert plain.model == model and plain.store is True
    assert "Paris" in plain.output_text
    [message] = plain.output
    assert message.type == "message" and message.role == "assistant" and message.status == "completed"
    assert message.content[0].type == "output_text" and message.content[0].text == plain.output_text
    assert plain.usage.input_tokens > 0 and plain.usage.output_tokens > 0
    assert plain.usage.total_tokens == plain.usage.input_tokens + plain.usage.output_tokens

    items = client.responses.create(
        model=model, temperature=0, instructions="Answer in one short sentence.",
        input=[{"role": "user", "content": [{"type": "input_text", "text": "What is the capital of France?"}]}],
    )  # fmt: skip
    assert items.status == "completed" and items.instructions == "Answer in one short sentence."
    # The same conversation as a chat completion: the same answer.
    chat = client.chat.completions.create(
        model=model, temperature=0,
        messages=[{"role": "system", "content": "Answer in one short sentence."},
                  {"role": "user", "content": "What is the capital of France?"}],
    )  # fmt: skip
    assert items.output_text == chat.choices[0].message.content
    assert items.usage.input_tokens == chat.usage.prompt_tokens

    stored = client.responses.retrieve(items.id)
    assert stored.model_dump() == items.model_dump()
    listed = client.responses.input_items.list(items.id, order="asc")
    assert [item.type for item in listed.data] == ["message"]
    assert listed.data[0].content[0].text == "What is the capital of France?"
    client.responses.delete(items.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(items.id)


def test_a_stream_ends_in_the_response_the_same_seed_gives_whole(client, model):
    asked = dict(model=model, input="Say hello to the sea in one sentence.", temperature=0.8, max_output_tokens=300)
    whole = client.responses.create(**asked, extra_body={"seed": 11})
    assert whole.status == "completed", whole.usage
    kinds, numbers, deltas = [], [], []
    with client.responses.stream(**asked, extra_body={"seed": 11}) as stream:
        for event in stream:
            kinds.append(event.type)
            numbers.append(event.sequence_number)
            if event.type == "response.output_text.delta":
                deltas.append(event.delta)
        final = stream.get_final_response()
    assert numbers == list(range(len(numbers)))
    assert kinds[:4] == [
        "response.created", "response.in_progress", "response.output_item.added", "response.content_part.added",
    ]  # fmt: skip
    assert kinds[-4:] == [
        "response.output_text.done", "response.content_part.done", "response.output_item.done", "response.completed",
    ]  # fmt: skip
    assert len(deltas) > 3 and "".join(deltas) == final.output_text
    assert final.output_text == whole.output_text and final.status == whole.status == "completed"
    assert final.usage.output_tokens == whole.usage.output_tokens
    assert client.responses.retrieve(final.id).output_text == final.output_text


def test_a_cut_answer_is_incomplete_with_its_reason(client, model):
    cut = client.responses.create(model=model, input="Tell me a long story.", max_output_tokens=5, temperature=0)
    assert cut.status == "incomplete" and cut.incomplete_details.reason == "max_output_tokens"
    assert cut.usage.output_tokens == 5
    events = []
    with client.responses.stream(model=model, input="Tell me a long story.", max_output_tokens=5) as stream:
        events = [event.type for event in stream]
    assert events[-1] == "response.incomplete"


def test_a_function_call_round_trip(client, model):
    asked = client.responses.create(
        model=model, input="What is the weather in Paris?", tools=[WEATHER], tool_choice="required",
        parallel_tool_calls=False, temperature=0,
    )  # fmt: skip
    [call] = [item for item in asked.output if item.type == "function_call"]
    assert call.name == "get_weather" and call.call_id.startswith("call_") and call.id.startswith("fc_")
    assert json.loads(call.arguments)["city"]

    # The same call, streamed: the arguments arrive as deltas and add up to the whole response's.
    with client.responses.stream(
        model=model, input="What is the weather in Paris?", tools=[WEATHER], tool_choice="required",
        parallel_tool_calls=False, temperature=0,
    ) as stream:  # fmt: skip
        arguments = "".join(e.delta for e in stream if e.type == "response.function_call_arguments.delta")
        streamed = stream.get_final_response()
    [streamed_call] = [item for item in streamed.output if item.type == "function_call"]
    assert arguments == streamed_call.arguments == call.arguments

    answer = client.responses.create(
        model=model, previous_response_id=asked.id, tools=[WEATHER], temperature=0, max_output_tokens=60,
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": json.dumps({"celsius": 18})}],
    )  # fmt: skip
    assert answer.previous_response_id == asked.id and answer.output_text
    seen = client.responses.input_items.list(answer.id, order="asc").data
    assert [item.type for item in seen] == ["message", "function_call", "function_call_output"]
    assert seen[1].call_id == seen[2].call_id == call.call_id
    # The same turn through chat completions, with the whole history: the same answer.
    chat = client.chat.completions.create(
        model=model, temperature=0, max_tokens=60,
        tools=[{"type": "function", "function": {k: v for k, v in WEATHER.items() if k != "type"}}],
        messages=[
            {"role": "user", "content": "What is the weather in Paris?"},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": call.call_id, "type": "function", "function": {"name": call.name, "arguments": call.arguments}},
            ]},
            {"role": "tool", "tool_call_id": call.call_id, "content": json.dumps({"celsius": 18})},
        ],
    )  # fmt: skip
    assert answer.output_text == (chat.choices[0].message.content or "")


def test_a_strict_json_schema_format_gives_json_that_validates(client, model):
    for stream in (False, True):
        asked = dict(
            model=model, input="Invent a person.", temperature=0.7, max_output_tokens=200,
            text={"format": {"type": "json_schema", "name": "person", "schema": PERSON, "strict": True}},
        )  # fmt: skip
        if stream:
            with client.responses.stream(**asked) as events:
                response = events.get_final_response()
        else:
            response = client.responses.create(**asked)
        assert response.status == "completed", response.incomplete_details
        jsonschema.validate(json.loads(response.output_text), PERSON)
        assert response.text.format.type == "json_schema"


def test_four_stored_turns_continue_from_the_cache_with_the_tokens_of_the_whole_history(client, model):
    questions = ["What is the capital of France?", "And of Italy?", "Which of the two is larger?", "Name a river."]
    instructions = "You are a helpful assistant. Answer in one or two sentences."
    history = [{"role": "system", "content": instructions}]
    previous = None
    for turn, question in enumerate(questions):
        response = client.responses.create(
            model=model, instructions=instructions, input=question, temperature=0, max_output_tokens=48,
            previous_response_id=previous.id if previous else None,
        )  # fmt: skip
        history.append({"role": "user", "content": question})
        chat = client.chat.completions.create(model=model, messages=history, temperature=0, max_tokens=48)
        assert response.output_text == chat.choices[0].message.content, f"turn {turn + 1}"
        assert response.usage.input_tokens == chat.usage.prompt_tokens
        assert response.usage.output_tokens == chat.usage.completion_tokens
        if previous is not None:
            past = previous.usage.input_tokens + previous.usage.output_tokens
            cached = response.usage.input_tokens_details.cached_tokens
            assert cached >= 0.9 * past, (turn + 1, cached, past)
        history.append({"role": "assistant", "content": response.output_text})
        previous = response
    items = client.responses.input_items.list(previous.id, order="asc", limit=100).data
    assert [item.role for item in items] == ["user", "assistant"] * 3 + ["user"]


def test_a_stored_response_is_another_keys_404(client, other, model):
    mine = client.responses.create(model=model, input="Hello there.", temperature=0, max_output_tokens=8)
    for call in (
        lambda: other.responses.retrieve(mine.id),
        lambda: other.responses.delete(mine.id),
        lambda: other.responses.input_items.list(mine.id),
        lambda: other.responses.create(model=model, input="Go on.", previous_response_id=mine.id),
    ):
        with pytest.raises(openai.NotFoundError):
            call()
    assert client.responses.retrieve(mine.id).id == mine.id  # the other key's delete did nothing


def test_store_false_keeps_nothing(client, model):
    unstored = client.responses.create(model=model, input="Hi.", store=False, temperature=0, max_output_tokens=8)
    assert unstored.store is False
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(unstored.id)
    with pytest.raises(openai.NotFoundError) as caught:
        client.responses.create(model=model, input="More.", previous_response_id=unstored.id)
    assert caught.value.body["param"] == "previous_response_id"


@pytest.mark.parametrize(
    "fields, status, param",
    [
        ({"previous_response_id": "resp_nothing"}, 404, "previous_response_id"),
        ({"input": [{"type": "computer_call"}]}, 400, "input[0].type"),
        ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}, 400,
         "input[0].content[0].type"),
        ({"input": [{"role": "robot", "content": "hi"}]}, 400, "input[0].role"),
        ({"input": [{"type": "function_call_output", "output": "x"}]}, 400, "input[0].call_id"),
        ({"tools": [{"type": "web_search"}]}, 400, "tools[0].type"),
        ({"tools": [WEATHER], "tool_choice": {"type": "function", "name": "nope"}}, 400, "tool_choice.name"),
        ({"reasoning": {"effort": "high"}}, 400, "reasoning"),
        ({"background": True}, 400, "background"),
        ({"include": ["reasoning.encrypted_content"]}, 400, "include[0]"),
        ({"text": {"format": {"type": "json_schema", "name": "x"}}}, 400, "text.format.schema"),
        ({"text": {"format": {"type": "yaml"}}}, 400, "text.format.type"),
        ({"max_output_tokens": 0}, 400, "max_output_tokens"),
        ({"temperature": 3}, 400, "temperature"),
        ({"input": ""}, 400, "input"),
        ({"frobnicate": 1}, 400, "frobnicate"),
    ],
)  # fmt: skip
def test_bad_input_is_one_error_naming_the_field(stack, fields, status, param):
    body = {"input": "Hello.", **fields}
    reply = httpx.post(
        stack.base_url + "/responses", json=body, headers={"Authorization": f"Bearer {KEYS[0]}"}, timeout=60
    )
    assert reply.status_code == status, reply.text
    error = reply.json()["error"]
    assert error["param"] == param and error["message"].startswith(param), error


def test_a_redis_that_does_not_answer_is_a_503_and_store_false_still_works(stack, client, model):
    kept = client.responses.create(model=model, input="Hello.", temperature=0, max_output_tokens=4)
    stack.redis.pause()
    try:
        with pytest.raises(openai.APIStatusError) as caught:
            client.responses.retrieve(kept.id)
        assert caught.value.status_code == 503 and caught.value.body["code"] == "store_unavailable"
        with pytest.raises(openai.APIStatusError) as caught:
            client.responses.create(model=model, input="Again.", previous_response_id=kept.id, max_output_tokens=4)
        assert caught.value.status_code == 503
        unstored = client.responses.create(model=model, input="Hi.", store=False, max_output_tokens=4)
        assert unstored.status in ("completed", "incomplete") and unstored.output
    finally:
        stack.redis.resume()
    assert client.responses.retrieve(kept.id).id == kept.id


def test_stored_responses_survive_a_gateway_restart_and_expire_with_their_ttl(stack, client, model):
    kept = client.responses.create(model=model, input="Remember the number seven.", temperature=0)
    command = list(stack.gateway.command)
    stack.gateway.terminate()
    stack.gateway.command = [*command, "--responses-ttl-s", "3"]
    try:
        stack.gateway.start()
        again = client.responses.retrieve(kept.id)
        assert again.output_text == kept.output_text
        follow = client.responses.create(
            model=model, input="Which number?", previous_response_id=kept.id, temperature=0, max_output_tokens=16
        )
        assert follow.usage.input_tokens > kept.usage.input_tokens + kept.usage.output_tokens
        store = redis.Redis.from_url(stack.redis_url, password=stack.redis_password)
        [key] = [k for k in store.scan_iter(match="muestra:resp:*") if k.decode().endswith(follow.id)]
        assert 0 < store.pttl(key) <= 3000
        time.sleep(3.5)
        with pytest.raises(openai.NotFoundError):
            client.responses.retrieve(follow.id)
        assert client.responses.retrieve(kept.id).id == kept.id  # stored before, with the longer TTL
    finally:
        stack.gateway.terminate()
        stack.gateway.command = command
        stack.gateway.start()


def test_stored_responses_go_to_their_own_redis_when_given_one(stack, client, model, redis_server):
    own = redis.Redis.from_url(redis_server.url)
    command = list(stack.gateway.command)
    stack.gateway.terminate()
    stack.gateway.command = [*command, "--responses-redis-url", redis_server.url, "--responses-key-prefix", "own:"]
    try:
        stack.gateway.start()
        kept = client.responses.create(model=model, input="Keep this.", temperature=0, max_output_tokens=4)
        assert [k.decode() for k in own.scan_iter(match="own:*") if k.decode().endswith(kept.id)]
        shared = redis.Redis.from_url(stack.redis_url, password=stack.redis_password)
        assert not [k for k in shared.scan_iter(match="*") if k.decode().endswith(kept.id)]
        assert client.responses.retrieve(kept.id).id == kept.id
    finally:
        stack.gateway.terminate()
        stack.gateway.command = command
        stack.gateway.start()

"""A conversation does not pay for its past: each turn reuses the KV of the whole previous turn (its prompt and its
answer), from the lm's hot tier on the replica that holds it, or from Redis on another replica or after a
restart; the tokens equal a run without the cache. On the default model, two lm replicas and a real Redis."""

from __future__ import annotations

import grpc
import pytest
import redis

from bench.stack import LocalStack
from muestra.runtime.channels import metadata_interceptors
from muestra.runtime.prefix_hash import block_hashes
from muestra.v1 import common_pb2, gateway_pb2, gateway_pb2_grpc, lm_pb2, lm_pb2_grpc
from tests.fixtures.default_model import default_model_or_skip
from tests.fixtures.prefix_cache import wait_until
from tests.observability.test_metrics import documented, level, scrape
from tests.reliability.test_failover import all_replicas_up, run

BLOCK = 32  # the gateway's default --prefix-cache-block-size
SYSTEM = "You are a helpful assistant. Answer in one or two sentences."


@pytest.fixture(scope="module")
def chat_stack(tmp_path_factory):
    folder = default_model_or_skip()
    stack = LocalStack(
        tmp_path_factory.mktemp("conversations"), lm_replicas=2, text_model=folder, image_model=None, metrics=True
    )
    yield stack
    stack.close()


@pytest.fixture(scope="module")
def stub(chat_stack):
    with grpc.insecure_channel(chat_stack.gateway.address) as channel:
        yield gateway_pb2_grpc.GatewayStub(channel)


def chat_request(messages: list[tuple[str, str]], cache: bool = True, **fields) -> gateway_pb2.GenerateRequest:
    turns = common_pb2.ChatMessages(messages=[common_pb2.ChatMessage(role=r, content=c) for r, c in messages])
    request = gateway_pb2.GenerateRequest(messages=turns, max_tokens=24, disable_prefix_cache=not cache, **fields)
    request.samplers.append(gateway_pb2.SamplerSpec(name="greedy"))
    return request


def ask(stub, messages, cache: bool = True, **fields) -> tuple[list[int], str, gateway_pb2.Completion]:
    """One greedy turn: its ids, its text and its Completion."""
    ids, text, done = [], "", None
    for message in stub.Generate(chat_request(messages, cache, **fields), timeout=120):
        if message.HasField("delta"):
            ids.extend(message.delta.token_ids)
            text += message.delta.text
        if message.HasField("done"):
            done = message.done
    assert done is not None and not done.error, done
    return ids, text, done


def held_blocks(stub, fingerprint: str, messages, answer_ids: list[int]) -> list[bytes]:
    """The block hashes of what a finished turn leaves on its replica: its prompt and its answer but the last id."""
    prompt = stub.Tokenize(gateway_pb2.TokenizeRequest(messages=chat_request(messages).messages)).ids
    held = [*prompt, *answer_ids[:-1]]
    return block_hashes(fingerprint, [*held, 0], BLOCK)  # every held id counts (no last prompt token to leave out)


def fingerprint(stack: LocalStack) -> str:
    """The model's fingerprint, as the lm describes it (the root of the cache keys' hash chain)."""

    async def describe() -> str:
        interceptors = metadata_interceptors(stack.internal_token)
        async with grpc.aio.insecure_channel(stack.lm[0].address, interceptors=interceptors) as channel:
            info = await lm_pb2_grpc.LanguageModelStub(channel).Describe(lm_pb2.DescribeModelRequest(), timeout=10)
            return info.fingerprint

    return run(describe())


def test_each_turn_reuses_the_whole_previous_turn_on_one_replica_with_the_tokens_of_no_cache(chat_stack, stub):
    messages = [("system", SYSTEM)]
    questions = [
        "What is the capital of France?",
        "And of Italy?",
        "Which of the two is larger?",
        "Name a river in each.",
    ]
    previous = None
    for question in questions:
        messages.append(("user", question))
        ids, text, done = ask(stub, messages)
        reference, _, cold = ask(stub, messages, cache=False)
        assert ids == reference
        assert cold.usage.cached_tokens == 0
        if previous is not None:
            past = previous.usage.prompt_tokens + previous.usage.completion_tokens
            assert done.usage.cached_tokens >= 0.9 * past, (done.usage, previous.usage)
            assert done.replica == previous.replica  # the conversation returns to the replica that holds it
        previous = done
        messages.append(("assistant", text))


def test_the_hot_tier_metrics_move_as_documented(chat_stack, stub):
    """The `hot` rows of docs/metrics.md (the observability stack runs its lm without a hot tier): on the replica
    that served a turn, the tier keeps the finished row and the next turn hits it."""
    rows = [name for name, (_, service, moves) in documented().items() if moves == "hot" and service == "lm"]
    assert len(rows) == 3
    messages = [("system", SYSTEM), ("user", "Name three colours.")]
    before = {lm.address: scrape(lm, chat_stack.internal_token) for lm in chat_stack.lm}
    _, text, done = ask(stub, messages)
    _, _, hit = ask(stub, [*messages, ("assistant", text), ("user", "And three more?")])
    lm = next(lm for lm in chat_stack.lm if lm.address == done.replica)
    after = scrape(lm, chat_stack.internal_token)
    for name in rows:
        assert level(after, name) > level(before[lm.address], name), f"{name} did not move"
    hot = "muestra_lm_prefix_cache_tier_hits_total"
    hits = {s[1]["tier"]: s[2] for s in after[hot]["samples"] if s[0] == hot}
    was = {s[1]["tier"]: s[2] for s in before[lm.address][hot]["samples"] if s[0] == hot}
    assert hits["hot"] - was.get("hot", 0) == hit.usage.cached_tokens > 0


def replicas_up(stack: LocalStack) -> None:
    """Every lm process started and back in the gateway's rotation."""

    async def wait() -> None:
        async with grpc.aio.insecure_channel(stack.gateway.address) as channel:
            await all_replicas_up(stack, gateway_pb2_grpc.GatewayStub(channel))

    run(wait())


def test_a_conversation_continues_from_redis_on_the_other_replica_and_after_a_restart(chat_stack, stub):
    """Turn 1 on one replica, which is then killed: turn 2 runs on the other from Redis. The first one restarts
    (an empty hot tier) and the second is killed: turn 3 runs on the restarted one from Redis."""
    stack = chat_stack
    replicas_up(stack)
    by_address = {lm.address: lm for lm in stack.lm}
    store = redis.Redis.from_url(stack.redis_url, password=stack.redis_password)
    model = fingerprint(stack)
    messages = [("system", SYSTEM), ("user", "Write a haiku about the sea, then say in two sentences what it means.")]
    ids, text, done = ask(stub, messages)
    for question in ["Now one about mountains.", "Which of the two do you like more, and why?"]:
        keys = [f"muestra:kv:{h.hex()}" for h in held_blocks(stub, model, messages, ids)]
        # A finished turn's blocks reach Redis after it ends (a low-priority writer).
        wait_until(lambda keys=keys: store.exists(*keys) == len(keys), what="the turn's blocks in Redis")
        holder = by_address[done.replica]
        holder.kill()  # SIGKILL: its hot tier is gone with it
        messages += [("assistant", text), ("user", question)]
        ids, text, moved = ask(stub, messages)
        assert moved.replica != done.replica
        # Redis holds whole blocks: every full block of what the previous turn left (its answer's last id is
        # never fed).
        held = done.usage.prompt_tokens + done.usage.completion_tokens - 1
        assert moved.usage.cached_tokens == held // BLOCK * BLOCK > 0, (moved.usage, done.usage)
        assert ids == ask(stub, messages, cache=False)[0]
        replicas_up(stack)  # the killed one restarts, with an empty hot tier
        done = moved
    replicas_up(stack)

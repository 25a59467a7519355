"""Every client-controlled field of every gRPC request, hostile: only OK, INVALID_ARGUMENT, RESOURCE_EXHAUSTED,
NOT_FOUND or OUT_OF_RANGE may come back; never INTERNAL, UNKNOWN, a hang, an ERROR in a stream or a dead service.
Afterwards the services are all up and a greedy generation gives what it gave before.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import math
import time

import grpc
import pytest
from google.protobuf import struct_pb2
from hypothesis import given
from hypothesis import strategies as st

from muestra.v1 import (
    diffusion_pb2,
    gateway_pb2,
    gateway_pb2_grpc,
    lm_pb2,
    lm_pb2_grpc,
    tokenizer_pb2,
)
from tests.fuzz.conftest import FUZZ, IMAGE_MODEL, TEXT_MODEL, Known, internal_channel, tally, unharmed
from tests.fuzz.protofuzz import Reply, call, messages, wire

pytestmark = pytest.mark.slow
# DEADLINE_EXCEEDED: the service's answer to a request whose own timeout_ms passed (a hang is HANG).
ALLOWED = {"OK", "INVALID_ARGUMENT", "RESOURCE_EXHAUSTED", "NOT_FOUND", "OUT_OF_RANGE", "DEADLINE_EXCEEDED"}
# A request stream that the service ended (refusing an earlier message) before the client wrote the rest.
ALLOWED_STREAM_ENDS = {"ENDED_EARLY"}

OUTPUTS = [lm_pb2.OutputSpec(kind=lm_pb2.ARGMAX), lm_pb2.OutputSpec(kind=lm_pb2.LOGITS),
           lm_pb2.OutputSpec(kind=lm_pb2.TOP_N, top_n=5), lm_pb2.OutputSpec(),
           # allowed-token masks: one token, none, longer than any vocabulary here, ragged
           lm_pb2.OutputSpec(kind=lm_pb2.ARGMAX, allowed_tokens=b"\x00\x04"),
           lm_pb2.OutputSpec(kind=lm_pb2.LOGITS, allowed_tokens=b"\x00" * 16),
           lm_pb2.OutputSpec(kind=lm_pb2.TOP_N, top_n=3, allowed_tokens=b"\xff" * 100_000),
           lm_pb2.OutputSpec(kind=lm_pb2.ARGMAX, allowed_tokens=b"\x81")]  # fmt: skip


def _struct(values: dict) -> struct_pb2.Struct:
    struct = struct_pb2.Struct()
    struct.update(values)
    return struct


CONSTRAINT_PARAMS = [
    _struct({"schema": {"type": "object", "properties": {"a": {"type": "integer"}}}}),
    _struct({"schema": "{not json"}),
    _struct({"schema": {"type": "nonsense", "minimum": math.nan}}),
    _struct({"schema": '{"$ref": "#/$defs/a", "$defs": {"a": {"$ref": "#/$defs/a"}}}'}),
    _struct({"pattern": "(("}),
    _struct({"pattern": "[a-z]{1,5}"}),
    _struct({"pattern": "a{1000000}"}),
    _struct({"lark": 'start: "a" start | "b"'}),
    _struct({"lark": "start: ( oops"}),
    _struct({"choices": ["sí", "no", ""]}),
    _struct({"choices": []}),
]

NON_FINITE_EXTRAS = [
    _struct({"scheduler": {"beta_start": math.nan}}),
    _struct({"scheduler": {"betas": [0.1, -math.inf]}}),
    _struct({"lora": math.inf}),
]

# A request's own deadline, at the edges: none, shorter than any step, about a prefill, long, the largest.
TIMEOUT_MS_EDGES = [0, 1, 2, 3, 5, 8, 20, 50, 5000, 2**32 - 1]

# -- hints per surface ------------------------------------------------------------------------------


def small(high: int) -> st.SearchStrategy[int]:
    return st.integers(0, high)


def text_hints(known: Known) -> dict:
    valid_id = small(known.vocab_size - 1)
    ids = st.one_of(valid_id, valid_id, valid_id, st.sampled_from([known.vocab_size, known.vocab_size + 1, 2**32 - 1]))
    return {
        "model": st.sampled_from(["", TEXT_MODEL, IMAGE_MODEL, "no-such-model"]),
        "name": st.sampled_from([*known.samplers, "", "no_such_sampler"]),
        "struct_keys": st.sampled_from(known.params),
        "max_tokens": st.one_of(small(24), st.just(known.context_length)),
        "n": small(5),
        "top_logprobs": small(25),
        "timeout_ms": st.sampled_from(TIMEOUT_MS_EDGES),
        "role": st.sampled_from(["user", "system", "assistant", "tool", "", "admin"]),
        "prompt": st.sampled_from(["", "def f(x):\n", "Hola", "\x00", "x" * 3000]),
        "stop": st.sampled_from(["", "\n", " ", ".", "x" * 300]),
        "stop_token_ids": ids,
        "ids": ids,
        "input_ids": ids,
        "next_ids": ids,
        "texts": st.sampled_from(["", "def f(x):\n", "🙂", "x" * 10_000]),
        "read_offset": small(8),
        "top_n": st.sampled_from([0, 1, 5, known.vocab_size, known.vocab_size + 1]),
        "block_size": st.sampled_from([0, 1, 16, 64]),
        "cached_blocks": small(4),
        "rows": small(3),
        "PrefillRow.output": st.sampled_from(OUTPUTS),
        "DecodeBatch.outputs": st.sampled_from(OUTPUTS),
        "PrefillRow.prefix": st.just(lm_pb2.PrefixBlocks()),
        "request_id": st.sampled_from(["fuzz", ""]),
        "ConstraintSpec.name": st.sampled_from(["json_object", "json_schema", "regex", "grammar", "choice", "", "no"]),
        "ConstraintSpec.params": st.sampled_from(CONSTRAINT_PARAMS),
        "batch_id": st.integers(0, 99).map(lambda i: known.batches[i % len(known.batches)] if known.batches else ""),
    }


def image_hints(known: Known) -> dict:
    limits = known.image_limits
    return {
        "model": st.sampled_from(["", IMAGE_MODEL, TEXT_MODEL, "no-such-model"]),
        "prompt": st.sampled_from(["a handwritten seven", "", "x" * 5000]),
        "width": st.sampled_from([0, 7, 8, 16, limits.default_width, limits.max_width + 8, 2**32 - 1]),
        "height": st.sampled_from([0, 9, 8, 24, limits.default_height, limits.max_height + 8, 2**32 - 1]),
        "steps": st.sampled_from([0, 1, 2, 3, limits.max_steps + 1, 2**32 - 1]),
        "num_images": st.sampled_from([0, 1, 2, limits.max_images + 1, 2**32 - 1]),
        "preview_every": st.sampled_from([0, 1, 2, 2**32 - 1]),
        "sampler": st.sampled_from(["", "euler", "ddim", "no-such-scheduler"]),
        # JSON has no NaN or infinities; such an extra used to be INTERNAL.
        "ImageRequest.extra": st.sampled_from(NON_FINITE_EXTRAS),
    }


# Fields whose every value is costly on this CPU (image sizes, steps): only the hints are drawn.
IMAGE_ONLY_HINTS = {"width", "height", "steps", "num_images", "preview_every"}


def image_messages(known: Known) -> st.SearchStrategy:
    hints = image_hints(known)

    @st.composite
    def build(draw):
        message = draw(messages(diffusion_pb2.ImageRequest, hints))
        for name in IMAGE_ONLY_HINTS:
            setattr(message, name, draw(hints[name]))
        return message

    return build()


# -- the surfaces -----------------------------------------------------------------------------------


@dataclasses.dataclass
class Surface:
    service: str  # the LocalStack process it goes to
    method: str
    request: type
    kind: str = "unary_unary"
    timeout_s: float = 60.0

    @property
    def name(self) -> str:
        return f"{self.service} {self.method.rsplit('/', 1)[1]}"


SURFACES = [
    Surface("gateway", "/muestra.v1.Gateway/Generate", gateway_pb2.GenerateRequest, "unary_stream"),
    Surface("gateway", "/muestra.v1.Gateway/GenerateImage", diffusion_pb2.ImageRequest, "unary_stream", 120),
    Surface("tokenizer", "/muestra.v1.Tokenizer/Describe", tokenizer_pb2.DescribeTokenizerRequest),
    Surface("tokenizer", "/muestra.v1.Tokenizer/Encode", tokenizer_pb2.EncodeRequest),
    Surface("tokenizer", "/muestra.v1.Tokenizer/Decode", tokenizer_pb2.DecodeTokensRequest),
    Surface("tokenizer", "/muestra.v1.Tokenizer/ApplyChatTemplate", tokenizer_pb2.ApplyChatTemplateRequest),
    Surface("tokenizer", "/muestra.v1.Tokenizer/DetokenizeStep", tokenizer_pb2.DetokenizeStepRequest),
    Surface("tokenizer", "/muestra.v1.Tokenizer/DetokenizeSteps", tokenizer_pb2.DetokenizeStepRequest, "stream_stream"),
    Surface("lm", "/muestra.v1.LanguageModel/Prefill", lm_pb2.PrefillRequest),
    Surface("lm", "/muestra.v1.LanguageModel/Decode", lm_pb2.DecodeRequest),
    Surface("lm", "/muestra.v1.LanguageModel/Filter", lm_pb2.FilterRequest),
    Surface("lm", "/muestra.v1.LanguageModel/Clear", lm_pb2.ClearRequest),
    Surface("lm", "/muestra.v1.LanguageModel/BatchSteps", lm_pb2.BatchStepRequest, "stream_stream"),
    Surface("diffusion", "/muestra.v1.Diffusion/Generate", diffusion_pb2.ImageRequest, "unary_stream", 120),
]


def address(stack, service: str) -> str:
    return {"gateway": stack.gateway, "tokenizer": stack.tokenizer, "lm": stack.lm[0], "diffusion": stack.diffusion}[
        service
    ].address


def ended_empty(surface: Surface, reply: Reply) -> bool:
    """A Generate stream that ended OK without a Completion: the client cannot tell how it ended."""
    if reply.code != "OK" or not surface.method.endswith("Gateway/Generate"):
        return False
    messages = [gateway_pb2.GenerateResponse.FromString(r) for r in reply.responses]
    indices = {m.index for m in messages}
    done = {m.index for m in messages if m.HasField("done")}
    return not done or indices != done


def stream_errors(surface: Surface, reply: Reply) -> list[str]:
    """Completions that a gateway stream ended with ERROR: a failure inside, not the client's fault."""
    if surface.method.endswith("Gateway/Generate"):
        done = [gateway_pb2.GenerateResponse.FromString(r) for r in reply.responses]
        return [d.done.error for d in done if d.HasField("done") and d.done.finish_reason == gateway_pb2.ERROR]
    return []


def track_batches(surface: Surface, known: Known, reply: Reply, request: bytes) -> None:
    """Batches the lm created or consumed, so that later examples can name live ones."""
    if reply.code != "OK" or surface.service != "lm":
        return
    kind = surface.method.rsplit("/", 1)[1]
    if kind == "Prefill":
        known.batches.append(lm_pb2.PrefillResponse.FromString(reply.responses[0]).batch_id)
    elif kind == "Decode":
        consumed = {b.batch_id for b in lm_pb2.DecodeRequest.FromString(request).batches}
        known.batches[:] = [b for b in known.batches if b not in consumed]
        known.batches.append(lm_pb2.DecodeResponse.FromString(reply.responses[0]).batch_id)
    elif kind == "Filter":
        known.batches.append(lm_pb2.FilterResponse.FromString(reply.responses[0]).batch_id)
    elif kind == "Clear":
        cleared = set(lm_pb2.ClearRequest.FromString(request).batch_ids)
        known.batches[:] = [b for b in known.batches if b not in cleared]


async def seed_batches(stack, known: Known) -> None:
    """Two real batches on the lm for the fuzzed Decode, Filter, Clear and BatchSteps calls to find."""
    async with internal_channel(stack, stack.lm[0].address) as channel:
        stub = lm_pb2_grpc.LanguageModelStub(channel)
        for ids in ([1, 2, 3], [5, 6, 7, 8, 9]):
            row = lm_pb2.PrefillRow(request_id="fuzz", input_ids=ids, output=lm_pb2.OutputSpec(kind=lm_pb2.ARGMAX))
            reply = await stub.Prefill(lm_pb2.PrefillRequest(rows=[row]), timeout=30)
            known.batches.append(reply.batch_id)


async def clear_batches(stack, known: Known) -> None:
    async with internal_channel(stack, stack.lm[0].address) as channel:
        stub = lm_pb2_grpc.LanguageModelStub(channel)
        await stub.Clear(lm_pb2.ClearRequest(batch_ids=known.batches), timeout=30)
    known.batches.clear()


@pytest.mark.parametrize("surface", SURFACES, ids=lambda s: s.name)
def test_hostile_requests_get_a_clear_status(fuzz_stack, known, surface):
    if surface.request is diffusion_pb2.ImageRequest:
        requests = image_messages(known)
    else:
        requests = messages(surface.request, text_hints(known))
    target = address(fuzz_stack, surface.service)
    if surface.service == "lm":
        asyncio.run(seed_batches(fuzz_stack, known))

    @FUZZ
    @given(data=st.data())
    def one(data):
        count = data.draw(st.integers(1, 3)) if surface.kind == "stream_stream" else 1
        sent = [data.draw(wire(surface.request)(data.draw(requests))) for _ in range(count)]
        hows = sorted({how for how, _ in sent})

        async def send() -> Reply:
            async with internal_channel(
                fuzz_stack, target, [("grpc.max_send_message_length", -1), ("grpc.max_receive_message_length", -1)]
            ) as channel:
                started = time.monotonic()
                reply = await call(channel, surface.method, surface.kind, [b for _, b in sent], surface.timeout_s)
                if reply.code == "HANG" and time.monotonic() - started < surface.timeout_s * 0.9:
                    reply.code = "DEADLINE_EXCEEDED"  # the service's own deadline, not ours
                return reply

        reply = asyncio.run(send())
        errors = stream_errors(surface, reply)
        outcome = "ERROR in stream" if errors else reply.code
        if ended_empty(surface, reply):
            outcome = "OK without a Completion"
        tally(f"gRPC {surface.name}", outcome, reply.details)
        if len(sent) == 1:
            track_batches(surface, known, reply, sent[0][1])
        shown = [surface.request.FromString(b) if h == "valid" else b[:200] for h, b in sent]
        assert outcome in ALLOWED | ALLOWED_STREAM_ENDS, (
            f"{outcome} {reply.details[:500]} {errors} for {hows}: {str(shown)[:1500]}"
        )
        if reply.code in ALLOWED - {"OK"}:
            assert reply.details, f"{reply.code} without a message for {hows}: {str(shown)[:500]}"

    try:
        one()
    finally:
        if surface.service == "lm" and known.batches:
            asyncio.run(clear_batches(fuzz_stack, known))
    unharmed(fuzz_stack, known)


def test_tiny_deadlines_fail_their_own_requests_only(fuzz_stack, known):
    """timeout_ms and call deadlines at their edges, on prompts that take longer to prefill than the deadline:
    each such request ends DEADLINE_EXCEEDED or with its Completions (never OK and empty), a stream running
    beside them keeps its pace and ends whole, and the lone lm replica stays in rotation throughout."""

    async def generate(stub, request, timeout) -> str:
        try:
            messages = [m async for m in stub.Generate(request, timeout=timeout)]
        except grpc.aio.AioRpcError as exc:
            return exc.code().name
        done = [m for m in messages if m.HasField("done")]
        return "OK" if done else "OK without a Completion"

    async def run() -> tuple[collections.Counter, list[float], str, collections.Counter]:
        async with grpc.aio.insecure_channel(fuzz_stack.gateway.address) as channel:
            stub = gateway_pb2_grpc.GatewayStub(channel)
            bystander = gateway_pb2.GenerateRequest(prompt="def fuzz(x):\n", max_tokens=200, ignore_eos=True, seed=5)
            gaps: list[float] = []

            async def watch() -> str:
                last = time.monotonic()
                async for message in stub.Generate(bystander, timeout=300):
                    now = time.monotonic()
                    gaps.append(now - last)
                    last = now
                    if message.HasField("done"):
                        return gateway_pb2.FinishReason.Name(message.done.finish_reason)
                return "no Completion"

            watching = asyncio.ensure_future(watch())
            outcomes: collections.Counter = collections.Counter()
            after: collections.Counter = collections.Counter()
            for i, timeout_ms in enumerate(TIMEOUT_MS_EDGES * 3):
                call_timeout = (0.002, 0.02, 30)[i % 3]  # the caller's own deadline, at its edges too
                request = gateway_pb2.GenerateRequest(prompt="😀" * 100, max_tokens=8, seed=i, timeout_ms=timeout_ms)
                outcomes[await generate(stub, request, call_timeout)] += 1
                ordinary = gateway_pb2.GenerateRequest(prompt="Hola", max_tokens=2, seed=i)
                after[await generate(stub, ordinary, 30)] += 1
            return outcomes, gaps, await watching, after

    outcomes, gaps, bystander_end, after = asyncio.run(run())
    for outcome, count in outcomes.items():
        for _ in range(count):
            tally("gRPC Generate, deadlines at their edges", outcome)
    assert set(outcomes) <= {"OK", "DEADLINE_EXCEEDED"}, outcomes
    assert outcomes["DEADLINE_EXCEEDED"] >= len(TIMEOUT_MS_EDGES), outcomes  # the short ones did cut requests
    assert after == {"OK": 3 * len(TIMEOUT_MS_EDGES)}, after  # never UNAVAILABLE: the replica stayed in
    assert bystander_end == "LENGTH"
    assert max(gaps[1:]) < 2.0, f"the bystander stalled {max(gaps[1:]):.2f} s between two messages"
    unharmed(fuzz_stack, known)

"""The mixed client workload of bench/soak.py and bench/chaos.py, and the checks on every response.

Each worker loops until the run's end: it draws a request (gRPC or HTTP, streamed or not, n 1-4,
samplers, beam search, logprobs, stop strings, prompts that share cached prefixes, a cancellation
mid-stream, an image, a stored conversation of 2-3 turns through /v1/responses, or a replay of an earlier
seeded request on another surface), sends it, and
records what came back with its timings. A stream that makes no progress for `hang_s` is hung. A reply that
comes whole (non-streamed HTTP, and a beam search, streamed over gRPC or HTTP, whose beams come when the
search ends) may take 2 x hang_s: its silence holds its time in the queue and its whole decode.

After the run, `check_text` compares every gRPC completion's text with the tokenizer's decode of its
token ids (with its stop strings applied), and replays are compared with their originals.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import dataclasses
import io
import json
import random
import re
import time
from collections import Counter

import grpc
import httpx2 as httpx
import jsonschema
from google.protobuf import json_format, struct_pb2

from muestra.runtime.channels import metadata_interceptors
from muestra.v1 import diffusion_pb2, gateway_pb2, gateway_pb2_grpc, tokenizer_pb2, tokenizer_pb2_grpc

# Stop strings that cannot overlap one another, so "the earliest one in the text" is unambiguous.
STOPS = ["\n", ".", "(", " is", ":"]
PREAMBLES = [
    "The following is taken from the documentation of the Python standard library, section on files and "
    "directories. Each function takes a path and returns a value; errors are raised as OSError. ",
    "Python's built-in types include numbers, sequences, mappings, classes, instances and exceptions. "
    "Some operations are supported by several object types; in particular, practically all objects can be "
    "compared for equality, tested for truth value, and converted to a string. ",
    "A module is a file containing Python definitions and statements. The file name is the module name with "
    "the suffix .py appended. Within a module, the module's name is available as the value of the global "
    "variable __name__. ",
]
TAILS = [
    "The function returns",
    "Return the",
    "This method is called when",
    "If the argument is omitted,",
    "El cielo es",
    "import os\n",
    "def main():\n    ",
    "Raises ValueError if",
]
CHAT_QUESTIONS = ["What does os.path.join do?", "Explain the argument", "How do I open a file?", "Return the value"]
FOLLOW_UPS = ["Go on.", "Give an example.", "Why?", "Say it shorter."]
SAMPLER_CHAINS = [
    [{"name": "greedy"}],
    [{"name": "temperature", "params": {"temperature": 0.9}}, {"name": "sample"}],
    [{"name": "top_k", "params": {"top_k": 20}}, {"name": "sample"}],
    [{"name": "top_p", "params": {"top_p": 0.8}}, {"name": "sample"}],
    [{"name": "min_p", "params": {"min_p": 0.05}}, {"name": "temperature", "params": {"temperature": 1.2}},
     {"name": "sample"}],
    [{"name": "presence_penalty", "params": {"presence_penalty": 0.5}}, {"name": "sample"}],
    [{"name": "repetition_penalty", "params": {"repetition_penalty": 1.3}}, {"name": "greedy"}],
    [],  # the model's generation_config.json decides
]  # fmt: skip
# Constrained requests (kind grpc_json): every finished text is checked against its constraint.
CONSTRAINTS = [
    {"name": "json_schema", "params": {"schema": {
        "type": "object",
        "properties": {"name": {"type": "string", "maxLength": 12}, "age": {"type": "integer", "minimum": 0},
                       "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 3}},
        "required": ["name"], "additionalProperties": False}}},
    {"name": "json_object"},
    {"name": "regex", "params": {"pattern": "[0-9]{3}-[a-z]{2,8}"}},
    {"name": "choice", "params": {"choices": ["sí", "no", "quizá"]}},
]  # fmt: skip
FINISH = {gateway_pb2.STOP: "stop", gateway_pb2.LENGTH: "length", gateway_pb2.CANCELLED: "cancelled"}


@dataclasses.dataclass
class Spec:
    """One text request, independent of the surface it is sent on."""

    prompt: str | None
    messages: list[dict] | None
    max_tokens: int
    n: int
    seed: int
    samplers: list[dict]
    logprobs: bool = False
    top_logprobs: int = 0
    stop: list[str] = dataclasses.field(default_factory=list)
    ignore_eos: bool = False
    constraint: dict | None = None

    @property
    def beam(self) -> bool:
        return bool(self.samplers) and self.samplers[-1]["name"] == "beam_search"

    @property
    def argmax(self) -> bool:
        """Whether no token is drawn at random (greedy or beam search)."""
        return bool(self.samplers) and self.samplers[-1]["name"] in ("greedy", "beam_search")

    def grpc_request(self) -> gateway_pb2.GenerateRequest:
        request = gateway_pb2.GenerateRequest(
            max_tokens=self.max_tokens, n=self.n, seed=self.seed, logprobs=self.logprobs,
            top_logprobs=self.top_logprobs, stop=self.stop, ignore_eos=self.ignore_eos,
        )  # fmt: skip
        if self.messages is not None:
            request.messages.messages.extend(gateway_pb2_message(m) for m in self.messages)
        else:
            request.prompt = self.prompt
        for step in self.samplers:
            params = struct_pb2.Struct()
            params.update(step.get("params", {}))
            request.samplers.append(gateway_pb2.SamplerSpec(name=step["name"], params=params))
        if self.constraint is not None:
            params = dict(self.constraint.get("params", {}))
            if "schema" in params:
                params["schema"] = json.dumps(params["schema"])  # keeps the order of the properties
            request.constraint.name = self.constraint["name"]
            request.constraint.params.update(params)
        return request

    def check_text(self, text: str) -> str | None:
        """What is wrong with a finished text under the request's constraint (None: nothing)."""
        name = self.constraint["name"]
        params = self.constraint.get("params", {})
        try:
            if name in ("json_schema", "json_object"):
                value = json.loads(text)
                jsonschema.validate(value, params.get("schema", {"type": "object"}))
            elif name == "regex" and not re.fullmatch(params["pattern"], text):
                return f"{text!r} does not match {params['pattern']!r}"
            elif name == "choice" and text not in params["choices"]:
                return f"{text!r} is not one of {params['choices']}"
        except (ValueError, jsonschema.ValidationError) as exc:
            return f"{text!r:.200} is not valid: {str(exc)[:200]}"
        return None

    def http_body(self, stream: bool) -> tuple[str, dict]:
        body: dict = {"max_tokens": self.max_tokens, "n": self.n, "seed": self.seed, "stream": stream}
        if self.samplers:
            body["samplers"] = self.samplers
        if self.stop:
            body["stop"] = self.stop
        if self.ignore_eos:
            body["ignore_eos"] = True
        if stream:
            body["stream_options"] = {"include_usage": True}
        if self.messages is not None:
            body["messages"] = self.messages
            if self.logprobs:
                body["logprobs"] = True
                body["top_logprobs"] = self.top_logprobs
            return "/chat/completions", body
        body["prompt"] = self.prompt
        if self.logprobs:
            body["logprobs"] = self.top_logprobs
        return "/completions", body


def gateway_pb2_message(message: dict):
    from muestra.v1 import common_pb2

    return common_pb2.ChatMessage(role=message["role"], content=message["content"])


@dataclasses.dataclass
class Outcome:
    """What one request got. status: ok, cancelled (by the client, on purpose), refused, failed, lost, hung."""

    kind: str
    spec: Spec | None = None
    # grpc, http_stream, http or image: where the response came from.
    surface: str = ""
    status: str = "ok"
    error: str = ""
    code: str = ""
    # Per completion index: the text, its token ids (gRPC only), finish reason, logprob count.
    texts: dict[int, str] = dataclasses.field(default_factory=dict)
    ids: dict[int, list[int]] = dataclasses.field(default_factory=dict)
    finish: dict[int, str] = dataclasses.field(default_factory=dict)
    stop_reason: dict[int, str] = dataclasses.field(default_factory=dict)
    logprob_tokens: dict[int, list[str]] = dataclasses.field(default_factory=dict)
    completion_tokens: dict[int, int] = dataclasses.field(default_factory=dict)
    cached_tokens: int = 0
    usage_completion_tokens: int | None = None
    replica: str = ""
    images: list[bytes] = dataclasses.field(default_factory=list)
    started: float = 0.0
    ended: float = 0.0
    first_at: float | None = None
    gaps: list[float] = dataclasses.field(default_factory=list)
    problems: list[str] = dataclasses.field(default_factory=list)
    replay_of: Outcome | None = None

    def signature(self) -> tuple:
        if self.kind.startswith("image"):
            return tuple(self.images)
        return tuple((i, self.texts.get(i, ""), self.finish.get(i, "")) for i in sorted(self.finish))

    def latency_kind(self) -> bool:
        """Whether its TTFT and inter-token gaps are text latencies (streamed text, not images or whole answers)."""
        return self.surface in ("grpc", "http_stream")

    def describe(self) -> str:
        what = self.spec.grpc_request() if self.spec is not None else None
        short = json.dumps(json_format.MessageToDict(what))[:300] if what is not None else ""
        return f"{self.kind} {self.status} {self.code} {self.error[:200]} {short}"


class Workload:
    """Drives the stack at `gateway` (gRPC) and `base_url` (HTTP) from `concurrency` workers."""

    def __init__(
        self,
        gateway: str,
        base_url: str,
        concurrency: int,
        seed: int = 0,
        hang_s: float = 30.0,
        images: bool = True,
        image_model: str = "",
        kinds: dict[str, float] | None = None,
    ) -> None:
        self.gateway = gateway
        self.base_url = base_url
        self.concurrency = concurrency
        self.rng = random.Random(seed)
        self.hang_s = hang_s
        self.kinds = dict(kinds or DEFAULT_KINDS)
        if not images:
            self.kinds = {k: w for k, w in self.kinds.items() if not k.startswith("image")}
        self.outcomes: list[Outcome] = []
        self.replayable: list[Outcome] = []
        self.stopping = False
        self.next_seed = seed * 1_000_003
        self.replays: Counter = Counter()
        # (prompt, steps, seed) -> the first image it gave: every later one must equal it.
        self.image_replays: dict[tuple, Outcome] = {}

    # -- running ------------------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def connected(self):
        """The gRPC channel and HTTP client the requests go over."""
        options = [
            ("grpc.max_receive_message_length", 64 * 1024 * 1024),
            # A gateway that restarts is found again within a second (grpc's default backoff grows to 2 min).
            ("grpc.initial_reconnect_backoff_ms", 100),
            ("grpc.min_reconnect_backoff_ms", 100),
            ("grpc.max_reconnect_backoff_ms", 1000),
        ]
        limits = httpx.Limits(max_connections=self.concurrency * 2, max_keepalive_connections=self.concurrency)
        async with (
            grpc.aio.insecure_channel(self.gateway, options=options) as channel,
            httpx.AsyncClient(base_url=self.base_url, trust_env=False, limits=limits) as http,
        ):
            self.stub = gateway_pb2_grpc.GatewayStub(channel)
            self.http = http
            yield

    async def run(self, seconds: float) -> list[Outcome]:
        until = time.monotonic() + seconds
        async with self.connected():
            workers = [asyncio.ensure_future(self._worker(k, until)) for k in range(self.concurrency)]
            await asyncio.gather(*workers)
        return self.outcomes

    async def resend(self, specs: list[Spec]) -> list[Outcome]:
        """Each spec once more over gRPC, one after another."""
        rng = random.Random(1)
        async with self.connected():
            return [await self._text("grpc_stream", spec, rng) for spec in specs]

    async def _worker(self, k: int, until: float) -> None:
        rng = random.Random(self.rng.random())
        while time.monotonic() < until and not self.stopping:
            kind = rng.choices(list(self.kinds), weights=list(self.kinds.values()))[0]
            outcome = await self.one(kind, rng)
            self.outcomes.append(outcome)
            if outcome.status in ("refused", "failed"):
                await asyncio.sleep(0.2)  # a stack that refuses or is down is not hammered in a tight loop

    async def one(self, kind: str, rng: random.Random) -> Outcome:
        if kind == "replay":
            if not self.replayable:
                kind = "grpc_stream"
            else:
                original = rng.choice(self.replayable)
                surface = rng.choice(["grpc_stream", "http_stream", "http"])
                if original.spec.constraint is not None:
                    surface = "grpc_stream"  # constraints are a gRPC field here
                outcome = await self._text(surface, original.spec, rng)
                outcome.kind = f"replay:{surface}"
                outcome.replay_of = original
                if outcome.status == "ok":
                    self._compare_replay(outcome)
                return outcome
        if kind.startswith("image"):
            return await self._image(kind, rng)
        if kind == "http_responses":
            return await self._conversation(rng)
        spec = self._spec(kind, rng)
        outcome = await self._text(kind, spec, rng)
        if outcome.status == "ok" and kind not in ("grpc_cancel", "http_cancel"):
            self.replayable.append(outcome)
        return outcome

    def _seed(self) -> int:
        self.next_seed += 1
        return self.next_seed

    def _spec(self, kind: str, rng: random.Random) -> Spec:
        chat = (kind.startswith("http") and rng.random() < 0.6) or kind == "grpc_chat"
        prompt = rng.choice(PREAMBLES) + rng.choice(TAILS) if rng.random() < 0.5 else rng.choice(TAILS)
        messages = [{"role": "user", "content": rng.choice(CHAT_QUESTIONS)}] if chat else None
        samplers = list(rng.choice(SAMPLER_CHAINS))
        n = rng.choice([1, 1, 1, 2, 3, 4])
        spec = Spec(
            prompt=None if chat else prompt, messages=messages, max_tokens=rng.randint(1, 48), n=n,
            seed=self._seed(), samplers=samplers,
        )  # fmt: skip
        if kind == "grpc_json":
            spec.constraint = rng.choice(CONSTRAINTS)
            if spec.beam:
                spec.samplers = []
            spec.max_tokens = rng.randint(16, 96)
        if kind == "grpc_beam":
            beams = rng.randint(2, 3)
            spec.samplers = [{"name": "beam_search", "params": {"num_beams": beams}}]
            spec.n = rng.randint(1, beams)
            spec.max_tokens = rng.randint(2, 24)
            return spec
        if rng.random() < 0.5:
            spec.logprobs = True
            spec.top_logprobs = rng.randint(0, 3)
        if rng.random() < 0.3:
            spec.stop = rng.sample(STOPS, rng.randint(1, 2))
        spec.ignore_eos = spec.constraint is None and rng.random() < 0.2
        return spec

    async def _text(self, kind: str, spec: Spec, rng: random.Random) -> Outcome:
        surface = (
            "grpc" if kind.startswith("grpc") else "http_stream" if kind in ("http_stream", "http_cancel") else "http"
        )
        outcome = Outcome(kind, spec, surface=surface, started=time.monotonic())
        cancel_after = rng.randint(1, 6) if kind in ("grpc_cancel", "http_cancel") else None
        try:
            if surface == "grpc":
                await self._grpc(spec, outcome, cancel_after)
            elif surface == "http_stream":
                await self._http_stream(spec, outcome, cancel_after)
            else:
                await self._http(spec, outcome)
        except asyncio.TimeoutError:
            silent = self.hang_s * 2 if surface == "http" or (spec.beam and not outcome.ids) else self.hang_s
            outcome.status, outcome.error = "hung", f"no progress for {silent:.0f} s"
        except grpc.aio.AioRpcError as exc:
            outcome.code = exc.code().name
            outcome.error = exc.details() or ""
            outcome.status = "refused" if exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED else "failed"
        except httpx.HTTPError as exc:
            outcome.status, outcome.code, outcome.error = "failed", "HTTP", f"{type(exc).__name__}: {exc}"
        outcome.ended = time.monotonic()
        if outcome.status == "ok" and cancel_after is None:
            self._check_shape(outcome)
        return outcome

    def _mark(self, outcome: Outcome, now: float, last: float) -> float:
        if outcome.first_at is None:
            outcome.first_at = now
        else:
            outcome.gaps.append(now - last)
        return now

    async def _grpc(self, spec: Spec, outcome: Outcome, cancel_after: int | None) -> None:
        call = self.stub.Generate(spec.grpc_request(), timeout=600)
        last = outcome.started
        messages = 0
        try:
            while True:
                # A beam search sends its beams when it ends: until then it is as silent as a non-streamed reply.
                limit = self.hang_s * 2 if spec.beam and messages == 0 else self.hang_s
                message = await asyncio.wait_for(call.read(), limit)
                if message is grpc.aio.EOF:
                    break
                messages += 1
                i = message.index
                if message.HasField("delta"):
                    delta = message.delta
                    if delta.token_ids:
                        last = self._mark(outcome, time.monotonic(), last)
                    outcome.texts[i] = outcome.texts.get(i, "") + delta.text
                    outcome.ids.setdefault(i, []).extend(delta.token_ids)
                    outcome.logprob_tokens.setdefault(i, []).extend(lp.token for lp in delta.logprobs)
                else:
                    done = message.done
                    if done.finish_reason == gateway_pb2.ERROR:
                        outcome.status, outcome.code, outcome.error = "failed", "ERROR", done.error
                    outcome.finish[i] = FINISH.get(done.finish_reason, "error")
                    outcome.stop_reason[i] = done.stop_reason
                    outcome.completion_tokens[i] = done.usage.completion_tokens
                    outcome.cached_tokens = done.usage.cached_tokens
                    outcome.replica = done.replica
                if cancel_after is not None and messages >= cancel_after:
                    call.cancel()
                    outcome.status = "cancelled"
                    return
        finally:
            call.cancel()

    async def _http_stream(self, spec: Spec, outcome: Outcome, cancel_after: int | None) -> None:
        path, body = spec.http_body(stream=True)
        chat = path.startswith("/chat")
        last = outcome.started
        chunks = 0
        saw_done = False
        # A beam search sends its beams when it ends: until then it is as silent as a non-streamed reply.
        first = self.hang_s * 2 if spec.beam else self.hang_s
        async with self.http.stream("POST", path, json=body, timeout=httpx.Timeout(600, read=first)) as reply:
            if reply.status_code != 200:
                await self._http_failure(reply, outcome)
                return
            async for data in self._sse_data(reply, first):
                if data == "[DONE]":
                    saw_done = True
                    continue
                event = json.loads(data)
                if "error" in event:
                    outcome.status, outcome.code = "failed", str(event["error"].get("code"))
                    outcome.error = event["error"].get("message", "")
                    continue
                chunks += 1
                if event.get("usage"):
                    outcome.usage_completion_tokens = event["usage"]["completion_tokens"]
                    details = event["usage"].get("prompt_tokens_details") or {}
                    outcome.cached_tokens = details.get("cached_tokens", 0)
                for choice in event.get("choices", []):
                    i = choice["index"]
                    text = (choice.get("delta") or {}).get("content") if chat else choice.get("text")
                    if text:
                        last = self._mark(outcome, time.monotonic(), last)
                    outcome.texts[i] = outcome.texts.get(i, "") + (text or "")
                    logprobs = choice.get("logprobs")
                    if logprobs:
                        tokens = [e["token"] for e in logprobs["content"]] if chat else logprobs["tokens"]
                        outcome.logprob_tokens.setdefault(i, []).extend(tokens)
                    if choice.get("finish_reason"):
                        if i in outcome.finish:
                            outcome.problems.append(f"choice {i} finished twice")
                        outcome.finish[i] = choice["finish_reason"]
                if cancel_after is not None and chunks >= cancel_after:
                    outcome.status = "cancelled"
                    return  # leaving the block closes the connection mid-stream
        if outcome.status == "ok" and not saw_done:
            outcome.status, outcome.error = "lost", "the stream ended without [DONE]"

    async def _sse_data(self, reply, first: float | None = None):
        """Each `data:` payload of a server-sent event stream; a line that takes longer than hang_s (the first
        payload: `first`, when given) raises asyncio.TimeoutError (the stream is hung)."""
        lines = reply.aiter_lines()
        limit = first or self.hang_s
        while True:
            try:
                line = await asyncio.wait_for(anext(lines), limit)
            except StopAsyncIteration:
                return
            if line.startswith("data: "):
                limit = self.hang_s
                yield line[6:]

    async def _http(self, spec: Spec, outcome: Outcome) -> None:
        path, body = spec.http_body(stream=False)
        reply = await self.http.post(path, json=body, timeout=self.hang_s * 2)
        if reply.status_code != 200:
            await self._http_failure(reply, outcome)
            return
        data = reply.json()
        for choice in data["choices"]:
            i = choice["index"]
            outcome.texts[i] = choice["message"]["content"] if "message" in choice else choice["text"]
            outcome.finish[i] = choice["finish_reason"]
            logprobs = choice.get("logprobs")
            if logprobs:
                tokens = [e["token"] for e in logprobs["content"]] if "content" in logprobs else logprobs["tokens"]
                outcome.logprob_tokens[i] = tokens
        outcome.usage_completion_tokens = data["usage"]["completion_tokens"]
        outcome.cached_tokens = (data["usage"].get("prompt_tokens_details") or {}).get("cached_tokens", 0)
        outcome.first_at = time.monotonic()

    async def _conversation(self, rng: random.Random) -> Outcome:
        """A stored conversation of 2-3 turns through /v1/responses, each later turn continued with
        previous_response_id, each whole or streamed; the last response read back must be what came."""
        outcome = Outcome("http_responses", surface="responses", started=time.monotonic())
        previous = None
        try:
            for turn in range(rng.randint(2, 3)):
                body = {
                    "input": rng.choice(CHAT_QUESTIONS if turn == 0 else FOLLOW_UPS),
                    "max_output_tokens": rng.randint(1, 32), "temperature": rng.choice([0, 0.8]), "seed": self._seed(),
                }  # fmt: skip
                if previous is not None:
                    body["previous_response_id"] = previous["id"]
                stream = rng.random() < 0.5
                response = await (self._response_stream if stream else self._response_whole)(body, outcome)
                if response is None:
                    outcome.ended = time.monotonic()
                    return outcome
                if response["status"] not in ("completed", "incomplete"):
                    outcome.problems.append(f"turn {turn + 1}: status {response['status']!r}")
                if previous is not None and response["usage"]["input_tokens"] <= previous["usage"]["input_tokens"]:
                    outcome.problems.append(f"turn {turn + 1}: its input is not longer than the turn before's")
                outcome.cached_tokens = response["usage"]["input_tokens_details"]["cached_tokens"]
                previous = response
            stored = await self.http.get(f"/responses/{previous['id']}", timeout=self.hang_s)
            if stored.status_code != 200:
                await self._http_failure(stored, outcome)
            elif stored.json()["output"] != previous["output"]:
                outcome.problems.append("the stored response is not the one that came")
        except httpx.TimeoutException as exc:
            outcome.status, outcome.error = "hung", f"no progress for {self.hang_s:.0f} s ({type(exc).__name__})"
        except asyncio.TimeoutError:
            outcome.status, outcome.error = "hung", f"no event for {self.hang_s:.0f} s"
        except httpx.HTTPError as exc:
            outcome.status, outcome.code, outcome.error = "failed", "HTTP", f"{type(exc).__name__}: {exc}"
        outcome.ended = time.monotonic()
        if previous is not None:
            outcome.texts[0] = "".join(
                part["text"] for item in previous["output"] if item["type"] == "message" for part in item["content"]
            )
            outcome.finish[0] = previous["status"]
        return outcome

    async def _response_whole(self, body: dict, outcome: Outcome) -> dict | None:
        reply = await self.http.post("/responses", json=body, timeout=self.hang_s * 2)
        if reply.status_code != 200:
            await self._http_failure(reply, outcome)
            return None
        return reply.json()

    async def _response_stream(self, body: dict, outcome: Outcome) -> dict | None:
        """The events in order (sequence numbers from 0), text deltas adding up to the final response's text."""
        final, numbers, text = None, [], ""
        timeout = httpx.Timeout(600, read=self.hang_s)
        async with self.http.stream("POST", "/responses", json={**body, "stream": True}, timeout=timeout) as reply:
            if reply.status_code != 200:
                await self._http_failure(reply, outcome)
                return None
            async for data in self._sse_data(reply):
                event = json.loads(data)
                numbers.append(event["sequence_number"])
                if event["type"] == "response.output_text.delta":
                    text += event["delta"]
                elif event["type"] == "error":
                    outcome.status, outcome.code, outcome.error = "failed", str(event["code"]), event["message"]
                elif event["type"] in ("response.completed", "response.incomplete", "response.failed"):
                    final = event["response"]
        if outcome.status != "ok":
            return None
        if final is None:
            outcome.status, outcome.error = "lost", "the stream ended without its last response event"
            return None
        if numbers != list(range(len(numbers))):
            outcome.problems.append(f"sequence numbers {numbers[:20]} are not 0, 1, 2, ...")
        shown = "".join(
            part["text"] for item in final["output"] if item["type"] == "message" for part in item["content"]
        )
        if shown != text:
            outcome.problems.append(f"deltas {text!r:.80} are not the response's text {shown!r:.80}")
        return final

    async def _http_failure(self, reply, outcome: Outcome) -> None:
        raw = await reply.aread()
        try:
            error = json.loads(raw)["error"]
            message, code = error.get("message", ""), str(error.get("code"))
        except (ValueError, KeyError, TypeError):
            message, code = raw[:200].decode(errors="replace"), ""
        outcome.status = "refused" if reply.status_code == 429 else "failed"
        outcome.code, outcome.error = f"HTTP {reply.status_code} {code}", message

    async def _image(self, kind: str, rng: random.Random) -> Outcome:
        outcome = Outcome(kind, surface="image", started=time.monotonic())
        seed = rng.choice([1, 2, 3, self._seed()])
        prompt = f"a handwritten {rng.choice(['zero', 'three', 'seven', 'nine'])}"
        request = diffusion_pb2.ImageRequest(prompt=prompt, steps=rng.randint(2, 5), seed=seed, num_images=1)
        try:
            if kind == "image_grpc":
                call = self.stub.GenerateImage(request, timeout=600)
                last = outcome.started
                while True:
                    message = await asyncio.wait_for(call.read(), self.hang_s)
                    if message is grpc.aio.EOF:
                        break
                    last = self._mark(outcome, time.monotonic(), last)
                    if message.WhichOneof("kind") == "image":
                        outcome.images.append(_pixels(message.image.png))
            else:
                body = {"prompt": prompt, "n": 1, "steps": request.steps, "seed": seed, "response_format": "b64_json"}
                reply = await self.http.post("/images/generations", json=body, timeout=self.hang_s * 2)
                if reply.status_code != 200:
                    await self._http_failure(reply, outcome)
                    return outcome
                outcome.images = [_pixels(base64.b64decode(d["b64_json"])) for d in reply.json()["data"]]
        except asyncio.TimeoutError:
            outcome.status, outcome.error = "hung", f"no progress for {self.hang_s:.0f} s"
        except grpc.aio.AioRpcError as exc:
            outcome.code, outcome.error = exc.code().name, exc.details() or ""
            outcome.status = "refused" if exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED else "failed"
        except httpx.HTTPError as exc:
            outcome.status, outcome.code, outcome.error = "failed", "HTTP", f"{type(exc).__name__}: {exc}"
        outcome.ended = time.monotonic()
        if outcome.status == "ok":
            if len(outcome.images) != 1:
                outcome.problems.append(f"{len(outcome.images)} images for num_images 1")
            key = (prompt, request.steps, seed)
            previous = self.image_replays.setdefault(key, outcome)
            if previous is not outcome and previous.images != outcome.images:
                outcome.problems.append(f"image for {key} differs from the same request's earlier image")
        return outcome

    # -- checks that need nothing but the response ----------------------------------------------

    def _check_shape(self, outcome: Outcome) -> None:
        spec = outcome.spec
        problems = outcome.problems
        indices = sorted(outcome.finish)
        if indices != list(range(spec.n)):
            problems.append(f"completions {indices} for n={spec.n}")
        for i in indices:
            finish = outcome.finish[i]
            if finish not in ("stop", "length"):
                problems.append(f"choice {i} finish_reason {finish!r}")
            # A finished constrained text is in its language, unless a stop string cut it (gRPC says which
            # one did; HTTP does not, so there a request with stop strings is not checked).
            cut = outcome.stop_reason.get(i, "") in spec.stop if outcome.surface == "grpc" else bool(spec.stop)
            if spec.constraint is not None and finish == "stop" and not cut:
                wrong = spec.check_text(outcome.texts.get(i, ""))
                if wrong:
                    problems.append(f"choice {i}: {wrong}")
        if outcome.surface == "grpc":
            for i in indices:
                ids = outcome.ids.get(i, [])
                if outcome.completion_tokens.get(i) != len(ids):
                    problems.append(
                        f"choice {i}: usage says {outcome.completion_tokens.get(i)} tokens, {len(ids)} came"
                    )
                if len(ids) > spec.max_tokens:
                    problems.append(f"choice {i}: {len(ids)} tokens for max_tokens {spec.max_tokens}")
                if spec.logprobs and not spec.beam and len(outcome.logprob_tokens.get(i, [])) != len(ids):
                    problems.append(f"choice {i}: {len(outcome.logprob_tokens.get(i, []))} logprobs for {len(ids)} ids")
        elif spec.logprobs and outcome.usage_completion_tokens is not None:
            # usage counts the EOS or stop token that ended a choice; its text and logprobs leave it out
            counted = sum(len(outcome.logprob_tokens.get(i, [])) for i in indices)
            ended = sum(outcome.finish[i] == "stop" for i in indices)
            if not outcome.usage_completion_tokens - ended <= counted <= outcome.usage_completion_tokens:
                problems.append(
                    f"{counted} logprob entries for usage.completion_tokens {outcome.usage_completion_tokens}"
                    f" ({ended} choices ended by a stop)"
                )

    def _compare_replay(self, outcome: Outcome) -> None:
        """A replay of an argmax request (greedy, beam search) must equal its original; sampled ones are counted.

        A seed fixes every draw, but a sampled token can still change when the logits change in their last
        bits, and on the default fp16 model they do with the batch's padded length (docs/architecture.md).
        """
        original = outcome.replay_of
        same = outcome.signature() == original.signature()
        if original.spec.argmax:
            self.replays["argmax same" if same else "argmax different"] += 1
            if not same:
                outcome.problems.append(
                    f"replay differs from its original ({original.kind}): "
                    f"{outcome.signature()!r:.300} vs {original.signature()!r:.300}"
                )
        else:
            self.replays["sampled same" if same else "sampled different"] += 1


def _pixels(png: bytes) -> bytes:
    from PIL import Image

    with Image.open(io.BytesIO(png)) as image:
        return image.convert("RGB").tobytes()


DEFAULT_KINDS = {
    "grpc_stream": 25,
    "grpc_json": 10,
    "grpc_chat": 5,
    "grpc_beam": 5,
    "grpc_cancel": 5,
    "http_stream": 15,
    "http": 10,
    "http_cancel": 4,
    "http_responses": 4,
    "replay": 20,
    "image_grpc": 3,
    "image_http": 2,
}


# -- checks against the tokenizer, after the run --------------------------------------------------


async def check_text(outcomes: list[Outcome], tokenizer: str, token: str, tokenizer_model: str = "") -> int:
    """Each gRPC completion's text against the tokenizer's decode of its ids (stop strings applied).

    `token` is the stack's internal token, which the tokenizer asks of every caller. Returns how many
    completions were checked; problems are added to the outcomes.
    """
    checked = 0
    async with grpc.aio.insecure_channel(tokenizer, interceptors=metadata_interceptors(token)) as channel:
        stub = tokenizer_pb2_grpc.TokenizerStub(channel)
        for outcome in outcomes:
            if outcome.status != "ok" or not outcome.ids or outcome.spec is None or outcome.spec.beam:
                continue
            prompt_ids = await _prompt_ids(stub, tokenizer_model, outcome.spec)
            for i, ids in outcome.ids.items():
                expected = await _expected_text(stub, tokenizer_model, prompt_ids, ids, outcome.spec.stop)
                checked += 1
                if outcome.texts.get(i, "") != expected:
                    outcome.problems.append(
                        f"choice {i}: deltas {outcome.texts.get(i, '')!r:.120} != decode of its ids {expected!r:.120}"
                    )
    return checked


async def _prompt_ids(stub, model: str, spec: Spec) -> list[int]:
    if spec.messages is not None:
        from muestra.v1 import common_pb2

        messages = [common_pb2.ChatMessage(role=m["role"], content=m["content"]) for m in spec.messages]
        reply = await stub.ApplyChatTemplate(
            tokenizer_pb2.ApplyChatTemplateRequest(
                model=model, messages=messages, add_generation_prompt=True, tokenize=True
            ),
            timeout=30,
        )
        return list(reply.ids)
    reply = await stub.Encode(tokenizer_pb2.EncodeRequest(model=model, texts=[spec.prompt]), timeout=30)
    return list(reply.encodings[0].ids)


async def _expected_text(stub, model: str, prompt_ids: list[int], ids: list[int], stops: list[str]) -> str:
    sequences = [tokenizer_pb2.TokenIds(ids=prompt_ids), tokenizer_pb2.TokenIds(ids=prompt_ids + ids)]
    reply = await stub.Decode(
        tokenizer_pb2.DecodeTokensRequest(model=model, sequences=sequences, skip_special_tokens=True), timeout=30
    )
    before, after = reply.texts
    text = after[len(before) :] if after.startswith(before) else after
    cut = min((text.find(s) for s in stops if s in text), default=-1)
    return text[:cut] if cut >= 0 else text


# -- the report ------------------------------------------------------------------------------------


def percentiles(values: list[float], points=(50, 95, 99)) -> dict[int, float]:
    if not values:
        return {p: float("nan") for p in points}
    ordered = sorted(values)
    return {p: ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))] for p in points}


def summarize(outcomes: list[Outcome]) -> dict:
    by_status = Counter(o.status for o in outcomes)
    wrong = [o for o in outcomes if o.problems]
    by_kind = Counter((o.kind, o.status) for o in outcomes)
    ttft = [o.first_at - o.started for o in outcomes if o.first_at is not None and o.latency_kind()]
    gaps = [g for o in outcomes for g in o.gaps if o.latency_kind()]
    return {
        "requests": len(outcomes),
        "by_status": dict(by_status),
        "wrong": len(wrong),
        "by_kind": {f"{k}/{s}": n for (k, s), n in sorted(by_kind.items())},
        "prefix_cache_hits": sum(1 for o in outcomes if o.cached_tokens > 0),
        "replays": sum(1 for o in outcomes if o.replay_of is not None),
        "ttft_ms": {p: v * 1000 for p, v in percentiles(ttft).items()},
        "itl_ms": {p: v * 1000 for p, v in percentiles(gaps).items()},
        "examples": [o.describe() + " | " + "; ".join(o.problems)[:400] for o in wrong[:5]]
        + [o.describe() for o in outcomes if o.status in ("failed", "lost", "hung")][:5],
    }

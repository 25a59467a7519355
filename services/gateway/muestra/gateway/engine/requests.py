"""The seam between the API side and the engine: a text request as the engine takes it, typed, whichever edge
(gRPC, HTTP) it came from, and its field checks, made once, here.

The edges turn their own bodies into a TextRequest (rpc/server.py from a GenerateRequest, http/openai/convert.py
from an OpenAI body) and map the engine's errors (InvalidArgument naming a field here) to their own shapes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from muestra.runtime.errors import InvalidArgument, check_limit

# Longest prompt_cache_key, in characters.
MAX_PROMPT_CACHE_KEY = 256


@dataclass(frozen=True)
class Message:
    """One turn of a conversation, as the model's chat template reads it."""

    role: str
    content: str = ""
    name: str = ""
    tool_calls_json: str = ""
    tool_call_id: str = ""


@dataclass(frozen=True)
class Step:
    """A named plugin and its params as the request gave them: a sampler, a constraint, a proposer."""

    name: str
    params: dict[str, Any] = field(default_factory=dict)


@dataclass
class TextRequest:
    """One text generation: a prompt or a conversation, how to pick its tokens and when to stop.

    Unset values mean what the proto's absent fields mean: the model's default chain (no samplers), a random seed
    (seed None), the model's own special-token handling (add_special_tokens None), the gateway's default
    speculation (speculation None).
    """

    model: str = ""
    prompt: str | None = None
    messages: tuple[Message, ...] | None = None
    tools_json: str = ""
    max_tokens: int = 0
    samplers: tuple[Step, ...] = ()
    n: int = 1
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    logprobs: bool = False
    top_logprobs: int = 0
    ignore_eos: bool = False
    allow_special_tokens: bool = False
    add_special_tokens: bool | None = None
    include_stop_str_in_output: bool = False
    constraint: Step | None = None
    speculation: Step | None = None
    timeout_ms: int = 0
    disable_prefix_cache: bool = False
    prompt_cache_key: str = ""

    @property
    def input_field(self) -> str | None:
        """Which input the request gives: "prompt", "messages", or None."""
        if self.messages is not None:
            return "messages"
        return "prompt" if self.prompt is not None else None

    @property
    def chat(self) -> bool:
        return self.messages is not None


@dataclass(frozen=True)
class Limits:
    """The gateway's limits on a text request (its flags)."""

    max_n: int
    max_top_logprobs: int
    max_stop_strings: int
    max_stop_bytes: int
    max_prompt_bytes: int


def utf8_len(text: str) -> int:
    return len(text.encode("utf-8", errors="surrogatepass"))


def check_fields(request: TextRequest, limits: Limits) -> None:
    """Every check a text request's fields get before the engine spends anything on it; InvalidArgument names the
    field and the limit. (The sampler, constraint and proposer params are checked by their plugins.)"""
    check_limit("n", request.n or 1, 1, limits.max_n)
    check_limit("top_logprobs", request.top_logprobs, 0, limits.max_top_logprobs)
    check_limit("stop", len(request.stop), 0, limits.max_stop_strings)
    for i, stop in enumerate(request.stop):
        if not stop:
            raise InvalidArgument(f"stop[{i}]", "is empty")
        if utf8_len(stop) > limits.max_stop_bytes:
            raise InvalidArgument(f"stop[{i}]", f"is {utf8_len(stop)} bytes; the limit is {limits.max_stop_bytes}")
    kind = request.input_field
    if kind is None:
        raise InvalidArgument("prompt", "give a prompt or messages")
    if kind == "prompt":
        if not request.prompt:
            raise InvalidArgument("prompt", "is empty")
        size = utf8_len(request.prompt)
    else:
        if not request.messages:
            raise InvalidArgument("messages", "is empty")
        size = sum(utf8_len(m.content) for m in request.messages)
    if size > limits.max_prompt_bytes:
        raise InvalidArgument(kind, f"is {size} bytes; the limit is {limits.max_prompt_bytes}")
    if request.tools_json:
        if kind != "messages":
            raise InvalidArgument("tools_json", "needs messages: tools go to the chat template")
        size = utf8_len(request.tools_json)
        if size > limits.max_prompt_bytes:
            raise InvalidArgument("tools_json", f"is {size} bytes; the limit is {limits.max_prompt_bytes}")
    if len(request.prompt_cache_key) > MAX_PROMPT_CACHE_KEY:
        raise InvalidArgument(
            "prompt_cache_key", f"is {len(request.prompt_cache_key)} characters; at most {MAX_PROMPT_CACHE_KEY}"
        )

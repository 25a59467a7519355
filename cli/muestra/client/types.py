"""What the client returns, and how its keyword arguments become a GenerateRequest."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from google.protobuf import struct_pb2

from muestra.v1 import common_pb2, gateway_pb2

FINISH_REASONS = {
    gateway_pb2.STOP: "stop",
    gateway_pb2.LENGTH: "length",
    gateway_pb2.CANCELLED: "cancelled",
    gateway_pb2.ERROR: "error",
}


@dataclasses.dataclass
class Delta:
    """New text of completion `index`, with the ids (and logprobs) produced since the last delta."""

    index: int
    text: str
    token_ids: list[int]
    logprobs: list[dict] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class Completion:
    """The final stats of completion `index`."""

    index: int
    finish_reason: str
    stop_reason: str
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    queue_ms: float
    ttft_ms: float
    total_ms: float
    tokens_per_s: float
    seed: int
    replica: str
    error: str = ""
    forced_tokens: int = 0
    # Speculative decoding: draft tokens the lm scored, and those the sampler chain accepted.
    draft_tokens: int = 0
    accepted_draft_tokens: int = 0

    @classmethod
    def from_proto(cls, index: int, done: gateway_pb2.Completion) -> Completion:
        return cls(
            index=index,
            finish_reason=FINISH_REASONS.get(done.finish_reason, "unspecified"),
            stop_reason=done.stop_reason,
            prompt_tokens=done.usage.prompt_tokens,
            completion_tokens=done.usage.completion_tokens,
            cached_tokens=done.usage.cached_tokens,
            queue_ms=done.timings.queue_ms,
            ttft_ms=done.timings.ttft_ms,
            total_ms=done.timings.total_ms,
            tokens_per_s=done.timings.tokens_per_s,
            seed=done.seed,
            replica=done.replica,
            error=done.error,
            forced_tokens=done.usage.forced_tokens,
            draft_tokens=done.usage.draft_tokens,
            accepted_draft_tokens=done.usage.accepted_draft_tokens,
        )


class GenerationState:
    """What a Generation has received so far; shared by the blocking and the asyncio clients."""

    def __init__(self) -> None:
        self.completions: dict[int, Completion] = {}
        self.texts: dict[int, str] = {}
        self.token_ids: dict[int, list[int]] = {}

    def absorb(self, message: gateway_pb2.GenerateResponse) -> Delta | None:
        """Record one streamed message; the Delta to hand the caller, or None for a final one."""
        if message.HasField("done"):
            self.completions[message.index] = Completion.from_proto(message.index, message.done)
            return None
        delta = delta_from_proto(message.index, message.delta)
        self.texts[delta.index] = self.texts.get(delta.index, "") + delta.text
        self.token_ids.setdefault(delta.index, []).extend(delta.token_ids)
        return delta


def delta_from_proto(index: int, delta: gateway_pb2.TextDelta) -> Delta:
    logprobs = [
        {
            "token_id": lp.token_id,
            "token": lp.token,
            "logprob": lp.logprob,
            "top": [{"token_id": t.token_id, "token": t.token, "logprob": t.logprob} for t in lp.top],
        }
        for lp in delta.logprobs
    ]
    return Delta(index, delta.text, list(delta.token_ids), logprobs)


# Convenience keyword -> (sampler name, parameter name), in transformers' processor order.
_PROCESSOR_KWARGS = (
    ("repetition_penalty", "repetition_penalty"),
    ("presence_penalty", "presence_penalty"),
    ("frequency_penalty", "frequency_penalty"),
    ("logit_bias", "logit_bias"),
    ("temperature", "temperature"),
    ("top_k", "top_k"),
    ("top_p", "top_p"),
    ("min_p", "min_p"),
    ("typical_p", "typical_p"),
)


def sampler_chain(samplers: Sequence[Mapping[str, Any]] | None = None, **kwargs: Any) -> list[dict]:
    """An explicit chain wins; else one built from temperature/top_p/... (temperature 0: greedy)."""
    if samplers:
        return [{"name": s["name"], "params": dict(s.get("params") or {})} for s in samplers]
    given = {key: value for key, value in kwargs.items() if value is not None}
    if not given:
        return []  # the model's generation_config.json decides
    if given.get("temperature") == 0:
        chain = [{"name": name, "params": {name: given[name]}} for name, _ in _PROCESSOR_KWARGS[:4] if name in given]
        return [*chain, {"name": "greedy", "params": {}}]
    chain = [{"name": name, "params": {param: given[name]}} for name, param in _PROCESSOR_KWARGS if name in given]
    return [*chain, {"name": "sample", "params": {}}]


def chat_messages(messages: Iterable[Mapping[str, str]]) -> common_pb2.ChatMessages:
    return common_pb2.ChatMessages(
        messages=[common_pb2.ChatMessage(role=m["role"], content=m["content"]) for m in messages]
    )


def _set_input(request, prompt: str | None, messages: Iterable[Mapping[str, str]] | None) -> None:
    """The request's prompt or chat messages (the same oneof in GenerateRequest and TokenizeRequest)."""
    if messages is not None:
        request.messages.CopyFrom(chat_messages(messages))
    else:
        request.prompt = prompt or ""


def build_tokenize_request(
    prompt: str | None, messages: Iterable[Mapping[str, str]] | None, model: str, add_special_tokens: bool | None
) -> gateway_pb2.TokenizeRequest:
    request = gateway_pb2.TokenizeRequest(model=model)
    _set_input(request, prompt, messages)
    if add_special_tokens is not None:
        request.add_special_tokens = add_special_tokens
    return request


def build_request(
    prompt: str | None,
    messages: Iterable[Mapping[str, str]] | None,
    *,
    model: str = "",
    max_tokens: int = 0,
    stop: Sequence[str] = (),
    stop_token_ids: Sequence[int] = (),
    seed: int | None = None,
    n: int = 1,
    logprobs: bool = False,
    top_logprobs: int = 0,
    ignore_eos: bool = False,
    timeout_ms: int = 0,
    samplers: Sequence[Mapping[str, Any]] | None = None,
    constraint: Mapping[str, Any] | None = None,
    allow_special_tokens: bool = False,
    speculation: str | Mapping[str, Any] | None = None,
    **sampling: Any,
) -> gateway_pb2.GenerateRequest:
    """A GenerateRequest. `constraint` is {"name": kind, "params": {...}}, e.g.
    {"name": "json_schema", "params": {"schema": {...}}}; the sampling keywords build the chain.
    `speculation` is a proposer's name ("ngram", "off") or {"proposer": name, "params": {...}}; None leaves
    it to the gateway."""
    request = gateway_pb2.GenerateRequest(
        model=model,
        max_tokens=max_tokens,
        stop=list(stop),
        stop_token_ids=list(stop_token_ids),
        n=n,
        logprobs=logprobs,
        top_logprobs=top_logprobs,
        ignore_eos=ignore_eos,
        timeout_ms=timeout_ms,
        allow_special_tokens=allow_special_tokens,
    )
    _set_input(request, prompt, messages)
    if seed is not None:
        request.seed = seed
    for spec in sampler_chain(samplers, **sampling):
        params = struct_pb2.Struct()
        params.update(spec["params"])
        request.samplers.append(gateway_pb2.SamplerSpec(name=spec["name"], params=params))
    if constraint is not None:
        request.constraint.SetInParent()
        request.constraint.name = constraint["name"]
        params = dict(constraint.get("params") or {})
        if constraint["name"] == "json_schema" and isinstance(params.get("schema"), Mapping):
            # As JSON text: a Struct would lose the order of the properties, which the output follows.
            params["schema"] = json.dumps(params["schema"])
        request.constraint.params.update(params)
    if speculation is not None:
        if isinstance(speculation, str):
            speculation = {"proposer": speculation}
        request.speculation.SetInParent()
        request.speculation.proposer = speculation["proposer"]
        if speculation.get("params"):
            request.speculation.params.update(dict(speculation["params"]))
    return request

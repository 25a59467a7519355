"""Gateway messages (GenerateResponse) as OpenAI's responses and stream chunks.

A request may run several generations (a list prompt): choice `k * n + i` is completion `i` of prompt `k`.
"""

from __future__ import annotations

import codecs
import collections
import time

from muestra.gateway.http.openai.tools import ToolCallDeltas, message_with_calls
from muestra.v1 import gateway_pb2

FINISH_REASONS = {
    gateway_pb2.STOP: "stop",
    gateway_pb2.LENGTH: "length",
    gateway_pb2.CANCELLED: "cancelled",
    gateway_pb2.ERROR: "error",
}


def finish_reason(done: gateway_pb2.Completion, called: bool = False) -> str:
    """OpenAI's finish_reason; `called`: the text holds tool calls, and a stopped one ended with them."""
    reason = FINISH_REASONS.get(done.finish_reason, "stop")
    return "tool_calls" if called and reason == "stop" else reason


def token_bytes(entry) -> list[int]:
    """A logprob entry's own bytes (part of a character stays a part); an entry from a gateway that has none
    falls back to its text's."""
    return list(entry.token_bytes or entry.token.encode())


def _top(entry: gateway_pb2.TopLogprob) -> dict:
    return {"token": entry.token, "logprob": entry.logprob, "bytes": token_bytes(entry)}


def chat_logprobs(entries) -> dict:
    """choices[].logprobs of chat: {"content": [{token, logprob, bytes, top_logprobs}]}; the entries' bytes
    concatenate to the content's UTF-8, as OpenAI's and vLLM's do."""
    return {
        "content": [
            {
                "token": e.token,
                "logprob": e.logprob,
                "bytes": token_bytes(e),
                "top_logprobs": [_top(t) for t in e.top],
            }
            for e in entries
        ],
        "refusal": None,
    }


def legacy_logprobs(entries, offset: int, decoder=None) -> tuple[dict, int]:
    """choices[].logprobs of /v1/completions (tokens, token_logprobs, top_logprobs, text_offset), next offset.

    text_offset counts characters: a token that holds part of a character starts where that character does.
    `decoder` (an incremental UTF-8 decoder) carries a character cut between two calls of one stream."""
    decoder = decoder or codecs.getincrementaldecoder("utf-8")(errors="replace")
    tokens, token_logprobs, tops, offsets = [], [], [], []
    for e in entries:
        tokens.append(e.token)
        token_logprobs.append(e.logprob)
        tops.append({t.token: t.logprob for t in e.top})
        offsets.append(offset)
        offset += len(decoder.decode(bytes(token_bytes(e))))
    body = {"tokens": tokens, "token_logprobs": token_logprobs, "top_logprobs": tops, "text_offset": offsets}
    return body, offset


class Choices:
    """The state of every choice of one request: text so far, logprobs, and how each ended."""

    def __init__(self, chat: bool, prompts: list[str], n: int, echo: bool = False) -> None:
        self.chat = chat
        self.prompts = prompts
        self.n = n
        self.echo = echo
        self.texts: dict[int, list[str]] = collections.defaultdict(list)
        self.logprobs: dict[int, list] = collections.defaultdict(list)
        self.offsets: dict[int, int] = {}
        self.decoders: dict[int, codecs.IncrementalDecoder] = {}  # per streamed choice: legacy_logprobs
        self.done: dict[int, gateway_pb2.Completion] = {}
        self.want_logprobs = False
        # Tokens that end a completion without adding text (EOS, stop_token_ids): no logprob entry, as
        # OpenAI gives none; the gRPC API keeps them (one entry per id there).
        self.ending_ids: frozenset[int] = frozenset()
        # Chat with tools the model may call: the text is read for tool calls (muestra.gateway.engine.tool_calls).
        self.tool_calls = False
        self.tool_deltas: dict[int, ToolCallDeltas] = collections.defaultdict(ToolCallDeltas)

    def text_logprobs(self, entries) -> list:
        return [e for e in entries if e.token_id not in self.ending_ids]

    def prompt_of(self, choice: int) -> str:
        return self.prompts[choice // self.n]

    def add(self, choice: int, message: gateway_pb2.GenerateResponse) -> None:
        if message.HasField("done"):
            self.done[choice] = message.done
        else:
            self.texts[choice].append(message.delta.text)
            self.logprobs[choice].extend(self.text_logprobs(message.delta.logprobs))

    def usage(self) -> dict:
        """Prompt tokens count once per prompt (its n completions share the prefill)."""
        completion = 0
        per_prompt: dict[int, tuple[int, int]] = {}
        for choice, done in self.done.items():
            completion += done.usage.completion_tokens
            per_prompt[choice // self.n] = (done.usage.prompt_tokens, done.usage.cached_tokens)
        prompt = sum(tokens for tokens, _ in per_prompt.values())
        cached = sum(cached for _, cached in per_prompt.values())
        return {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": cached},
        }

    def errors(self) -> list[str]:
        return [
            done.error or "generation failed" for done in self.done.values() if done.finish_reason == gateway_pb2.ERROR
        ]

    # -- whole responses ----------------------------------------------------------------------

    def choice_bodies(self) -> list[dict]:
        bodies = []
        for choice in sorted(self.done):
            done = self.done[choice]
            text = "".join(self.texts[choice])
            body: dict = {"index": choice}
            called = False
            if self.chat:
                if self.tool_calls:
                    body["message"] = message_with_calls(text)
                    called = "tool_calls" in body["message"]
                else:
                    body["message"] = {"role": "assistant", "content": text, "refusal": None}
                body["logprobs"] = chat_logprobs(self.logprobs[choice]) if self.want_logprobs else None
            else:
                prefix = self.prompt_of(choice) if self.echo else ""
                body["text"] = prefix + text
                body["logprobs"] = (
                    legacy_logprobs(self.logprobs[choice], len(prefix))[0] if self.want_logprobs else None
                )
            body["finish_reason"] = finish_reason(done, called)
            body["stop_reason"] = done.stop_reason or None
            bodies.append(body)
        return bodies

    # -- stream chunks ------------------------------------------------------------------------

    def opening_deltas(self, choices: int) -> list[dict]:
        """Chat: each choice's first chunk carries the role. Completions with echo: the prompt."""
        if self.chat:
            return [
                {"index": i, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}
                for i in range(choices)
            ]
        if self.echo:
            return [
                {"index": i, "text": self.prompt_of(i), "logprobs": None, "finish_reason": None} for i in range(choices)
            ]
        return []

    def delta_choice(self, choice: int, delta: gateway_pb2.TextDelta) -> dict | None:
        """One chunk's choice for a delta; None when there is nothing to send (no text, no logprobs)."""
        entries = self.text_logprobs(delta.logprobs) if self.want_logprobs else []
        if self.chat and self.tool_calls:
            message = self.tool_deltas[choice].delta(delta.text)
            if not message and not entries:
                return None
            logprobs = chat_logprobs(entries) if self.want_logprobs else None
            return {"index": choice, "delta": message, "logprobs": logprobs, "finish_reason": None}
        if not delta.text and not entries:
            return None
        if self.chat:
            logprobs = chat_logprobs(entries) if self.want_logprobs else None
            return {"index": choice, "delta": {"content": delta.text}, "logprobs": logprobs, "finish_reason": None}
        logprobs = None
        if self.want_logprobs:
            start = self.offsets.get(choice, len(self.prompt_of(choice)) if self.echo else 0)
            decoder = self.decoders.setdefault(choice, codecs.getincrementaldecoder("utf-8")(errors="replace"))
            logprobs, self.offsets[choice] = legacy_logprobs(entries, start, decoder)
        return {"index": choice, "text": delta.text, "logprobs": logprobs, "finish_reason": None}

    def final_choice(self, choice: int, done: gateway_pb2.Completion) -> dict:
        body: dict = {"index": choice, "logprobs": None, "finish_reason": finish_reason(done)}
        if self.chat and self.tool_calls:  # what was held back in case it began a marker, and the reason
            deltas = self.tool_deltas[choice]
            body["delta"] = deltas.delta("", final=True)
            body["finish_reason"] = finish_reason(done, deltas.called)
        elif self.chat:
            body["delta"] = {}
        else:
            body["text"] = ""
        body["stop_reason"] = done.stop_reason or None
        return body


def envelope(kind: str, request_id: str, model: str, fingerprint: str, created: int | None = None) -> dict:
    """The fields every response and chunk starts with."""
    prefix = "chatcmpl" if kind.startswith("chat") else "cmpl"
    return {
        "id": f"{prefix}-{request_id}",
        "object": kind,
        "created": created if created is not None else int(time.time()),
        "model": model,
        "system_fingerprint": fingerprint,
    }

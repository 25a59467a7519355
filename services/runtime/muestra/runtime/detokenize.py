"""The caller's side of DetokenizeStep: one stream's ids and offsets between decode steps.

    state = DetokenizeState()                     # or DetokenizeState.after_prompt(prompt_ids)
    state.append(next_id)
    request.streams.append(state.next_stream())   # one DetokenizeStream per active stream
    text = state.apply(reply.deltas[i])           # "" while the ids end inside a character
    ...
    request.streams.append(state.next_stream(final=True))   # the last step flushes the rest

It lives in the runtime, not in the tokenizer service, so that the gateway (the caller) can
use it without installing the tokenizer libraries.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from muestra.v1 import tokenizer_pb2

# How many prompt ids before the first generated id give the decoder its context (vLLM's choice).
PROMPT_CONTEXT_IDS = 5


class DetokenizeState:
    """ids[prefix_offset:] is the window sent each step; ids[:read_offset] have been emitted."""

    def __init__(self, ids: Iterable[int] = (), prefix_offset: int = 0, read_offset: int | None = None) -> None:
        self.ids: list[int] = list(ids)
        self.prefix_offset = prefix_offset
        self.read_offset = len(self.ids) if read_offset is None else read_offset
        if not 0 <= self.prefix_offset <= self.read_offset <= len(self.ids):
            raise ValueError(f"need 0 <= prefix_offset <= read_offset <= len(ids), got {prefix_offset}, {read_offset}")

    @classmethod
    def after_prompt(cls, prompt_ids: Sequence[int], context: int = PROMPT_CONTEXT_IDS) -> DetokenizeState:
        """A stream whose text continues the prompt: its last `context` ids start the window, unemitted.

        The deltas then concatenate to decode(prompt + generated) minus decode(prompt), so a
        generated word that starts with a space keeps it even where a decoder strips the space
        at the start of a text (SentencePiece, Metaspace).
        """
        tail = list(prompt_ids[-context:]) if context > 0 else []
        return cls(tail, prefix_offset=0, read_offset=len(tail))

    def append(self, ids: int | Iterable[int]) -> None:
        """Add newly generated ids."""
        if isinstance(ids, int):
            self.ids.append(ids)
        else:
            self.ids.extend(ids)

    def next_stream(
        self, final: bool = False, request_id: str = "", skip_special_tokens: bool | None = None
    ) -> tokenizer_pb2.DetokenizeStream:
        """The DetokenizeStream for the next DetokenizeStep call (`request_id` names it in the tokenizer's log;
        `skip_special_tokens`, when given, overrides the step's choice for this stream)."""
        stream = tokenizer_pb2.DetokenizeStream(
            ids=self.ids[self.prefix_offset :],
            read_offset=self.read_offset - self.prefix_offset,
            final=final,
            request_id=request_id,
        )
        if skip_special_tokens is not None:
            stream.skip_special_tokens = skip_special_tokens
        return stream

    def apply(self, delta: tokenizer_pb2.DetokenizeDelta) -> str:
        """Advance the offsets as the service says and return the new text.

        Ids appended after next_stream() was built stay pending: the advances are relative to the
        start of the window that was sent, which has not moved.
        """
        window_start = self.prefix_offset
        self.prefix_offset = window_start + delta.prefix_advance
        self.read_offset = window_start + delta.read_advance
        return delta.text

    @property
    def pending(self) -> int:
        """Ids not yet turned into text."""
        return len(self.ids) - self.read_offset

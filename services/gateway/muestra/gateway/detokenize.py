"""The caller's side of the tokenizer's stateless streaming detokenization (DetokenizeStep)."""

from __future__ import annotations

from muestra.v1 import tokenizer_pb2

# How many prompt ids start the window, so that the first generated token keeps its leading
# space where a decoder strips it at the start of a text (vLLM's choice).
CONTEXT_IDS = 5


class DetokenizeState:
    """One stream's ids and offsets; the tokenizer service keeps no state between steps."""

    def __init__(self, context_ids: list[int] | None = None) -> None:
        # Optional context (e.g. the last prompt ids) so that the first generated token keeps its
        # leading space; that context itself is never emitted.
        self.ids: list[int] = list(context_ids or [])[-CONTEXT_IDS:]
        self.prefix_offset = 0
        self.read_offset = len(self.ids)

    def add(self, ids: list[int]) -> None:
        self.ids.extend(ids)

    def pending(self) -> bool:
        return self.read_offset < len(self.ids)

    def stream(self, final: bool = False) -> tokenizer_pb2.DetokenizeStream:
        return tokenizer_pb2.DetokenizeStream(
            ids=self.ids[self.prefix_offset :], read_offset=self.read_offset - self.prefix_offset, final=final
        )

    def apply(self, delta: tokenizer_pb2.DetokenizeDelta) -> str:
        """Move the offsets as the service says (both relative to the start of the window sent)."""
        window_start = self.prefix_offset
        self.prefix_offset = window_start + delta.prefix_advance
        self.read_offset = window_start + delta.read_advance
        # Ids before the prefix offset are never sent again.
        del self.ids[: self.prefix_offset]
        self.read_offset -= self.prefix_offset
        self.prefix_offset = 0
        return delta.text

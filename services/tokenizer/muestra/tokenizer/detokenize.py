"""Stateless incremental detokenization, one step for many streams (TGI's and vLLM's algorithm).

A stream's window is ids[prefix:], and ids[prefix:read] have been emitted already. Decoding the
window twice, without and with the new ids, and keeping the difference gives the new text with
the context the decoder needs (leading spaces, byte-level merges). While the new text ends in
U+FFFD the ids end inside a UTF-8 character, so nothing is emitted until a later id completes it
(or the stream's final step flushes it). Every decoder `tokenizers` and sentencepiece ship decodes
each token independently of what follows it, so the deltas concatenate to the full decode.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from muestra.tokenizer.backend import TokenizerBackend

REPLACEMENT_CHARACTER = "\ufffd"


@dataclasses.dataclass
class Window:
    ids: Sequence[int]
    read_offset: int
    final: bool = False
    skip_special_tokens: bool | None = None  # None: the step's own choice


@dataclasses.dataclass
class Delta:
    text: str
    # New prefix and read offsets, relative to the start of the window that was sent.
    prefix_advance: int
    read_advance: int


def detokenize_step(backend: TokenizerBackend, windows: Sequence[Window], skip_special_tokens: bool) -> list[Delta]:
    """One Delta per window; both decodes of every window go to the backend as one batch (one per choice of
    skip_special_tokens among the windows)."""
    texts: list[str] = [""] * (2 * len(windows))
    for skip in (True, False):
        chosen = [
            i
            for i, window in enumerate(windows)
            if (skip_special_tokens if window.skip_special_tokens is None else window.skip_special_tokens) == skip
        ]
        if not chosen:
            continue
        batch = [ids for i in chosen for ids in (windows[i].ids[: windows[i].read_offset], windows[i].ids)]
        decoded = backend.decode_batch(batch, skip_special_tokens=skip)
        for k, i in enumerate(chosen):
            texts[2 * i], texts[2 * i + 1] = decoded[2 * k], decoded[2 * k + 1]
    deltas = []
    for index, window in enumerate(windows):
        prefix_text, new_text = texts[2 * index], texts[2 * index + 1]
        complete = window.final or not new_text.endswith(REPLACEMENT_CHARACTER)
        if len(new_text) > len(prefix_text) and complete:
            deltas.append(Delta(new_text[len(prefix_text) :], window.read_offset, len(window.ids)))
        elif window.final:
            deltas.append(Delta("", window.read_offset, len(window.ids)))
        else:
            deltas.append(Delta("", 0, window.read_offset))
    return deltas

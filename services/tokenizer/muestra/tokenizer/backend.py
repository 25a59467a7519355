"""What a tokenizer library must offer the service: batched encode and decode, and its vocabulary."""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Sequence

# Below this many ids in all, a batch is decoded on the calling thread: waking a thread pool
# costs more than the work (a decode step's few short windows take microseconds).
SMALL_DECODE_IDS = 4096


def total_ids(sequences: Sequence[Sequence[int]]) -> int:
    return sum(len(s) for s in sequences)


@dataclasses.dataclass
class EncodedText:
    """One text's tokens; `offsets` are [start, end) character offsets, present only when asked for."""

    ids: list[int]
    tokens: list[str]
    offsets: list[tuple[int, int]] | None = None


class TokenizerBackend(abc.ABC):
    """A loaded tokenizer. Methods may be called from several threads at once."""

    # "tokenizers" or "sentencepiece", as Describe reports it.
    kind: str

    @property
    @abc.abstractmethod
    def vocab_size(self) -> int:
        """Number of ids, added tokens included; valid ids are [0, vocab_size)."""

    @property
    @abc.abstractmethod
    def special_token_ids(self) -> list[int]:
        """The ids decode drops with skip_special_tokens, ascending."""

    @abc.abstractmethod
    def token_to_id(self, token: str) -> int | None:
        """The id of a token string, or None when the vocabulary lacks it."""

    @abc.abstractmethod
    def id_to_token(self, token_id: int) -> str:
        """The token string of an id."""

    @abc.abstractmethod
    def encode_batch(self, texts: Sequence[str], add_special_tokens: bool, return_offsets: bool) -> list[EncodedText]:
        """Encode every text; one EncodedText per text, in order."""

    @abc.abstractmethod
    def decode_batch(self, sequences: Sequence[Sequence[int]], skip_special_tokens: bool) -> list[str]:
        """Decode every id sequence; one string per sequence, in order."""

    @abc.abstractmethod
    def token_bytes(self, token_id: int) -> bytes:
        """The bytes a token stands for on its own: a piece of a character stays a piece (no replacement
        character), so the bytes of a text's tokens concatenate to the text's UTF-8."""

    def decode_bytes(self, sequences: Sequence[Sequence[int]], skip_special_tokens: bool) -> list[bytes]:
        """Each id sequence as the concatenation of its tokens' bytes (special tokens left out when skipped)."""
        skipped = set(self.special_token_ids) if skip_special_tokens else set()
        return [b"".join(self.token_bytes(i) for i in ids if i not in skipped) for ids in sequences]

"""The `tokenizers` backend: anything a tokenizer.json describes (byte-level BPE, WordPiece, Unigram, …)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from tokenizers import Tokenizer

from muestra.tokenizer.backend import SMALL_DECODE_IDS, EncodedText, TokenizerBackend, total_ids


class TokenizersBackend(TokenizerBackend):
    """HuggingFace `tokenizers`; its batch calls release the GIL and fan out over Rust threads."""

    kind = "tokenizers"

    def __init__(self, tokenizer_json: Path) -> None:
        self.tokenizer = Tokenizer.from_file(str(tokenizer_json))
        # A tokenizer.json may carry training-time padding or truncation; serving wants neither.
        self.tokenizer.no_padding()
        self.tokenizer.no_truncation()
        self._vocab_size = self.tokenizer.get_vocab_size(with_added_tokens=True)
        # encode_batch_fast leaves Encoding.tokens empty; spelling ids from a table is cheap.
        self.tokens = [""] * self._vocab_size
        for token, token_id in self.tokenizer.get_vocab(with_added_tokens=True).items():
            if token_id < self._vocab_size:
                self.tokens[token_id] = token

    @property
    def vocab_size(self) -> int:
        return self._vocab_size

    @property
    def special_token_ids(self) -> list[int]:
        return sorted(i for i, token in self.tokenizer.get_added_tokens_decoder().items() if token.special)

    def to_json(self) -> str:
        """The tokenizer as tokenizer.json text (as loaded: no padding, no truncation)."""
        return self.tokenizer.to_str()

    def token_to_id(self, token: str) -> int | None:
        return self.tokenizer.token_to_id(token)

    def id_to_token(self, token_id: int) -> str:
        return self.tokenizer.id_to_token(token_id) or ""

    def encode_batch(self, texts: Sequence[str], add_special_tokens: bool, return_offsets: bool) -> list[EncodedText]:
        if not return_offsets:
            # The fast variant skips offset tracking, which is a good part of the work.
            encodings = self.tokenizer.encode_batch_fast(list(texts), add_special_tokens=add_special_tokens)
            out = []
            for e in encodings:
                ids = e.ids
                out.append(EncodedText(ids, [self.tokens[i] for i in ids]))
            return out
        encodings = self.tokenizer.encode_batch(list(texts), add_special_tokens=add_special_tokens)
        return [EncodedText(e.ids, e.tokens, e.offsets) for e in encodings]

    def decode_batch(self, sequences: Sequence[Sequence[int]], skip_special_tokens: bool) -> list[str]:
        if total_ids(sequences) <= SMALL_DECODE_IDS:
            # decode_batch wakes Rust's thread pool, whose threads then spin on the CPUs the lm needs.
            return [self.tokenizer.decode(list(s), skip_special_tokens=skip_special_tokens) for s in sequences]
        return self.tokenizer.decode_batch([list(s) for s in sequences], skip_special_tokens=skip_special_tokens)

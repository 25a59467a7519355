"""The `tokenizers` backend: anything a tokenizer.json describes (byte-level BPE, WordPiece, Unigram, …)."""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Sequence
from pathlib import Path

from tokenizers import Tokenizer

from muestra.tokenizer.backend import SMALL_DECODE_IDS, EncodedText, TokenizerBackend, total_ids

_BYTE_TOKEN = re.compile(r"^<0x([0-9A-Fa-f]{2})>$")


@functools.cache
def _byte_level_decoder() -> dict[str, int]:
    """GPT-2's byte-level alphabet (tokenizers' ByteLevel), character -> byte: the printable bytes stand for
    themselves, the other 68 for the characters from U+0100 on, in byte order."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table = {chr(b): b for b in printable}
    extra = 0
    for b in range(256):
        if b not in printable:
            table[chr(256 + extra)] = b
            extra += 1
    return table


def _decoder_kinds(decoder: dict | None) -> set[str]:
    """The types of a tokenizer.json decoder, a Sequence's parts included."""
    if not decoder:
        return set()
    kinds = {decoder.get("type", "")}
    for part in decoder.get("decoders") or ():
        kinds |= _decoder_kinds(part)
    return kinds


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
        self._decoders = _decoder_kinds(json.loads(self.tokenizer.to_str()).get("decoder"))
        self._added = {token_id for token_id in self.tokenizer.get_added_tokens_decoder()}
        self._bytes: dict[int, bytes] = {}

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

    def token_bytes(self, token_id: int) -> bytes:
        found = self._bytes.get(token_id)
        if found is None:
            found = self._bytes[token_id] = self._spell_bytes(token_id)
        return found

    def _spell_bytes(self, token_id: int) -> bytes:
        token = self.tokens[token_id] if 0 <= token_id < self._vocab_size else ""
        if token_id in self._added:  # added tokens are their own text, not pieces of the model's alphabet
            return token.encode()
        if "ByteLevel" in self._decoders:
            table = _byte_level_decoder()
            if all(c in table for c in token):
                return bytes(table[c] for c in token)
        if "ByteFallback" in self._decoders:
            match = _BYTE_TOKEN.match(token)
            if match:
                return bytes([int(match.group(1), 16)])
        if self._decoders & {"Metaspace", "Replace"}:
            return token.replace("\u2581", " ").encode()
        # WordPiece and others: the token decoded alone (whole characters only there).
        return self.tokenizer.decode([token_id], skip_special_tokens=False).encode()

"""What llguidance's JSON grammar cannot say, kept per row: unique keys, and numbers that end.

A context-free grammar cannot remember which keys an object already has, nor count a fraction's
significant digits under a schema's bounds. JsonText reads the row's text as it grows and takes out
of each mask the tokens that would repeat a key of the object they are in, or give a number more
than MAX_DIGITS significant digits or fraction digits (docs/structured.md, "What a schema means here").
"""

from __future__ import annotations

import dataclasses
import json

import numpy as np

MAX_DIGITS = 17  # a double's precision: more digits would not survive a round trip
_QUOTE, _BACKSLASH, _DOT = 0x22, 0x5C, 0x2E
_DIGITS = frozenset(b"0123456789")
_NUMBER_END = frozenset(b",]} \t\r\n")


class JsonTokens:
    """A tokenizer's token bytes, and which tokens can repeat a key or lengthen a number."""

    def __init__(self, token_bytes: list[bytes]) -> None:
        self.token_bytes = token_bytes
        self.quotes = np.array([data.count(b'"') for data in token_bytes], dtype=np.int32)
        self.numeric = np.array([any(b in _DIGITS or b == _DOT for b in data) for data in token_bytes], dtype=bool)
        self.by_bytes: dict[bytes, list[int]] = {}
        for token, data in enumerate(token_bytes):
            self.by_bytes.setdefault(data, []).append(token)
        # Bitmask (as llguidance packs them) of the tokens that do not start with a quote.
        unquoted = np.array([not data.startswith(b'"') for data in token_bytes], dtype=np.uint8)
        self.unquoted = np.packbits(unquoted, bitorder="little")
        # For a row about to run out of tokens (closing_masks): the tokens that only close (quotes, brackets), and
        # those that write a short value or a separator, as int32 words the size of llguidance's masks.
        words = (len(token_bytes) + 31) // 32
        self.brackets = _words([bool(data) and all(b in _BRACKETS for b in data) for data in token_bytes], words)
        self.end_quote = _words(
            [data[:1] == b'"' and all(b in _BRACKETS for b in data[1:]) for data in token_bytes], words
        )
        self.short = _words([_is_short(data) for data in token_bytes], words)


_BRACKETS = frozenset(b"]}")
_SHORT = frozenset(b'"]},:. -0123456789')
_WORDS = (b"null", b"true", b"false")


def _is_short(data: bytes) -> bool:
    return bool(data) and (all(b in _SHORT for b in data) or data.strip(b' ,:"[{') in _WORDS)


def _words(flags: list[bool], words: int) -> np.ndarray:
    packed = np.packbits(np.array(flags, dtype=np.uint8), bitorder="little")
    return np.concatenate([packed, np.zeros(words * 4 - packed.size, dtype=np.uint8)]).view(np.int32)


@dataclasses.dataclass
class JsonText:
    """Where a row is in its JSON text: open containers, the keys of each open object, the current string or number."""

    # One entry per open container: the keys an object has so far (a frozenset), or None for an array.
    stack: list = dataclasses.field(default_factory=list)
    expect_key: bool = False  # the next string of the innermost object is a key
    in_string: bool = False
    string_is_key: bool = False
    escaped: bool = False
    key: bytes = b""
    in_number: bool = False
    in_fraction: bool = False
    significant: int = 0  # significant digits of the current number
    fraction: int = 0  # its digits after the point

    def feed(self, data: bytes) -> str:
        """Read the bytes; a non-empty message if they break a rule (the state is then of no further use)."""
        for byte in data:
            if self.in_string:
                if self.escaped:
                    self.escaped = False
                elif byte == _BACKSLASH:
                    self.escaped = True
                elif byte == _QUOTE:
                    self.in_string = False
                    if self.string_is_key:
                        key = json.loads(b'"' + self.key + b'"')
                        if key in self.stack[-1]:
                            return f"the key {key!r} is already in this object"
                        self.stack[-1] = self.stack[-1] | {key}
                        self.expect_key = False
                    continue
                if self.string_is_key:
                    self.key += bytes((byte,))
                continue
            if self.in_number:
                if byte in _NUMBER_END:
                    self.in_number = False
                else:
                    self._number_byte(byte)
                    if self.in_fraction and self._too_long():
                        return f"a number has more than {MAX_DIGITS} significant or fraction digits"
                    continue
            if byte == _QUOTE:
                self.in_string, self.escaped, self.key = True, False, b""
                self.string_is_key = bool(self.stack) and self.stack[-1] is not None and self.expect_key
            elif byte == ord("{"):
                self.stack.append(frozenset())
                self.expect_key = True
            elif byte == ord("["):
                self.stack.append(None)
            elif byte in b"]}" and self.stack:
                self.stack.pop()
            elif byte == ord(",") and self.stack:
                self.expect_key = self.stack[-1] is not None
            elif byte in _DIGITS or byte == ord("-"):
                self.in_number, self.in_fraction, self.significant, self.fraction = True, False, 0, 0
                self._number_byte(byte)
        return ""

    def _too_long(self) -> bool:
        # A point with no digit yet needs room for one.
        room = self.significant + (self.fraction == 0 and self.significant > 0)
        return self.fraction > MAX_DIGITS or room > MAX_DIGITS

    def _number_byte(self, byte: int) -> None:
        if byte == _DOT:
            self.in_fraction = True
        elif byte in _DIGITS:
            if self.significant or byte != ord("0"):
                self.significant += 1
            if self.in_fraction:
                self.fraction += 1
        else:  # an exponent: the schema's bounds (which muestra always sets) leave none
            self.in_fraction = False

    def reaching_used_keys(self, tokens: JsonTokens) -> list[int]:
        """Inside a key: the tokens that would make it exactly a key its object already has."""
        if not (self.in_string and self.string_is_key) or self.escaped:
            return []
        found = []
        for key in self.stack[-1]:
            raw = json.dumps(key, ensure_ascii=False)[1:-1].encode()
            if len(raw) > len(self.key) and raw.startswith(self.key):
                found += tokens.by_bytes.get(raw[len(self.key) :], [])
        return found

    def closing_tokens(self) -> int:
        """About how many tokens it takes at least to end the text from here: a quote and a bracket per open
        string and container, and a value where a key waits for one."""
        return len(self.stack) + self.in_string + (self.in_string and self.string_is_key)

    def closing_steps(self, tokens: JsonTokens) -> tuple[np.ndarray, ...]:
        """The token sets that end the text soonest from here, best first: inside a string its closing quote (and
        brackets after it); elsewhere closing brackets, then short values and separators."""
        if self.in_string:
            return (tokens.end_quote,)
        return (tokens.brackets, tokens.short)

    def copy(self) -> JsonText:
        return dataclasses.replace(self, stack=list(self.stack))

    def remove_breaking(self, mask: np.ndarray, tokens: JsonTokens) -> None:
        """Clear, in a row's mask (int32 words), the bit of every token that would break a rule here."""
        bits = np.unpackbits(mask.view(np.uint8), count=tokens.quotes.size, bitorder="little").astype(bool)
        has_keys = any(frame for frame in self.stack)
        # A token can repeat a key only if it closes a key string (one quote when in a key, two otherwise,
        # three from inside a string value); it can lengthen a number only if it has digits or a point.
        needed = 1 if self.in_string and self.string_is_key else 3 if self.in_string else 2
        suspect = (tokens.quotes >= needed) if has_keys else np.zeros_like(bits)
        suspect |= tokens.numeric & (tokens.quotes > 0) if self.in_string else tokens.numeric
        words = mask.view(np.uint32)
        for token in np.flatnonzero(bits & suspect):
            if self.copy().feed(tokens.token_bytes[token]):
                words[token >> 5] &= ~np.uint32(1 << (token & 31))

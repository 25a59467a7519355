"""The SentencePiece backend: a `.model` file, as Llama 2, T5 and Gemma ship it."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import sentencepiece

from muestra.tokenizer.backend import SMALL_DECODE_IDS, EncodedText, TokenizerBackend, total_ids


class SentencePieceBackend(TokenizerBackend):
    """sentencepiece's own encoder and decoder.

    Special tokens are the model's control pieces (<s>, </s>, <pad>, …). With add_special_tokens,
    BOS is prepended when `add_bos` and EOS appended when `add_eos` (tokenizer_config.json's
    add_bos_token / add_eos_token). Without skip_special_tokens, control pieces are written out
    verbatim between the decoded runs of ordinary pieces.
    """

    kind = "sentencepiece"

    def __init__(self, model_file: Path, add_bos: bool = True, add_eos: bool = False) -> None:
        self.processor = sentencepiece.SentencePieceProcessor(model_file=str(model_file))
        self._vocab_size = self.processor.get_piece_size()
        self.pieces = [self.processor.id_to_piece(i) for i in range(self._vocab_size)]
        self.control_ids = frozenset(i for i in range(self._vocab_size) if self.processor.is_control(i))
        bos, eos = self.processor.bos_id(), self.processor.eos_id()
        self.prefix_ids = [bos] if add_bos and bos >= 0 else []
        self.suffix_ids = [eos] if add_eos and eos >= 0 else []
        self.threads = min(8, os.cpu_count() or 1)

    @property
    def vocab_size(self) -> int:
        return self._vocab_size

    @property
    def special_token_ids(self) -> list[int]:
        return sorted(self.control_ids)

    def token_to_id(self, token: str) -> int | None:
        token_id = self.processor.piece_to_id(token)
        # piece_to_id answers unk_id for a piece it lacks; only "<unk>" itself maps there honestly.
        if token_id == self.processor.unk_id() and self.pieces[token_id] != token:
            return None
        return token_id

    def id_to_token(self, token_id: int) -> str:
        return self.pieces[token_id]

    def token_bytes(self, token_id: int) -> bytes:
        """A byte piece (<0xF0>) is its byte; a control piece its text; any other piece its text with
        sentencepiece's word boundary (U+2581) as the space it stands for; the unknown piece as it decodes."""
        piece = self.pieces[token_id]
        if self.processor.is_byte(token_id):
            return bytes([int(piece[3:5], 16)])
        if token_id in self.control_ids:
            return piece.encode()
        if self.processor.is_unknown(token_id):
            return self.processor.decode([token_id]).encode()
        return piece.replace("\u2581", " ").encode()

    def _with_specials(self, ids: list[int], add_special_tokens: bool) -> list[int]:
        return [*self.prefix_ids, *ids, *self.suffix_ids] if add_special_tokens else ids

    def encode_batch(self, texts: Sequence[str], add_special_tokens: bool, return_offsets: bool) -> list[EncodedText]:
        if not return_offsets:
            id_lists = self.processor.encode(list(texts), num_threads=self.threads)
            out = []
            for ids in id_lists:
                ids = self._with_specials(ids, add_special_tokens)
                out.append(EncodedText(ids, [self.pieces[i] for i in ids]))
            return out
        protos = self.processor.encode(list(texts), return_type="proto", num_threads=self.threads)
        return [self._from_proto(text, proto, add_special_tokens) for text, proto in zip(texts, protos, strict=True)]

    def _from_proto(self, text: str, proto, add_special_tokens: bool) -> EncodedText:
        to_char = _ByteToChar(text)
        ids = [p.id for p in proto.pieces]
        offsets = [(to_char.floor(p.begin), to_char.ceil(p.end)) for p in proto.pieces]
        if add_special_tokens:
            ids = self._with_specials(ids, True)
            end = len(text)
            offsets = [(0, 0)] * len(self.prefix_ids) + offsets + [(end, end)] * len(self.suffix_ids)
        return EncodedText(ids, [self.pieces[i] for i in ids], offsets)

    def decode_batch(self, sequences: Sequence[Sequence[int]], skip_special_tokens: bool) -> list[str]:
        plain: list[list[int]] = []
        for seq in sequences:
            seq = list(seq)
            if skip_special_tokens and not self.control_ids.isdisjoint(seq):
                seq = [i for i in seq if i not in self.control_ids]
            plain.append(seq)
        threads = 1 if total_ids(plain) <= SMALL_DECODE_IDS else self.threads
        texts = self.processor.decode(plain, num_threads=threads)
        if not skip_special_tokens:
            for row, seq in enumerate(plain):
                if not self.control_ids.isdisjoint(seq):
                    texts[row] = self._decode_with_control_pieces(seq)
        return texts

    def _decode_with_control_pieces(self, ids: list[int]) -> str:
        parts, run = [], []
        for token_id in ids:
            if token_id in self.control_ids:
                parts.append(self.processor.decode(run) if run else "")
                parts.append(self.pieces[token_id])
                run = []
            else:
                run.append(token_id)
        parts.append(self.processor.decode(run) if run else "")
        return "".join(parts)


class _ByteToChar:
    """Maps UTF-8 byte offsets of `text` to character offsets (sentencepiece reports bytes)."""

    def __init__(self, text: str) -> None:
        self.ascii = text.isascii()
        if self.ascii:
            return
        self.char_of_byte: list[int] = []
        for index, char in enumerate(text):
            code = ord(char)
            width = 1 if code < 0x80 else 2 if code < 0x800 else 3 if code < 0x10000 else 4
            self.char_of_byte.extend([index] * width)
        self.char_of_byte.append(len(text))

    def floor(self, byte_offset: int) -> int:
        return byte_offset if self.ascii else self.char_of_byte[byte_offset]

    def ceil(self, byte_offset: int) -> int:
        if self.ascii or byte_offset == 0:
            return byte_offset
        # A byte inside a character (not its first byte) belongs to that character: round up.
        inside = self.char_of_byte[byte_offset] == self.char_of_byte[byte_offset - 1]
        return self.char_of_byte[byte_offset] + 1 if inside else self.char_of_byte[byte_offset]

"""Encode and Decode through the service equal the tokenizer libraries themselves, and round-trip text.

What "round trip" means per kind, i.e. what decode(encode(text)) must equal:
  * byte-level BPE and SentencePiece (identity normalization, extra whitespace kept): the text itself.
  * Unigram with Metaspace: the text, except that a text starting with a space loses that one space
    (Metaspace adds "▁" only to texts that do not start with one, and its decoder strips the first).
  * WordPiece (BERT): the BERT normalizer's output, split by the BERT pre-tokenizer into words and
    punctuation, re-joined with single spaces, without a space before a word that is exactly ".",
    ",", "?" or "!" (the WordPiece decoder's cleanup). ZWJ and other control characters are gone,
    because BertNormalizer(clean_text=True) removes them.
"""

from __future__ import annotations

import itertools

import pytest
from tokenizers import Tokenizer

from muestra.tokenizer.backend import SMALL_DECODE_IDS
from muestra.v1 import tokenizer_pb2
from tests.fixtures.tokenizers import SAMPLE_TEXTS

KINDS = ["bpe", "wordpiece", "unigram", "sentencepiece"]


def expected_round_trip(kind: str, text: str, reference) -> str:
    if kind == "wordpiece":
        normalized = reference.normalizer.normalize_str(text)
        words = [word for word, _ in reference.pre_tokenizer.pre_tokenize_str(normalized)]
        joined = ""
        for word in words:
            joined += word if not joined or word in (".", ",", "?", "!") else " " + word
        return joined
    if kind == "unigram" and text.startswith(" "):
        return text[1:]
    return text


def reference_encode(reference, text: str, add_special_tokens: bool) -> list[int]:
    if isinstance(reference, Tokenizer):
        return reference.encode(text, add_special_tokens=add_special_tokens).ids
    ids = reference.encode(text)
    return [reference.bos_id(), *ids] if add_special_tokens else ids


def encode(stub, model: str, texts: list[str], **kwargs) -> list[tokenizer_pb2.Encoding]:
    return list(stub.Encode(tokenizer_pb2.EncodeRequest(model=model, texts=texts, **kwargs)).encodings)


def decode(stub, model: str, sequences: list[list[int]], skip_special_tokens: bool = False) -> list[str]:
    request = tokenizer_pb2.DecodeTokensRequest(
        model=model,
        sequences=[tokenizer_pb2.TokenIds(ids=s) for s in sequences],
        skip_special_tokens=skip_special_tokens,
    )
    return list(stub.Decode(request).texts)


@pytest.mark.parametrize("kind", KINDS)
def test_text_round_trips_through_encode_and_decode(tokenizer_stub, reference_tokenizers, kind):
    encodings = encode(tokenizer_stub, kind, SAMPLE_TEXTS)
    texts = decode(tokenizer_stub, kind, [list(e.ids) for e in encodings])
    expected = [expected_round_trip(kind, text, reference_tokenizers[kind]) for text in SAMPLE_TEXTS]
    assert texts == expected


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("add_special_tokens", [False, True])
def test_ids_equal_the_library_encoding(tokenizer_stub, reference_tokenizers, kind, add_special_tokens):
    reference = reference_tokenizers[kind]
    encodings = encode(tokenizer_stub, kind, SAMPLE_TEXTS, add_special_tokens=add_special_tokens)
    assert [list(e.ids) for e in encodings] == [
        reference_encode(reference, t, add_special_tokens) for t in SAMPLE_TEXTS
    ]


@pytest.mark.parametrize("kind", KINDS)
def test_tokens_are_the_vocabulary_spelling_of_the_ids(tokenizer_stub, reference_tokenizers, kind):
    reference = reference_tokenizers[kind]
    to_token = reference.id_to_token if isinstance(reference, Tokenizer) else reference.id_to_piece
    for e in encode(tokenizer_stub, kind, SAMPLE_TEXTS, add_special_tokens=True):
        assert list(e.tokens) == [to_token(i) for i in e.ids]


def test_special_tokens_are_added_only_when_asked(tokenizer_stub, tokenizer_folders):
    plain, special = (
        encode(tokenizer_stub, "wordpiece", ["hola"], add_special_tokens=flag)[0] for flag in (False, True)
    )
    assert list(special.tokens) == ["[CLS]", *plain.tokens, "[SEP]"]


@pytest.mark.parametrize("kind", ["bpe", "wordpiece", "unigram"])
def test_offsets_equal_the_library_offsets(tokenizer_stub, reference_tokenizers, kind):
    encodings = encode(tokenizer_stub, kind, SAMPLE_TEXTS, add_special_tokens=True, return_offsets=True)
    for text, e in zip(SAMPLE_TEXTS, encodings, strict=True):
        expected = reference_tokenizers[kind].encode(text).offsets
        assert list(zip(e.offset_starts, e.offset_ends, strict=True)) == expected


def test_sentencepiece_offsets_are_character_offsets_that_tile_the_text(tokenizer_stub):
    encodings = encode(tokenizer_stub, "sentencepiece", SAMPLE_TEXTS, return_offsets=True)
    for text, e in zip(SAMPLE_TEXTS, encodings, strict=True):
        spans = list(zip(e.offset_starts, e.offset_ends, strict=True))
        assert "".join(text[start:end] for start, end in spans) == text
        assert all(a_end <= b_start for (_, a_end), (b_start, _) in itertools.pairwise(spans))
        for token, (start, end) in zip(e.tokens, spans, strict=True):
            if start < end and not token.startswith("<0x"):
                assert text[start:end] == token.replace("▁", " ")


def test_offsets_are_omitted_unless_asked(tokenizer_stub):
    e = encode(tokenizer_stub, "bpe", ["hola"])[0]
    assert len(e.ids) > 0 and len(e.offset_starts) == 0 and len(e.offset_ends) == 0


@pytest.mark.parametrize("kind", KINDS)
def test_skip_special_tokens_drops_them_from_the_text(tokenizer_stub, reference_tokenizers, kind):
    ids = [list(e.ids) for e in encode(tokenizer_stub, kind, SAMPLE_TEXTS[:2], add_special_tokens=True)]
    skipped = decode(tokenizer_stub, kind, ids, skip_special_tokens=True)
    reference = reference_tokenizers[kind]
    if isinstance(reference, Tokenizer):
        assert skipped == reference.decode_batch(ids, skip_special_tokens=True)
        assert decode(tokenizer_stub, kind, ids) == reference.decode_batch(ids, skip_special_tokens=False)
    else:
        assert skipped == [reference.decode(s) for s in ids]


def test_sentencepiece_writes_control_pieces_unless_skipped(tokenizer_stub, reference_tokenizers):
    sp = reference_tokenizers["sentencepiece"]
    ids = [sp.bos_id(), *sp.encode("hola"), sp.eos_id()]
    assert decode(tokenizer_stub, "sentencepiece", [ids]) == ["<s>hola</s>"]
    assert decode(tokenizer_stub, "sentencepiece", [ids], skip_special_tokens=True) == ["hola"]


def test_a_batch_keeps_its_order_and_matches_the_library_batch(tokenizer_stub, reference_tokenizers):
    texts = [f"{i}: {SAMPLE_TEXTS[i % len(SAMPLE_TEXTS)][: 10 + i]}" for i in range(64)]
    encodings = encode(tokenizer_stub, "bpe", texts)
    assert [list(e.ids) for e in encodings] == [
        e.ids for e in reference_tokenizers["bpe"].encode_batch(texts, add_special_tokens=False)
    ]
    assert decode(tokenizer_stub, "bpe", [list(e.ids) for e in encodings]) == texts


@pytest.mark.parametrize("kind", KINDS)
def test_small_and_large_decode_batches_both_equal_the_library(tokenizer_stub, reference_tokenizers, kind):
    """A few short sequences are decoded on the service's loop, a large batch on its thread pool."""
    reference = reference_tokenizers[kind]
    texts = [SAMPLE_TEXTS[i % len(SAMPLE_TEXTS)] * (3 + i % 9) for i in range(64)]
    sequences = [reference_encode(reference, text, add_special_tokens=True) for text in texts]
    assert sum(map(len, sequences)) > SMALL_DECODE_IDS  # the thread-pool path
    if isinstance(reference, Tokenizer):
        expected = [reference.decode(s, skip_special_tokens=True) for s in sequences]
    else:
        expected = [reference.decode(s) for s in sequences]  # sentencepiece drops control pieces
    assert decode(tokenizer_stub, kind, sequences, skip_special_tokens=True) == expected
    assert decode(tokenizer_stub, kind, sequences[:3], skip_special_tokens=True) == expected[:3]  # on the loop


def test_an_empty_model_name_selects_the_first_tokenizer(tokenizer_stub):
    assert [list(e.ids) for e in encode(tokenizer_stub, "", SAMPLE_TEXTS)] == [
        list(e.ids) for e in encode(tokenizer_stub, "bpe", SAMPLE_TEXTS)
    ]


def test_empty_inputs_give_empty_outputs(tokenizer_stub):
    assert encode(tokenizer_stub, "bpe", []) == []
    assert list(encode(tokenizer_stub, "bpe", [""])[0].ids) == []
    assert decode(tokenizer_stub, "sentencepiece", [[]]) == [""]


@pytest.mark.parametrize("kind", ["bpe", "sentencepiece"])
def test_raw_bytes_of_single_tokens_concatenate_to_the_texts_utf8(tokenizer_stub, kind):
    """Byte-level BPE and SentencePiece with byte fallback round-trip any text: the tokens' own bytes, one token per
    sequence, concatenate to the text's UTF-8 even where a token is only part of a character (its text reads U+FFFD
    there)."""
    for text in SAMPLE_TEXTS:
        ids = list(encode(tokenizer_stub, kind, [text])[0].ids)
        request = tokenizer_pb2.DecodeTokensRequest(
            model=kind, sequences=[tokenizer_pb2.TokenIds(ids=[i]) for i in ids], raw_bytes=True
        )
        reply = tokenizer_stub.Decode(request)
        assert len(reply.raw) == len(ids)
        # SentencePiece's encoder adds a space at the start (its dummy prefix), which its text drops again; the
        # bytes keep it, since they are each token's own (a token alone keeps its space).
        expected = (" " + text if kind == "sentencepiece" else text).encode()
        assert b"".join(reply.raw) == expected, (kind, text)
        whole = tokenizer_stub.Decode(
            tokenizer_pb2.DecodeTokensRequest(model=kind, sequences=[tokenizer_pb2.TokenIds(ids=ids)], raw_bytes=True)
        )
        assert whole.raw == [expected] and whole.texts == [text]
    assert not tokenizer_stub.Decode(tokenizer_pb2.DecodeTokensRequest(model=kind, sequences=[])).raw


def test_raw_bytes_equal_llguidance_on_the_default_and_fixture_tokenizers():
    """Each token's bytes against llguidance's decode_bytes (a reference written elsewhere), whole vocabularies."""
    from pathlib import Path

    import llguidance

    from muestra.tokenizer.hf_backend import TokenizersBackend

    root = Path(__file__).resolve().parents[2] / "models"
    for folder in (root / "tiny-text-fixture", root / "smollm2-135m-instruct"):
        if not (folder / "tokenizer.json").is_file():
            continue
        ours = TokenizersBackend(folder / "tokenizer.json")
        reference = llguidance.LLTokenizer((folder / "tokenizer.json").read_text())
        differ = [i for i in range(ours.vocab_size) if ours.token_bytes(i) != reference.decode_bytes([i])]
        # The fixture's token 190 is byte 0xFF alone (never valid UTF-8), which llguidance reads as nothing.
        assert differ in ([], [190]), (folder.name, differ[:10])

"""Streamed text through DetokenizeStep concatenates to the full decode, for every prefix and every backend.

The full decode is the tokenizer library's own decode of the same ids, in this process.
Every step sends, for every test string at once, the stream itself and a copy marked final; the
text emitted so far plus the final copy's flush must equal the full decode of the ids so far, so
every prefix of every string is checked as the end of a stream.
"""

from __future__ import annotations

import copy
import queue
import random

import grpc
import pytest
from tokenizers import Tokenizer

from muestra.runtime.detokenize import DetokenizeState
from muestra.v1 import tokenizer_pb2
from tests.fixtures.tokenizers import SAMPLE_TEXTS

KINDS = ["bpe", "wordpiece", "unigram", "sentencepiece"]


def library_encode(reference, text: str, add_special_tokens: bool = False) -> list[int]:
    if isinstance(reference, Tokenizer):
        return reference.encode(text, add_special_tokens=add_special_tokens).ids
    ids = reference.encode(text)
    return [reference.bos_id(), *ids, reference.eos_id()] if add_special_tokens else ids


def library_decode(reference, ids: list[int], skip_special_tokens: bool) -> str:
    if isinstance(reference, Tokenizer):
        return reference.decode(ids, skip_special_tokens=skip_special_tokens)
    assert skip_special_tokens, "sentencepiece itself always drops control pieces"
    return reference.decode(ids)


def stream_every_prefix(stub, model: str, id_lists: list[list[int]], skip_special_tokens: bool, reference) -> int:
    """Stream all id lists side by side, checking every prefix; returns how many steps held text back."""
    states = [DetokenizeState() for _ in id_lists]
    emitted = ["" for _ in id_lists]
    held_back = 0
    for step in range(max(len(ids) for ids in id_lists)):
        active = [i for i, ids in enumerate(id_lists) if step < len(ids)]
        request = tokenizer_pb2.DetokenizeStepRequest(model=model, skip_special_tokens=skip_special_tokens)
        for i in active:
            states[i].append(id_lists[i][step])
            request.streams.append(states[i].next_stream())
            request.streams.append(states[i].next_stream(final=True))
        deltas = stub.DetokenizeStep(request).deltas
        assert len(deltas) == 2 * len(active)
        for n, i in enumerate(active):
            flushed = emitted[i] + copy.deepcopy(states[i]).apply(deltas[2 * n + 1])
            emitted[i] += states[i].apply(deltas[2 * n])
            full = library_decode(reference, id_lists[i][: step + 1], skip_special_tokens)
            assert flushed == full, f"stream {i}, prefix of {step + 1} ids"
            assert full.startswith(emitted[i])
            held_back += states[i].pending > 0
    return held_back


@pytest.mark.parametrize("kind", KINDS)
def test_streamed_text_equals_full_decode_for_every_prefix(tokenizer_stub, reference_tokenizers, kind):
    reference = reference_tokenizers[kind]
    id_lists = [library_encode(reference, text) for text in SAMPLE_TEXTS]
    held_back = stream_every_prefix(tokenizer_stub, kind, id_lists, True, reference)
    if kind in ("bpe", "sentencepiece"):
        # Emoji and CJK span several byte-level tokens here, so some steps must have waited.
        assert held_back > 0


@pytest.mark.parametrize("kind", ["bpe", "wordpiece", "unigram"])
@pytest.mark.parametrize("skip_special_tokens", [False, True])
def test_streamed_text_with_special_tokens_equals_full_decode(
    tokenizer_stub, reference_tokenizers, kind, skip_special_tokens
):
    reference = reference_tokenizers[kind]
    id_lists = [library_encode(reference, text, add_special_tokens=True) for text in SAMPLE_TEXTS]
    stream_every_prefix(tokenizer_stub, kind, id_lists, skip_special_tokens, reference)


@pytest.mark.parametrize("kind", ["bpe", "wordpiece", "unigram"])
def test_a_stream_may_keep_its_special_tokens_in_a_step_that_skips_them(tokenizer_stub, reference_tokenizers, kind):
    """DetokenizeStream.skip_special_tokens overrides the step's: two streams of the same ids, one each way."""
    reference = reference_tokenizers[kind]
    ids = library_encode(reference, SAMPLE_TEXTS[0], add_special_tokens=True)
    kept, skipped = DetokenizeState(), DetokenizeState()
    texts = ["", ""]
    for step, token in enumerate(ids):
        request = tokenizer_pb2.DetokenizeStepRequest(model=kind, skip_special_tokens=True)
        final = step == len(ids) - 1
        for state in (kept, skipped):
            state.append(token)
        request.streams.append(kept.next_stream(final=final, skip_special_tokens=False))
        request.streams.append(skipped.next_stream(final=final))
        deltas = tokenizer_stub.DetokenizeStep(request).deltas
        texts[0] += kept.apply(deltas[0])
        texts[1] += skipped.apply(deltas[1])
    assert texts == [library_decode(reference, ids, False), library_decode(reference, ids, True)]
    assert texts[0] != texts[1]


@pytest.mark.parametrize("kind", KINDS)
def test_streamed_text_equals_full_decode_for_random_ids(tokenizer_stub, reference_tokenizers, kind):
    """Random ids include lone UTF-8 continuation bytes and tokens no encoder would put there."""
    reference = reference_tokenizers[kind]
    vocab = reference.get_vocab_size() if isinstance(reference, Tokenizer) else reference.get_piece_size()
    rng = random.Random(1234)
    id_lists = [[rng.randrange(vocab) for _ in range(rng.randrange(1, 40))] for _ in range(8)]
    stream_every_prefix(tokenizer_stub, kind, id_lists, True, reference)


def test_a_multibyte_character_is_emitted_once_complete(tokenizer_stub, reference_tokenizers):
    reference = reference_tokenizers["bpe"]
    ids = library_encode(reference, "🙂")
    assert len(ids) > 1, "the fixture must split this emoji across byte-level tokens"
    state = DetokenizeState()
    texts = []
    for token_id in ids:
        state.append(token_id)
        reply = tokenizer_stub.DetokenizeStep(
            tokenizer_pb2.DetokenizeStepRequest(model="bpe", streams=[state.next_stream()])
        )
        texts.append(state.apply(reply.deltas[0]))
    assert texts == [""] * (len(ids) - 1) + ["🙂"]


def test_final_flushes_an_incomplete_character(tokenizer_stub, reference_tokenizers):
    reference = reference_tokenizers["bpe"]
    ids = library_encode(reference, "🙂")[:-1]
    state = DetokenizeState(ids)
    state.read_offset = 0
    reply = tokenizer_stub.DetokenizeStep(
        tokenizer_pb2.DetokenizeStepRequest(model="bpe", streams=[state.next_stream(), state.next_stream(final=True)])
    )
    assert reply.deltas[0].text == ""
    assert reply.deltas[1].text == reference.decode(ids) and reply.deltas[1].text.endswith("\ufffd")


def test_a_stream_after_a_prompt_keeps_the_leading_space(tokenizer_stub, reference_tokenizers):
    reference = reference_tokenizers["sentencepiece"]
    ids = library_encode(reference, "El cielo es azul")
    split = next(k for k in range(len(ids)) if reference.decode(ids[:k]) == "El cielo")
    prompt, generated = ids[:split], ids[split:]
    state = DetokenizeState.after_prompt(prompt)
    text = ""
    for i, token_id in enumerate(generated):
        state.append(token_id)
        final = i == len(generated) - 1
        request = tokenizer_pb2.DetokenizeStepRequest(
            model="sentencepiece", streams=[state.next_stream(final=final)], skip_special_tokens=True
        )
        text += state.apply(tokenizer_stub.DetokenizeStep(request).deltas[0])
    assert text == " es azul"
    assert reference.decode(prompt) + text == reference.decode(ids)


def test_advances_are_offsets_from_the_start_of_the_window_sent(tokenizer_stub, reference_tokenizers):
    reference = reference_tokenizers["bpe"]
    words, emoji = library_encode(reference, "hola que"), library_encode(reference, "🙂")
    window = words + emoji[:-1]  # ends inside the emoji: held back
    request = tokenizer_pb2.DetokenizeStepRequest(
        model="bpe",
        streams=[
            tokenizer_pb2.DetokenizeStream(ids=words, read_offset=1),
            tokenizer_pb2.DetokenizeStream(ids=window, read_offset=len(words)),
        ],
    )
    emitted, held = tokenizer_stub.DetokenizeStep(request).deltas
    assert (emitted.text, emitted.prefix_advance, emitted.read_advance) == (
        reference.decode(words)[len(reference.decode(words[:1])) :],
        1,
        len(words),
    )
    assert (held.text, held.prefix_advance, held.read_advance) == ("", 0, len(words))


def test_steps_on_one_open_stream_equal_detokenize_step_calls(tokenizer_stub, reference_tokenizers):
    """DetokenizeSteps answers each request as DetokenizeStep would, in order, on one stream."""
    ids = library_encode(reference_tokenizers["bpe"], "Streaming 🌍 over one stream, día a día.")
    requests: queue.Queue = queue.Queue()
    end = object()
    replies = tokenizer_stub.DetokenizeSteps(iter(requests.get, end))
    unary_state, stream_state = DetokenizeState(), DetokenizeState()
    unary_text, stream_text = "", ""
    for token in ids:
        for state in (unary_state, stream_state):
            state.append(token)
        request = tokenizer_pb2.DetokenizeStepRequest(model="bpe", streams=[unary_state.next_stream()])
        unary_text += unary_state.apply(tokenizer_stub.DetokenizeStep(request).deltas[0])
        requests.put(tokenizer_pb2.DetokenizeStepRequest(model="bpe", streams=[stream_state.next_stream()]))
        stream_text += stream_state.apply(next(replies).deltas[0])
        assert stream_text == unary_text
    requests.put(end)
    assert list(replies) == []
    assert stream_text == reference_tokenizers["bpe"].decode(ids)


def test_a_bad_request_ends_the_open_stream_with_invalid_argument(tokenizer_stub):
    bad = tokenizer_pb2.DetokenizeStepRequest(model="bpe", streams=[tokenizer_pb2.DetokenizeStream(ids=[10**9])])
    with pytest.raises(grpc.RpcError) as raised:
        list(tokenizer_stub.DetokenizeSteps(iter([bad])))
    assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "streams[0].ids[0]" in raised.value.details()

"""Logprobs carry each token's own bytes on the default model, whose byte-level tokenizer splits an emoji or a CJK
character over several tokens: the entries' bytes concatenate to the content's UTF-8 exactly (chat and
completions, whole and streamed, the alternatives too), and a token that holds part of a character reads
"bytes:\\xNN…" (vLLM's form) instead of the replacement character."""

from __future__ import annotations

import re

import pytest

from muestra.gateway.engine.generation.detokenizer import readable_token
from tests.fixtures.default_model import default_model_stack  # noqa: F401 - the fixture

PROMPT = "Reply with: 😬 東京 ✓"
PARTIAL = re.compile(r"^bytes:(\\x[0-9a-f]{2})+$")


def check_entry(token: str, data: list[int]) -> None:
    raw = bytes(data)
    try:
        assert token == raw.decode("utf-8")
    except UnicodeDecodeError:
        assert PARTIAL.match(token) and token == "bytes:" + "".join(f"\\x{b:02x}" for b in raw), (token, raw)


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_chat_logprob_bytes_rebuild_the_content(default_model_stack, stream):  # noqa: F811
    client = default_model_stack.openai()
    model = client.models.list().data[0].id
    asked = dict(
        model=model, messages=[{"role": "user", "content": PROMPT}], temperature=0, max_tokens=24, logprobs=True,
        top_logprobs=3,
    )  # fmt: skip
    if stream:
        content, entries = "", []
        for chunk in client.chat.completions.create(**asked, stream=True):
            for choice in chunk.choices:
                content += choice.delta.content or ""
                if choice.logprobs and choice.logprobs.content:
                    entries += choice.logprobs.content
    else:
        choice = client.chat.completions.create(**asked).choices[0]
        content, entries = choice.message.content, choice.logprobs.content
    assert any(ord(c) > 0xFFFF or 0x3000 <= ord(c) for c in content), f"no multi-byte character in {content!r}"
    assert b"".join(bytes(e.bytes) for e in entries) == content.encode()
    assert not any("\ufffd" in e.token for e in entries)
    assert any(PARTIAL.match(e.token) for e in entries), "no token held part of a character"
    for entry in entries:
        check_entry(entry.token, entry.bytes)
        for alternative in entry.top_logprobs:
            check_entry(alternative.token, alternative.bytes)


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_completion_logprobs_name_partial_tokens_and_offsets_count_characters(default_model_stack, stream):  # noqa: F811
    client = default_model_stack.openai()
    model = client.models.list().data[0].id
    asked = dict(model=model, prompt="Emoji: 😬😬😬 東京 東京 ", temperature=0, max_tokens=16, logprobs=2)
    if stream:
        text, tokens, offsets = "", [], []
        for chunk in client.completions.create(**asked, stream=True):
            for choice in chunk.choices:
                text += choice.text
                if choice.logprobs:
                    tokens += choice.logprobs.tokens
                    offsets += choice.logprobs.text_offset
    else:
        choice = client.completions.create(**asked).choices[0]
        text, tokens, offsets = choice.text, choice.logprobs.tokens, choice.logprobs.text_offset
    assert not any("\ufffd" in token for token in tokens)
    # A whole token starts at its offset in the text; offsets never go back and stay within it.
    assert offsets == sorted(offsets) and all(0 <= offset <= len(text) for offset in offsets)
    for token, offset in zip(tokens, offsets, strict=True):
        if not PARTIAL.match(token):
            assert text[offset : offset + len(token)] == token, (token, offset, text)


def test_a_partial_character_reads_as_vllm_writes_it():
    assert readable_token("\ufffd", b"\xf0\x9f") == "bytes:\\xf0\\x9f"
    assert readable_token(" hi", b" hi") == " hi"
    assert readable_token("😬", "😬".encode()) == "😬"

"""ApplyChatTemplate renders exactly what transformers' apply_chat_template renders for the same folder."""

from __future__ import annotations

from pathlib import Path

import grpc
import jinja2
import pytest
from transformers import AutoTokenizer

from muestra.v1 import common_pb2, tokenizer_pb2

CONVERSATIONS = {
    "one turn": [{"role": "user", "content": "Hola, ¿qué tal? 🙂"}],
    "full": [
        {"role": "system", "content": '  Answer <briefly> & in "Spanish".  '},
        {"role": "user", "content": "What is 東京?", "name": "ana"},
        {"role": "assistant", "content": "La capital de Japón.\n"},
        {"role": "user", "content": "¿Y de España? 🇪🇸"},
    ],
}


@pytest.fixture(scope="module")
def template_folders(tokenizer_folders) -> dict[str, Path]:
    """The service's models with a chat template: ChatML in the config, Llama 3 and the
    feature-exercising one in chat_template.jinja files."""
    return {name: tokenizer_folders[name] for name in ("bpe", "llama3", "features")}


def render(stub, model: str, messages: list[dict], add_generation_prompt: bool, tokenize: bool = False):
    request = tokenizer_pb2.ApplyChatTemplateRequest(
        model=model,
        messages=[common_pb2.ChatMessage(**m) for m in messages],
        add_generation_prompt=add_generation_prompt,
        tokenize=tokenize,
    )
    return stub.ApplyChatTemplate(request)


@pytest.mark.parametrize("model", ["bpe", "llama3", "features"])
@pytest.mark.parametrize("conversation", sorted(CONVERSATIONS))
@pytest.mark.parametrize("add_generation_prompt", [False, True])
def test_rendered_prompt_equals_transformers(
    tokenizer_stub, template_folders, model, conversation, add_generation_prompt
):
    reference = AutoTokenizer.from_pretrained(template_folders[model])
    messages = CONVERSATIONS[conversation]
    expected = reference.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)
    reply = render(tokenizer_stub, model, messages, add_generation_prompt, tokenize=True)
    assert reply.text == expected
    expected_ids = reference.apply_chat_template(
        messages, tokenize=True, return_dict=False, add_generation_prompt=add_generation_prompt
    )
    assert list(reply.ids) == list(expected_ids)


def test_ids_are_returned_only_with_tokenize(tokenizer_stub):
    reply = render(tokenizer_stub, "bpe", CONVERSATIONS["one turn"], True)
    assert reply.text and len(reply.ids) == 0


def test_a_template_that_raises_gives_invalid_argument_like_transformers_refuses(tokenizer_stub, template_folders):
    messages = [{"role": "user", "content": "hi"}, {"role": "robot", "content": "beep"}]
    with pytest.raises(jinja2.TemplateError, match="Unknown role: robot"):
        AutoTokenizer.from_pretrained(template_folders["llama3"]).apply_chat_template(messages, tokenize=False)
    with pytest.raises(grpc.RpcError) as info:
        render(tokenizer_stub, "llama3", messages, False)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert info.value.details().startswith("messages:") and "Unknown role: robot" in info.value.details()
    assert render(tokenizer_stub, "llama3", messages[:1], False).text

"""Through the gateway: the cache changes no output, and Usage.cached_tokens reports its hits."""

from __future__ import annotations

import pytest
import torch

from tests.fixtures.lm_models import default_suppressed_ids
from tests.fixtures.prefix_cache import BLOCK, block_keys, generate, start_cache_stack, wait_for_keys, wait_until

PROMPT = (
    "Once upon a time, in a land far away, there lived a small robot who loved to count numbers. "
    "The quick brown fox jumps over the lazy dog."
)


@pytest.fixture(scope="module")
def stack(tiny_lm, redis_server, prefix_tokenizer, prefix_log_dir):
    running = start_cache_stack(
        tiny_lm("llama").onnx_dir, "llama", prefix_log_dir, prefix_tokenizer.address, redis_server.url
    )
    yield running
    running.stop()


def _greedy_reference(tiny_lm, prompt: str, max_new_tokens: int) -> tuple[list[int], list[int]]:
    """(prompt ids, transformers' greedy continuation, cut after EOS), with the special tokens the gateway never
    picks by default suppressed there too."""
    lm = tiny_lm("llama")
    model, tokenizer = lm.torch_model(), lm.tokenizer()
    ids = tokenizer(prompt, return_tensors="pt").input_ids
    with torch.no_grad():
        out = model.generate(
            ids, attention_mask=torch.ones_like(ids), pad_token_id=1, max_new_tokens=max_new_tokens, do_sample=False,
            suppress_tokens=default_suppressed_ids(model, tokenizer),
        )  # fmt: skip
    generated = out[0, ids.shape[1] :].tolist()
    eos = model.generation_config.eos_token_id
    if eos in generated:
        generated = generated[: generated.index(eos) + 1]
    return ids[0].tolist(), generated


def test_greedy_output_is_identical_with_the_cache_on_and_off(stack, redis_client, tiny_lm):
    prompt = PROMPT + " Greedy, on and off."
    prompt_ids, expected = _greedy_reference(tiny_lm, prompt, 16)
    full_blocks = (len(prompt_ids) - 1) // BLOCK
    assert full_blocks >= 3

    off_ids, off = generate(stack.stub, prompt, disable_prefix_cache=True)
    cold_ids, cold = generate(stack.stub, prompt)
    wait_for_keys(redis_client, block_keys(stack.lm.fingerprint, prompt_ids))
    hit_ids, hit = generate(stack.stub, prompt)
    off_again_ids, off_again = generate(stack.stub, prompt, disable_prefix_cache=True)

    assert off_ids == cold_ids == hit_ids == off_again_ids == expected
    assert off.usage.prompt_tokens == len(prompt_ids)
    assert (off.usage.cached_tokens, cold.usage.cached_tokens, off_again.usage.cached_tokens) == (0, 0, 0)
    assert hit.usage.cached_tokens == full_blocks * BLOCK


def test_a_request_that_disables_the_cache_neither_reads_nor_writes_it(stack, redis_client, tiny_lm):
    prompt = "Nothing stored for this one. " + PROMPT
    prompt_ids = tiny_lm("llama").tokenizer()(prompt).input_ids
    keys = block_keys(stack.lm.fingerprint, prompt_ids)
    for _ in range(2):
        _, done = generate(stack.stub, prompt, max_tokens=2, disable_prefix_cache=True)
        assert done.usage.cached_tokens == 0
    # A request that uses the cache afterwards proves the keys would have appeared by now.
    generate(stack.stub, "A marker. " + PROMPT, max_tokens=2)
    marker = block_keys(stack.lm.fingerprint, tiny_lm("llama").tokenizer()("A marker. " + PROMPT).input_ids)
    wait_for_keys(redis_client, marker)
    assert len(keys) >= 3 and redis_client.exists(*keys) == 0


def test_without_redis_each_lm_serves_hits_from_its_memory(text_stack, tiny_lm):
    """The embedded default: the lm's hot tier (and its in-process block store behind it) serves the hits, to
    the prompt's last token but one; outputs are unchanged."""
    stack = text_stack("llama", "--prefix-cache-block-size", str(BLOCK))
    prompt = "In process. " + PROMPT
    prompt_ids, expected = _greedy_reference(tiny_lm, prompt, 12)
    first_ids, first = generate(stack.stub, prompt, max_tokens=12)
    assert first_ids == expected and first.usage.cached_tokens == 0
    hits = []

    def hit() -> bool:
        ids, done = generate(stack.stub, prompt, max_tokens=12)
        hits.append((ids, done.usage.cached_tokens))
        return done.usage.cached_tokens > 0

    wait_until(hit, what="an in-process hit")
    ids, cached = hits[-1]
    assert ids == expected
    assert cached == len(prompt_ids) - 2  # the hot tier's reuse is not cut to blocks (2 tokens are left to run)
    assert "in-process LRU" in stack.lm.log_path.read_text()

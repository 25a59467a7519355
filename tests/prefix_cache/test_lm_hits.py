"""The lm service reads a prompt's cached blocks from Redis and gives the logits of a cold prefill."""

from __future__ import annotations

import grpc
import numpy as np
import pytest
import torch

from muestra.runtime.prefix_hash import block_hashes
from muestra.v1 import lm_pb2
from tests.fixtures.prefix_cache import (
    BLOCK,
    FIRST_SIGHT,
    KEY_PREFIX,
    LmClient,
    block_keys,
    prefix_blocks,
    random_prompt,
    wait_for_keys,
    wait_until,
)


def _write_blocks(lm: LmClient, redis_client, ids) -> np.ndarray:
    """A cold prefill that asks for its blocks to be stored; its logits once they are all in Redis."""
    cold, cached = lm.prefill_once(ids, prefix_blocks(lm.fingerprint, ids, cached_blocks=0))
    assert cached == 0
    wait_for_keys(redis_client, block_keys(lm.fingerprint, ids))
    return cold


@pytest.mark.parametrize("blocks", [1, 2, 40], ids=["1-block", "2-blocks", "40-blocks"])
def test_logits_after_a_cache_hit_equal_a_cold_prefill(redis_lm, redis_client, tiny_lm, blocks):
    lm = redis_lm("llama")
    ids = random_prompt(blocks * BLOCK + 3, seed=blocks)
    plain, _ = lm.prefill_once(ids)
    cold = _write_blocks(lm, redis_client, ids)
    hit, cached = lm.prefill_once(ids, prefix_blocks(lm.fingerprint, ids))
    assert cached == blocks * BLOCK
    assert np.abs(hit - cold).max() <= 1e-4
    assert np.abs(hit - plain).max() <= 1e-4
    with torch.no_grad():
        reference = tiny_lm("llama").torch_model()(torch.tensor([ids]), use_cache=False).logits[0, -1].numpy()
    assert np.abs(hit - reference).max() <= 1e-4


@pytest.mark.parametrize("model", ["llama-concat", "llama"], ids=["concat-layout", "shared-buffer-layout"])
def test_decoding_after_a_hit_continues_like_a_cold_row(redis_lm, redis_client, model):
    lm = redis_lm(model)
    ids = random_prompt(5 * BLOCK + 2, seed=77)
    _write_blocks(lm, redis_client, ids)
    _, cached, hit_batch = lm.prefill(ids, prefix_blocks(lm.fingerprint, ids))
    _, _, cold_batch = lm.prefill(ids)
    assert cached == 5 * BLOCK
    for token in (17, 4, 99):
        steps = [
            lm.stub.Decode(lm_pb2.DecodeRequest(batches=[lm_pb2.DecodeBatch(batch_id=b, next_ids=[token])]))
            for b in (hit_batch, cold_batch)
        ]
        hit_batch, cold_batch = steps[0].batch_id, steps[1].batch_id
        logits = [np.frombuffer(s.output.logits.data, "<f4") for s in steps]
        assert np.abs(logits[0] - logits[1]).max() <= 1e-4
    lm.stub.Clear(lm_pb2.ClearRequest(batch_ids=[hit_batch, cold_batch]))


def test_a_hit_leaves_the_last_two_prompt_tokens_to_run(redis_lm, redis_client):
    """A one-position forward rounds apart from a several-position one (prefix_cache.MIN_SUFFIX): a prompt whose
    last full block ends one token before its end uses one block less."""
    lm = redis_lm("llama")
    ids = random_prompt(3 * BLOCK + 1, seed=5)  # 3 full blocks before the last token, none after
    cold = _write_blocks(lm, redis_client, ids)
    hit, cached = lm.prefill_once(ids, prefix_blocks(lm.fingerprint, ids))
    assert cached == 2 * BLOCK
    assert np.abs(hit - cold).max() <= 1e-4
    longer = [*ids, 7]
    _write_blocks(lm, redis_client, longer)
    _, cached = lm.prefill_once(longer, prefix_blocks(lm.fingerprint, longer))
    assert cached == 3 * BLOCK == len(longer) - 2


def test_the_hash_chain_is_the_documented_one(redis_lm):
    """Recomputed here from docs/prefix_cache.md with hashlib, apart from the code the services share."""
    import hashlib
    import struct

    fingerprint = redis_lm("llama").fingerprint
    ids = random_prompt(100, seed=3)
    parent = hashlib.blake2b(b"muestra-prefix-v1|" + fingerprint.encode(), digest_size=16).digest()
    expected = []
    for start in range(0, 96, 8):
        parent = hashlib.blake2b(parent + struct.pack("<8I", *ids[start : start + 8]), digest_size=16).digest()
        expected.append(parent)
    assert block_hashes(fingerprint, ids, 8) == expected
    assert len(block_hashes(fingerprint, ids[:97], 8)) == 12  # 96 tokens before the last one
    assert len(block_hashes(fingerprint, ids[:96], 8)) == 11
    # The chain depends on every earlier token and on the model.
    other = [ids[0] + 1, *ids[1:]]
    assert not set(block_hashes(fingerprint, ids, 8)) & set(block_hashes(fingerprint, other, 8))
    assert not set(block_hashes(fingerprint, ids, 8)) & set(block_hashes("other-model", ids, 8))


@pytest.mark.parametrize(
    ("change", "field"),
    [
        (lambda p: p.block_hashes.__setitem__(1, b"\0" * 16), "rows[0].prefix.block_hashes[1]"),
        (lambda p: setattr(p, "cached_blocks", 99), "rows[0].prefix.cached_blocks"),
        (lambda p: p.block_hashes.append(b"\1" * 16), "rows[0].prefix.block_hashes"),
        (lambda p: setattr(p, "block_size", 0), "rows[0].prefix.block_size"),
    ],
    ids=["wrong-hash", "cached-beyond-hashes", "too-many-blocks", "zero-block-size"],
)
def test_prefix_instructions_that_do_not_fit_the_prompt_are_invalid(redis_lm, change, field):
    lm = redis_lm("llama")
    ids = random_prompt(4 * BLOCK + 2, seed=9)
    prefix = prefix_blocks(lm.fingerprint, ids)
    change(prefix)
    with pytest.raises(grpc.RpcError) as raised:
        lm.prefill(ids, prefix)
    assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert field in raised.value.details()
    lm.prefill_once(ids)  # the service is unaffected


def test_two_lm_replicas_share_hits_through_redis(redis_lm, redis_client, tiny_lm, redis_server, prefix_log_dir):
    first = redis_lm("llama")
    ids = random_prompt(6 * BLOCK + 5, seed=21)
    cold = _write_blocks(first, redis_client, ids)
    flags = ("--redis-url", redis_server.url, "--prefix-cache-key-prefix", KEY_PREFIX, *FIRST_SIGHT)
    second = LmClient.start(tiny_lm("llama").onnx_dir, "llama", prefix_log_dir, *flags)
    try:
        assert second.fingerprint == first.fingerprint
        hit, cached = second.prefill_once(ids, prefix_blocks(second.fingerprint, ids))
        assert cached == 6 * BLOCK
        assert np.abs(hit - cold).max() <= 1e-4
        # ... and the other way round.
        more = random_prompt(3 * BLOCK + 2, seed=22)
        cold_more = _write_blocks(second, redis_client, more)
    finally:
        second.stop()
    hit_more, cached = first.prefill_once(more, prefix_blocks(first.fingerprint, more))
    assert cached == 3 * BLOCK
    assert np.abs(hit_more - cold_more).max() <= 1e-4


def test_a_replica_with_another_cache_key_uses_none_of_these_blocks(
    redis_lm, redis_client, tiny_lm, redis_server, prefix_log_dir, tmp_path
):
    first = redis_lm("llama")
    ids = random_prompt(4 * BLOCK + 3, seed=23)
    cold = _write_blocks(first, redis_client, ids)
    key_file = tmp_path / "cache-key"
    key_file.write_text("another deployment's key\n")
    flags = ("--redis-url", redis_server.url, "--prefix-cache-key-prefix", KEY_PREFIX, *FIRST_SIGHT)
    other = LmClient.start(
        tiny_lm("llama").onnx_dir, "llama", prefix_log_dir, *flags, "--cache-key-file", str(key_file)
    )
    try:
        logits, cached = other.prefill_once(ids, prefix_blocks(other.fingerprint, ids))
    finally:
        other.stop()
    assert cached == 0  # signed with another key: every block is a miss
    assert np.abs(logits - cold).max() <= 1e-4


def test_a_forged_block_is_a_miss_and_is_replaced(redis_lm, redis_client, tiny_lm):
    """A well-formed block (right header, size and hash) written by someone without the cache key."""
    from muestra.lm.prefix_blocks import BlockFormat
    from muestra.runtime.cache_mac import CacheMac

    lm = redis_lm("llama")
    ids = random_prompt(3 * BLOCK + 2, seed=52)
    cold = _write_blocks(lm, redis_client, ids)
    keys = block_keys(lm.fingerprint, ids)
    info = lm.stub.Describe(lm_pb2.DescribeModelRequest())
    attacker = BlockFormat(
        lm.fingerprint, info.kv.num_layers, info.kv.num_kv_heads, info.kv.head_dim, np.float32, CacheMac("guess", "t")
    )
    zeros = [np.zeros((info.kv.num_kv_heads, BLOCK, info.kv.head_dim), np.float32)] * (2 * info.kv.num_layers)
    forged = bytes(attacker.encode(zeros, 0, BLOCK, block_hashes(lm.fingerprint, ids, BLOCK)[0]))
    assert len(forged) == len(redis_client.get(keys[0]))
    redis_client.set(keys[0], forged, ex=3600)
    logits, cached = lm.prefill_once(ids, prefix_blocks(lm.fingerprint, ids))
    assert cached == 0 and np.abs(logits - cold).max() <= 1e-4
    wait_until(lambda: redis_client.get(keys[0]) != forged, what="the forged block rewritten")
    logits, cached = lm.prefill_once(ids, prefix_blocks(lm.fingerprint, ids))
    assert cached == 3 * BLOCK and np.abs(logits - cold).max() <= 1e-4


def test_a_restarted_lm_hits_blocks_written_before_the_restart(tiny_lm, redis_server, redis_client, prefix_log_dir):
    flags = ("--redis-url", redis_server.url, "--prefix-cache-key-prefix", KEY_PREFIX, *FIRST_SIGHT)
    lm = LmClient.start(tiny_lm("llama").onnx_dir, "llama", prefix_log_dir, *flags)
    ids = random_prompt(4 * BLOCK + 4, seed=31)
    try:
        cold = _write_blocks(lm, redis_client, ids)
    finally:
        lm.stop()
    lm = LmClient.start(tiny_lm("llama").onnx_dir, "llama", prefix_log_dir, *flags)
    try:
        hit, cached = lm.prefill_once(ids, prefix_blocks(lm.fingerprint, ids))
    finally:
        lm.stop()
    assert cached == 4 * BLOCK
    assert np.abs(hit - cold).max() <= 1e-4


def test_another_model_never_reads_these_blocks(redis_lm, redis_client):
    llama, qwen = redis_lm("llama"), redis_lm("qwen2")
    assert llama.fingerprint != qwen.fingerprint
    ids = random_prompt(4 * BLOCK + 2, seed=41)
    _write_blocks(llama, redis_client, ids)
    llama_keys, qwen_keys = block_keys(llama.fingerprint, ids), block_keys(qwen.fingerprint, ids)
    assert not set(llama_keys) & set(qwen_keys)
    assert redis_client.exists(*qwen_keys) == 0
    # Even under its own keys (a collision, or a key prefix shared by mistake), a block of the other
    # model (same KV shape here) is foreign: not used, and replaced by this model's own.
    for source, target in zip(llama_keys, qwen_keys, strict=True):
        redis_client.set(target, redis_client.get(source))
    qwen_cold, _ = qwen.prefill_once(ids)
    logits, cached = qwen.prefill_once(ids, prefix_blocks(qwen.fingerprint, ids))
    assert cached == 0
    assert np.abs(logits - qwen_cold).max() <= 1e-4
    wait_until(
        lambda: all(redis_client.get(q) != redis_client.get(s) for q, s in zip(qwen_keys, llama_keys, strict=True)),
        what="the foreign blocks replaced",
    )
    logits, cached = qwen.prefill_once(ids, prefix_blocks(qwen.fingerprint, ids))
    assert cached == 4 * BLOCK
    assert np.abs(logits - qwen_cold).max() <= 1e-4


def test_a_corrupted_block_is_detected_not_used_and_replaced(redis_lm, redis_client):
    lm = redis_lm("llama")
    ids = random_prompt(3 * BLOCK + 2, seed=51)
    cold = _write_blocks(lm, redis_client, ids)
    keys = block_keys(lm.fingerprint, ids)
    original = redis_client.get(keys[1])
    # Flip bytes inside block 1's KV payload (past its header), as a disk or network fault would.
    offset = len(original) - 100
    redis_client.setrange(keys[1], offset, bytes(b ^ 0xFF for b in original[offset : offset + 4]))
    corrupted = redis_client.get(keys[1])
    assert corrupted != original and len(corrupted) == len(original)

    logits, cached = lm.prefill_once(ids, prefix_blocks(lm.fingerprint, ids))
    assert cached == BLOCK  # block 0 only: block 1 is corrupt, so block 2 has no usable past
    assert np.abs(logits - cold).max() <= 1e-4
    wait_until(lambda: redis_client.get(keys[1]) != corrupted, what="the corrupt block rewritten")
    assert redis_client.ttl(keys[1]) > 0

    logits, cached = lm.prefill_once(ids, prefix_blocks(lm.fingerprint, ids))
    assert cached == 3 * BLOCK
    assert np.abs(logits - cold).max() <= 1e-4


def test_by_default_a_one_off_prompt_is_not_stored_and_a_repeated_one_is(
    tiny_lm, redis_server, redis_client, prefix_log_dir
):
    """The default --prefix-cache-min-sightings 2: blocks are stored the second time a prompt holds them."""
    flags = ("--redis-url", redis_server.url, "--prefix-cache-key-prefix", KEY_PREFIX)
    lm = LmClient.start(tiny_lm("llama").onnx_dir, "llama", prefix_log_dir, *flags)
    try:
        assert "a block stored once seen in 2 prompt(s)" in lm.process.log_path.read_text()
        one_off, repeated = random_prompt(3 * BLOCK + 2, seed=61), random_prompt(3 * BLOCK + 2, seed=62)
        lm.prefill_once(one_off, prefix_blocks(lm.fingerprint, one_off, cached_blocks=0))
        for _ in range(2):
            cold, cached = lm.prefill_once(repeated, prefix_blocks(lm.fingerprint, repeated, cached_blocks=0))
            assert cached == 0
        # One writer thread, in order: once the repeated prompt's blocks are in, the one-off's would be too.
        wait_for_keys(redis_client, block_keys(lm.fingerprint, repeated))
        assert redis_client.exists(*block_keys(lm.fingerprint, one_off)) == 0
        hit, cached = lm.prefill_once(repeated, prefix_blocks(lm.fingerprint, repeated))
        assert cached == 3 * BLOCK and np.abs(hit - cold).max() <= 1e-4
    finally:
        lm.stop()

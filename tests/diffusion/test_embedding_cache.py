"""The optional Redis text-embedding cache: hits skip the text encoder, and never change a pixel or fail a request."""

from __future__ import annotations

import numpy as np
import pytest
import redis

from tests.diffusion.client import generate, metric, pixels
from tests.fixtures.diffusion_models import start_diffusion_service
from tests.harness import RedisServer

QUERIES = "muestra_diffusion_text_embedding_cache_queries_total"
HITS = "muestra_diffusion_text_embedding_cache_hits_total"
ERRORS = "muestra_diffusion_text_embedding_cache_errors_total"
CORRUPT = "muestra_diffusion_text_embedding_cache_corrupt_total"
SKIPPED = "muestra_diffusion_text_embedding_cache_skipped_total"
KEYS = "muestra:diffusion:text-embedding:*"


@pytest.fixture(scope="module")
def own_redis(tmp_path_factory):
    """A Redis of this module's own, so that a test can stop it."""
    server = RedisServer(tmp_path_factory.mktemp("redis-embeddings"))
    yield server
    server.stop()


@pytest.fixture(scope="module")
def cached_service(tiny_sd_model, own_redis, tmp_path_factory):
    service = start_diffusion_service(
        tiny_sd_model, tmp_path_factory.mktemp("logs"), "--redis-url", own_redis.url, "--text-embedding-ttl-s", "600"
    )
    yield service
    service.process.stop()


def _counts(service) -> dict[str, float]:
    return {name: metric(service.metrics_port, name) for name in (QUERIES, HITS, ERRORS, CORRUPT)}


def _delta(after: dict, before: dict) -> dict[str, float]:
    return {name.rsplit("_", 2)[-2]: after[name] - before[name] for name in after}


def test_a_repeated_prompt_hits_the_cache_and_gives_the_same_pixels(cached_service, own_redis, reference_sd):
    fields = {"prompt": "a bowl of fruit", "negative_prompt": "blurry", "steps": 3, "seed": 8}
    expected = reference_sd.image(
        prompt="a bowl of fruit", negative_prompt="blurry", width=64, height=64, steps=3, seed=8
    )
    before = _counts(cached_service)
    [first] = generate(cached_service.address, **fields).images
    middle = _counts(cached_service)
    [second] = generate(cached_service.address, **fields).images
    after = _counts(cached_service)

    assert _delta(middle, before) == {"queries": 2, "hits": 0, "errors": 0, "corrupt": 0}
    assert _delta(after, middle) == {"queries": 2, "hits": 2, "errors": 0, "corrupt": 0}
    np.testing.assert_array_equal(pixels(first.png), expected)
    np.testing.assert_array_equal(pixels(second.png), expected)
    client = redis.Redis.from_url(own_redis.url)
    keys = client.keys(KEYS)
    assert len(keys) >= 2
    assert all(0 < client.ttl(key) <= 600 for key in keys)
    # The entry is a JSON header line and raw bytes (then a MAC), not a pickle.
    assert client.get(keys[0]).split(b"\n", 1)[0].startswith(b'{"v":2,"dtype":"float32","shape":[1,77,32]')


def test_a_corrupt_entry_is_a_miss(cached_service, own_redis, reference_sd):
    fields = {"prompt": "a red chair", "steps": 2, "seed": 9, "guidance_scale": 1.0}
    generate(cached_service.address, **fields)
    client = redis.Redis.from_url(own_redis.url)
    for key in client.keys(KEYS):
        blob = client.get(key)
        client.set(key, blob[:-4] + b"\0\0\0\0")
    before = _counts(cached_service)
    [image] = generate(cached_service.address, **fields).images
    assert _delta(_counts(cached_service), before) == {"queries": 1, "hits": 0, "errors": 0, "corrupt": 1}
    expected = reference_sd.image(prompt="a red chair", width=64, height=64, steps=2, seed=9, guidance_scale=1.0)
    np.testing.assert_array_equal(pixels(image.png), expected)


def test_a_forged_entry_is_a_miss(cached_service, own_redis, reference_sd):
    """Well-formed entries (zeros instead of the embeddings) signed by someone without the cache key."""
    import torch

    from muestra.diffusion.embeddings import decode_entry, encode_entry
    from muestra.runtime.cache_mac import CacheMac

    fields = {"prompt": "a blue door", "steps": 2, "seed": 11, "guidance_scale": 1.0}
    generate(cached_service.address, **fields)
    client = redis.Redis.from_url(own_redis.url)
    attacker = CacheMac("a guess", "test")
    ours = CacheMac("muestra-tests-cache-key", "test")  # the session's key (tests/conftest.py)
    for key in client.keys(KEYS):
        genuine = decode_entry(client.get(key), ours)
        if genuine is not None:  # (entries an earlier test corrupted stay as they are)
            client.set(key, encode_entry(torch.zeros(genuine.shape), attacker))
    before = _counts(cached_service)
    [image] = generate(cached_service.address, **fields).images
    assert _delta(_counts(cached_service), before) == {"queries": 1, "hits": 0, "errors": 0, "corrupt": 1}
    expected = reference_sd.image(prompt="a blue door", width=64, height=64, steps=2, seed=11, guidance_scale=1.0)
    np.testing.assert_array_equal(pixels(image.png), expected)


def test_redis_down_makes_every_lookup_a_miss_and_no_request_fail(cached_service, own_redis, reference_sd):
    own_redis.stop()
    try:
        before = _counts(cached_service)
        skipped_before = metric(cached_service.metrics_port, SKIPPED)
        [image] = generate(cached_service.address, prompt="a lighthouse", steps=2, seed=10).images
        delta = _delta(_counts(cached_service), before)
        skipped = metric(cached_service.metrics_port, SKIPPED) - skipped_before
        assert (delta["queries"], delta["hits"]) == (2, 0)
        # The first failure starts a backoff window: the calls after it within the window skip Redis.
        assert delta["errors"] >= 1 and delta["errors"] + skipped >= 2
        expected = reference_sd.image(prompt="a lighthouse", width=64, height=64, steps=2, seed=10)
        np.testing.assert_array_equal(pixels(image.png), expected)
        assert "text-embedding cache read failed" in cached_service.process.log_tail(200)
    finally:
        own_redis.start()

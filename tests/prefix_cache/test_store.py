"""The lm's block stores on their own: Redis with a password, the in-process LRU's bound."""

from __future__ import annotations

import pytest

from muestra.lm.prefix_store import MemoryBlockStore, RedisBlockStore
from tests.harness import RedisServer


@pytest.fixture(scope="module")
def password_redis(tmp_path_factory):
    server = RedisServer(tmp_path_factory.mktemp("redis-password"), ("--requirepass", "s3cret"))
    yield server
    server.stop()


def test_a_password_url_reads_and_writes_and_the_password_is_not_logged(password_redis):
    url = password_redis.url.replace("redis://", "redis://:s3cret@")
    store = RedisBlockStore(url, ttl_s=60, timeout_s=1.0)
    assert "s3cret" not in store.describe()
    assert store.put_many([("pw:a", bytearray(b"x" * 10_000), False), ("pw:b", b"y", False)])
    assert store.get_many(["pw:a", "pw:missing", "pw:b"]) == [b"x" * 10_000, None, b"y"]
    assert store.health.healthy
    store.close()


def test_a_wrong_password_is_a_miss_not_an_error(password_redis, caplog):
    store = RedisBlockStore(password_redis.url.replace("redis://", "redis://:wrong@"), ttl_s=60, timeout_s=1.0)
    assert store.get_many(["pw:a"]) is None
    assert store.put_many([("pw:c", b"z", False)]) is False
    assert not store.health.healthy
    assert "wrong" not in caplog.text
    store.close()


def test_set_nx_keeps_a_present_block_and_overwrite_replaces_it(password_redis):
    store = RedisBlockStore(password_redis.url.replace("redis://", "redis://:s3cret@"), ttl_s=60, timeout_s=1.0)
    store.put_many([("pw:nx", b"first", False)])
    store.put_many([("pw:nx", b"second", False)])
    assert store.get_many(["pw:nx"]) == [b"first"]
    store.put_many([("pw:nx", b"third", True)])
    assert store.get_many(["pw:nx"]) == [b"third"]
    assert 0 < store.client.ttl("pw:nx") <= 60
    store.close()


def test_the_in_process_store_drops_the_least_recently_used_beyond_its_bound():
    store = MemoryBlockStore(max_bytes=300, ttl_s=0)
    store.put_many([(k, b"v" * 100, False) for k in ("a", "b", "c")])
    assert store.get_many(["a"]) == [b"v" * 100]  # "a" is now the most recently used
    store.put_many([("d", b"v" * 100, False)])
    assert store.get_many(["a", "b", "c", "d"]) == [b"v" * 100, None, b"v" * 100, b"v" * 100]
    assert store.nbytes == 300

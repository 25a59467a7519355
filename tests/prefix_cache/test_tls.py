"""rediss:// with a password: the lm and the gateway reach a TLS-only redis-server, and hits work through it."""

from __future__ import annotations

import shutil
import subprocess

import pytest
import redis

from tests.fixtures.prefix_cache import BLOCK, block_keys, generate, start_cache_stack, wait_for_keys
from tests.harness import RedisServer
from tests.prefix_cache.test_gateway import PROMPT, _greedy_reference

PASSWORD = "tls-s3cret"


@pytest.fixture(scope="module")
def tls_redis(tmp_path_factory):
    """A redis-server that speaks only TLS (self-signed certificate for 127.0.0.1) and wants a password."""
    if shutil.which("openssl") is None:
        pytest.fail("openssl is needed to make the test certificate")
    workdir = tmp_path_factory.mktemp("tls-redis")
    cert, key = workdir / "cert.pem", workdir / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(cert),
         "-days", "1", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"],
        check=True, capture_output=True,
    )  # fmt: skip
    server = RedisServer(workdir, tls=(cert, key), extra_args=("--requirepass", PASSWORD))
    url = f"rediss://:{PASSWORD}@127.0.0.1:{server.port}/0?ssl_ca_certs={cert}"
    yield url, server
    server.stop()


def test_hits_through_a_tls_redis_with_a_password(tls_redis, tiny_lm, prefix_tokenizer, prefix_log_dir):
    url, server = tls_redis
    client = redis.Redis.from_url(url)
    with pytest.raises(redis.ConnectionError):  # plain TCP is refused: only TLS is served
        redis.Redis(host="127.0.0.1", port=server.port, password=PASSWORD, socket_timeout=2).ping()
    stack = start_cache_stack(tiny_lm("llama").onnx_dir, "llama", prefix_log_dir, prefix_tokenizer.address, url)
    try:
        prompt = "Over TLS. " + PROMPT
        prompt_ids, expected = _greedy_reference(tiny_lm, prompt, 12)
        cold_ids, cold = generate(stack.stub, prompt, max_tokens=12)
        wait_for_keys(client, block_keys(stack.lm.fingerprint, prompt_ids))
        hit_ids, hit = generate(stack.stub, prompt, max_tokens=12)
        assert cold_ids == hit_ids == expected
        assert cold.usage.cached_tokens == 0
        assert hit.usage.cached_tokens == (len(prompt_ids) - 1) // BLOCK * BLOCK > 0
        for log in (stack.lm.process.log_path, stack.gateway.log_path):
            text = log.read_text()
            assert PASSWORD not in text  # the URL is logged with *** for its password
            assert "failed" not in text
    finally:
        stack.stop()
        client.close()

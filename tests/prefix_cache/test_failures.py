"""Redis down, slow or full: every request still completes correctly, as a miss, with one log line per incident."""

from __future__ import annotations

import logging
import threading
import time
import urllib.request

import numpy as np
import pytest
import redis

from muestra.lm.prefix_store import CacheHealth
from tests.fixtures.prefix_cache import (
    BLOCK,
    block_keys,
    generate,
    prefix_blocks,
    random_prompt,
    start_cache_stack,
    wait_for_keys,
    wait_until,
)
from tests.harness import RedisServer, free_port

PROMPT = "Once upon a time, in a land far away, there lived a small robot who loved to count numbers."
FAILING = "every request is a miss until it recovers"


@pytest.fixture(scope="module")
def own_redis(tmp_path_factory):
    server = RedisServer(tmp_path_factory.mktemp("prefix-redis"))
    yield server
    server.stop()


@pytest.fixture(scope="module")
def stack(tiny_lm, own_redis, prefix_tokenizer, prefix_log_dir):
    ports = {"lm": free_port(), "gateway": free_port()}
    running = start_cache_stack(
        tiny_lm("llama").onnx_dir, "llama", prefix_log_dir, prefix_tokenizer.address, own_redis.url,
        lm_flags=("--metrics-port", str(ports["lm"])), gateway_flags=("--metrics-port", str(ports["gateway"])),
    )  # fmt: skip
    running.metrics_ports = ports
    yield running
    running.stop()


def _log_since(path, offset: int) -> str:
    return path.read_text(errors="replace")[offset:]


def _log_size(path) -> int:
    return len(path.read_text(errors="replace"))


def _metric(port: int, name: str) -> float:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name))


def test_requests_complete_while_redis_is_killed_and_hits_resume_after_it_restarts(stack, own_redis):
    prompts = [f"Request {i}. {PROMPT}" for i in range(3)]
    reference = {
        p: generate(stack.stub, p, max_tokens=120, ignore_eos=True, disable_prefix_cache=True)[0] for p in prompts
    }
    generate(stack.stub, prompts[0], max_tokens=1)
    wait_until(lambda: generate(stack.stub, prompts[0], max_tokens=1)[1].usage.cached_tokens > 0, what="a first hit")
    logs = {name: (proc.log_path, _log_size(proc.log_path)) for name, proc in
            (("lm", stack.lm.process), ("gateway", stack.gateway))}  # fmt: skip

    results = {}

    def run(prompt: str) -> None:
        results[prompt] = generate(stack.stub, prompt, max_tokens=120, ignore_eos=True)

    threads = [threading.Thread(target=run, args=(p,)) for p in prompts]
    for thread in threads:
        thread.start()
    time.sleep(0.3)
    own_redis.proc.kill()  # SIGKILL: no goodbye to the clients
    own_redis.proc.wait()
    for thread in threads:
        thread.join(120)
    for prompt in prompts:
        ids, done = results[prompt]
        assert ids == reference[prompt]
        assert not done.error

    # New requests while Redis is down: misses, correct, and they don't wait for a timeout each.
    started = time.monotonic()
    for prompt in prompts:
        ids, done = generate(stack.stub, prompt, max_tokens=120, ignore_eos=True)
        assert ids == reference[prompt] and done.usage.cached_tokens == 0
    assert time.monotonic() - started < 30

    own_redis.start()  # same port, empty
    found = []

    def hit() -> bool:
        ids, done = generate(stack.stub, prompts[1], max_tokens=120, ignore_eos=True)
        found.append((ids, done.usage.cached_tokens))
        return done.usage.cached_tokens > 0

    wait_until(hit, timeout_s=60, what="hits after Redis restarted")
    assert found[-1][0] == reference[prompts[1]]

    for name, (path, offset) in logs.items():
        text = _log_since(path, offset)
        assert text.count(FAILING) == 1, f"{name} log:\n{text}"
        assert text.count("answers again") + text.count("answers lookups again") == 1, f"{name} log:\n{text}"
    assert _metric(stack.metrics_ports["lm"], "muestra_lm_prefix_cache_incidents_total") >= 1
    assert _metric(stack.metrics_ports["gateway"], "muestra_prefix_cache_incidents_total") >= 1
    assert _metric(stack.metrics_ports["gateway"], "muestra_prefix_cache_hits_total{") > 0
    assert _metric(stack.metrics_ports["lm"], "muestra_lm_prefix_cache_hits_total") > 0
    assert _metric(stack.metrics_ports["lm"], "muestra_lm_prefix_cache_read_bytes_total") > 0


def test_a_full_redis_makes_writes_misses_and_one_warning(stack, own_redis):
    client = redis.Redis.from_url(own_redis.url)
    path = stack.lm.process.log_path
    offset = _log_size(path)
    client.config_set("maxmemory-policy", "noeviction")
    client.config_set("maxmemory", "1")  # every write is refused with an OOM error
    try:
        lm = stack.lm
        keys = []
        for seed in range(4):
            ids = random_prompt(4 * BLOCK + 1, seed=100 + seed)
            keys += block_keys(lm.fingerprint, ids)
            cold, _ = lm.prefill_once(ids)
            logits, cached = lm.prefill_once(ids, prefix_blocks(lm.fingerprint, ids, cached_blocks=0))
            assert cached == 0 and np.abs(logits - cold).max() <= 1e-4
            time.sleep(0.3)
        wait_until(lambda: FAILING in _log_since(path, offset), what="the OOM warning")
        assert client.exists(*keys) == 0
    finally:
        client.config_set("maxmemory", "0")
    ids = random_prompt(4 * BLOCK + 1, seed=200)

    def written() -> bool:
        lm.prefill_once(ids, prefix_blocks(lm.fingerprint, ids, cached_blocks=0))
        time.sleep(0.2)
        return client.exists(*block_keys(lm.fingerprint, ids)) == 4

    wait_until(written, timeout_s=60, what="writes after Redis has room again")
    text = _log_since(path, offset)
    assert text.count(FAILING) == 1 and "maxmemory" in text and text.count("answers again") == 1, text
    client.close()


def test_a_slow_redis_is_a_miss_after_the_timeout(stack, own_redis):
    client = redis.Redis.from_url(own_redis.url)
    lm = stack.lm
    ids = random_prompt(5 * BLOCK + 3, seed=300)
    cold, _ = lm.prefill_once(ids, prefix_blocks(lm.fingerprint, ids, cached_blocks=0))
    wait_for_keys(client, block_keys(lm.fingerprint, ids))
    client.execute_command("CLIENT", "PAUSE", "4000", "ALL")
    started = time.monotonic()
    logits, cached = lm.prefill_once(ids, prefix_blocks(lm.fingerprint, ids))
    elapsed = time.monotonic() - started
    assert cached == 0 and np.abs(logits - cold).max() <= 1e-4
    assert elapsed < 3.0  # the lm's 0.5 s timeout, not the 4 s pause
    time.sleep(4.5 - elapsed)

    def hit() -> bool:
        return lm.prefill_once(ids, prefix_blocks(lm.fingerprint, ids))[1] == 5 * BLOCK

    wait_until(hit, timeout_s=40, what="hits after the pause")
    client.close()


def test_cache_health_logs_once_per_incident(caplog):
    health = CacheHealth("Redis at test")
    health.BACKOFF_S = 0.0
    with caplog.at_level(logging.INFO, logger="muestra.lm.prefix_cache"):
        for _ in range(2):
            for _ in range(50):
                if health.should_try("read"):
                    health.failed("read", ConnectionError("refused"))
            health.succeeded("write")  # another kind of call does not end a read incident
            assert not health.healthy
            health.succeeded("read")
            health.succeeded("read")
            assert health.healthy
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    infos = [r for r in caplog.records if "answers again" in r.getMessage()]
    assert len(warnings) == 2 and len(infos) == 2


def test_a_failing_backend_is_skipped_between_probes():
    health = CacheHealth("Redis at test")
    health.failed("read", TimeoutError("slow"))
    assert [health.should_try("read") for _ in range(100)].count(True) == 0
    health._retry_at = time.monotonic()  # the backoff window has passed
    assert [health.should_try("read") for _ in range(100)].count(True) == 1

"""Fixtures shared by the whole suite. Area-specific fixtures live in tests/fixtures/."""

from __future__ import annotations

import os

import pytest

from tests.harness import RedisServer

# Test gateways keep the HTTP API off unless a test asks for it with --http-port (a flag beats
# this variable), so that no two of them compete for the default port.
os.environ.setdefault("MUESTRA_GATEWAY_HTTP_PORT", "-1")
# Services sharing the session's Redis sign cache blocks with one key, as a deployment's replicas do
# (without one, each process signs with a random key and no two share blocks).
os.environ.setdefault("MUESTRA_CACHE_KEY", "muestra-tests-cache-key")

pytest_plugins = [
    "tests.fixtures.diffusion_models",
    "tests.fixtures.tokenizers",
    "tests.fixtures.lm_models",
    "tests.fixtures.lm_service",
    "tests.fixtures.samplers",
    "tests.fixtures.text_stack",
    "tests.fixtures.openai_stack",
    "tests.fixtures.prefix_cache",
    "tests.fixtures.structured",
    "tests.fixtures.default_model",
]


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory):
    """A real redis-server on a loopback port for the whole session."""
    server = RedisServer(tmp_path_factory.mktemp("redis"))
    yield server
    server.stop()

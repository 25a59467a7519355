"""Fixtures shared by the whole suite. Area-specific fixtures live in tests/fixtures/."""

from __future__ import annotations

import pytest

from tests.harness import RedisServer

pytest_plugins = [
    "tests.fixtures.diffusion_models",
    "tests.fixtures.tokenizers",
    "tests.fixtures.lm_models",
    "tests.fixtures.lm_service",
    "tests.fixtures.samplers",
    "tests.fixtures.text_stack",
    "tests.fixtures.openai_stack",
]


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory):
    """A real redis-server on a loopback port for the whole session."""
    server = RedisServer(tmp_path_factory.mktemp("redis"))
    yield server
    server.stop()

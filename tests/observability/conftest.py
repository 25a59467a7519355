"""One stack of real processes that logs at DEBUG and exports metrics on every service."""

from __future__ import annotations

import pytest

from bench.stack import LocalStack


@pytest.fixture(scope="session")
def observed(tmp_path_factory):
    """redis-server, tokenizer, one lm, diffusion and a gateway that admits at most 2 rows at a time. The lm keeps
    no hot tier, so that repeated prompts read their blocks from Redis (the `hot` rows of docs/metrics.md move in
    tests/prefix_cache/test_conversations.py)."""
    stack = LocalStack(
        tmp_path_factory.mktemp("observed"), lm_replicas=1, log_level="DEBUG", metrics=True,
        gateway_args=("--max-batch-rows", "2"), lm_args=("--hot-tier", "false"),
    )  # fmt: skip
    yield stack
    stack.close()

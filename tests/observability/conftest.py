"""One stack of real processes that logs at DEBUG and exports metrics on every service."""

from __future__ import annotations

import pytest

from bench.stack import LocalStack


@pytest.fixture(scope="session")
def observed(tmp_path_factory):
    """redis-server, tokenizer, one lm, diffusion and a gateway that admits at most 2 rows at a time."""
    stack = LocalStack(
        tmp_path_factory.mktemp("observed"), lm_replicas=1, log_level="DEBUG", metrics=True,
        gateway_args=("--max-batch-rows", "2"),
    )  # fmt: skip
    yield stack
    stack.close()

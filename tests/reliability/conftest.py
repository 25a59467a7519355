"""Stacks of real processes for the reliability tests: models/tiny-text-fixture, killable services."""

from __future__ import annotations

import pytest

from bench.stack import LocalStack


@pytest.fixture(scope="module")
def two_replicas(tmp_path_factory):
    """tokenizer, two lm replicas and a gateway (no Redis, no images); replicas are killed and restarted."""
    stack = LocalStack(
        tmp_path_factory.mktemp("two-replicas"), lm_replicas=2, image_model=None, redis=False,
        gateway_args=("--health-interval-s", "0.5"),
    )  # fmt: skip
    yield stack
    stack.close()

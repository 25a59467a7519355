"""Each Prefill row's cached prefix: found before its forward (the hot tier, or the shared tier's blocks), then counted
and its new blocks queued for writing."""

from __future__ import annotations

import asyncio

import numpy as np

from muestra.lm.batch import RowCache
from muestra.lm.engine_io import PrefillInput
from muestra.lm.hot_tier import HotTier
from muestra.lm.limits import Limits
from muestra.lm.prefix_cache import MIN_SUFFIX, PrefixCache, PrefixPlan
from muestra.v1 import lm_pb2


async def load_prefixes(
    cache: PrefixCache, pb_rows: list[lm_pb2.PrefillRow], rows: list[PrefillInput], hot: HotTier | None, limits: Limits
) -> list[PrefixPlan | None]:
    """Each row's cached prefix: from the hot tier when it holds at least what the shared tier would give
    (no read), else the shared tier's blocks (read off the model thread); the row's prompt is cut to the
    rest, and it is told what the cache does with it once it leaves."""
    loop = asyncio.get_running_loop()
    pending = []
    for i, (pb_row, row) in enumerate(zip(pb_rows, rows, strict=True)):
        if not pb_row.HasField("prefix"):
            pending.append(None)
            continue
        limits.check_ids(f"rows[{i}].input_ids", row.input_ids)
        prefix = pb_row.prefix
        checked = cache.check(
            f"rows[{i}].prefix", row.input_ids, prefix.block_size, prefix.block_hashes,
            prefix.cached_blocks, prefix.write, prefix.write_on_leave,
        )  # fmt: skip
        limit = row.input_ids.size - MIN_SUFFIX
        resident, length = hot.longest(row.input_ids, limit) if hot is not None and limit > 0 else (None, 0)
        shared = min(checked.cached_blocks, checked.usable_blocks) * checked.block_size
        if resident is not None and length >= max(shared, checked.block_size):
            pending.append(cache.from_hot(checked, resident, length))
        else:
            pending.append(loop.run_in_executor(cache.read_pool, cache.load, checked))
    plans = [p if isinstance(p, PrefixPlan) or p is None else await p for p in pending]
    for row, plan in zip(rows, plans, strict=True):
        if plan is None:
            continue
        request = plan.request
        row.cache = RowCache(request.block_size, plan.stored_blocks, request.write_on_leave, row.input_ids.size)
        if plan.cached_tokens:
            row.history = row.input_ids
            row.past = plan.past
            row.input_ids = row.input_ids[plan.cached_tokens :]
    return plans


def record_prefixes(
    cache: PrefixCache,
    plans: list[PrefixPlan | None],
    rows: list[PrefillInput],
    output: lm_pb2.BatchOutput,
    kv,
    lengths: np.ndarray,
) -> list[tuple[PrefixPlan, object, int, int]]:
    """Count each prefilled row that asked the cache, tell its output what it reused, and return the writes its plan
    asks for (plan, kv storage, row, row length). A past the row found at its turn (adoption.py) counts as hot."""
    writes = []
    for i, (row, plan) in enumerate(zip(output.rows, plans, strict=True)):
        if plan is not None:
            if rows[i].adopted > plan.cached_tokens:  # found at its turn, in the hot tier or a live row
                plan.cached_tokens, plan.tier = rows[i].adopted, "hot"
            row.cached_tokens = plan.cached_tokens
            row.cache_tier = plan.tier
            cache.record(plan, plan.cached_tokens + rows[i].input_ids.size)
            if plan.writes:
                writes.append((plan, kv, i, int(lengths[i])))
    return writes

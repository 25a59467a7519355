"""A prompt's past found in this service at its prefill: in the hot tier, or in a row still in a batch."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

import numpy as np

from muestra.lm.batch import KV, Batch, OwnedPast
from muestra.lm.engine_io import PrefillInput
from muestra.lm.hot_tier import HotTier, Resident, common_prefix
from muestra.lm.lanes import Lanes
from muestra.lm.prefix_cache import MIN_SUFFIX


def adopt_past(row: PrefillInput, hot: HotTier, batches: Iterable[Batch | Lanes], storage_cls: type[KV]) -> None:
    """Just before a prompt runs, take the longest past this service holds for it, where it covers more than
    the past the prompt came with (read on the event loop, before this job's turn): the hot tier as it is
    now (a turn that left while the prompt waited), or a row still in a batch (a turn that ended but whose
    Filter has not come yet: the gateway starts a prefill as a request arrives; or a request that shares a
    prompt with one running), whose KV is copied. The prompt's last MIN_SUFFIX tokens are left to run."""
    full = row.history if row.history is not None else row.input_ids
    have = row.past[0].shape[1] if row.past is not None else 0
    limit = full.size - MIN_SUFFIX
    resident, best = hot.longest(full, limit)
    source = None
    for batch in batches:
        for index in range(batch.rows):
            ids = batch.row_ids(index)
            if min(len(ids), limit) <= best or ids[0] != full[0]:
                continue
            length = common_prefix(ids, full, limit)
            if length > best:
                best, source = length, (batch, index)
    if best <= have or best < row.cache.block_size:
        return
    if source is not None:
        batch, index = source
        row.past = [np.array(a) for a in batch.row_kv(index, best)]
        known = batch.cache[index]
    elif _takes_over(hot, storage_cls, resident, best):
        # The prompt goes on from the whole of a conversation's turn: it takes the turn's buffer over.
        row.past = OwnedPast([a[:, :best] for a in resident.kv], storage_cls(list(resident.owner)))
        known = resident
    else:
        row.past = [a[:, :best] for a in resident.kv]  # the tier's arrays are never written
        known = resident
    row.history, row.input_ids, row.adopted = full, full[best:], best
    # Blocks of that past already in the shared tier need no write when this row leaves.
    if known is not None and known.block_size == row.cache.block_size:
        stored = min(known.stored_blocks, best // row.cache.block_size)
        if stored > row.cache.stored_blocks:
            row.cache = dataclasses.replace(row.cache, stored_blocks=stored)


def _takes_over(hot: HotTier, storage_cls: type[KV], resident: Resident, length: int) -> bool:
    """Whether a prompt that starts with all of `resident` takes its buffer over (removing it from the tier)
    rather than copying it: a lone row's shared buffer, which its next turn writes on past its end."""
    whole = length == len(resident.ids) and resident.owner is not None
    return whole and storage_cls.shares_buffer and hot.take(resident)

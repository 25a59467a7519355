"""One batch whose rows sit in several KV buffers (lanes) of different lengths, a forward per lane and step.

A KV buffer holds every row at the length of its longest one (kv.py), so a 5,500-token row joined to three
short ones pads each of them to 5,632 positions: 0.8 GB of the default model's KV allocated, and copied, for
nothing, and on this project's VM a 3 s stall of the running rows while it was faulted in. When joining rows
would pad them by more than `LANE_WASTE_BYTES`, they stay in lanes of their own instead: the caller still sees
one batch, in its own row order; each step runs one forward per lane (the long row's attention costs what it
costs either way). Lanes merge again once the padding they would cost is small (the long row left).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from muestra.lm.batch import Batch, OutputSpec, RowCache
from muestra.lm.model import OnnxDecoder

# Rows are kept apart rather than padded to a longer neighbour when the padding would take more than this.
LANE_WASTE_BYTES = 64 << 20
# Most lanes one batch keeps (each is a forward per step); past it the closest ones merge whatever they waste.
MAX_LANES = 4


class Lanes:
    """Rows of one batch in several Batches: row i is row where[i][1] of lanes[where[i][0]]."""

    def __init__(self, lanes: list[Batch], where: list[tuple[int, int]]) -> None:
        self.lanes = lanes
        self.where = where

    # -- what the engine reads, row by row in the caller's order ---------------------------------------

    @property
    def rows(self) -> int:
        return len(self.where)

    @property
    def lengths(self) -> np.ndarray:
        return np.array([self.lanes[lane].lengths[row] for lane, row in self.where], dtype=np.int64)

    @property
    def request_ids(self) -> list[str]:
        return [self.lanes[lane].request_ids[row] for lane, row in self.where]

    @property
    def cache(self) -> list[RowCache | None]:
        return [self.lanes[lane].cache[row] for lane, row in self.where]

    @property
    def outputs(self) -> list[OutputSpec]:
        return [self.lanes[lane].outputs[row] for lane, row in self.where]

    @outputs.setter
    def outputs(self, specs: list[OutputSpec]) -> None:
        for (lane, row), spec in zip(self.where, specs, strict=True):
            self.lanes[lane].outputs[row] = spec

    @property
    def nbytes(self) -> int:
        return sum(lane.nbytes for lane in self.lanes)

    def row_ids(self, row: int) -> np.ndarray:
        lane, index = self.where[row]
        return self.lanes[lane].row_ids(index)

    def row_kv(self, row: int, length: int) -> list[np.ndarray]:
        lane, index = self.where[row]
        return self.lanes[lane].row_kv(index, length)

    def _members(self) -> list[np.ndarray]:
        """Per lane, the caller's row index of each of its rows, in the lane's order."""
        members = [np.empty(lane.rows, dtype=np.int64) for lane in self.lanes]
        for i, (lane, row) in enumerate(self.where):
            members[lane][row] = i
        return members

    # -- steps: one forward per lane --------------------------------------------------------------------

    def step(self, decoder: OnnxDecoder, next_ids: np.ndarray) -> tuple[np.ndarray, int]:
        ids = np.asarray(next_ids, dtype=np.int64)
        ids = ids[:, None] if ids.ndim == 1 else ids
        out, forward_us = None, 0
        for lane, members in zip(self.lanes, self._members(), strict=True):
            logits, us = lane.step(decoder, ids[members])
            if out is None:
                out = np.empty((self.rows, logits.shape[1]), dtype=logits.dtype)
            out[members] = logits
            forward_us += us
        return out, forward_us

    def verify(
        self, decoder: OnnxDecoder, next_ids: np.ndarray, drafts: Sequence[np.ndarray]
    ) -> tuple[list[np.ndarray], int]:
        out: list[np.ndarray | None] = [None] * self.rows
        forward_us = 0
        for lane, members in zip(self.lanes, self._members(), strict=True):
            per_row, us = lane.verify(decoder, np.asarray(next_ids)[members], [drafts[i] for i in members])
            for i, logits in zip(members.tolist(), per_row, strict=True):
                out[i] = logits
            forward_us += us
        return out, forward_us

    def rollback(self, decoder: OnnxDecoder, drop: np.ndarray) -> None:
        drop = np.asarray(drop, dtype=np.int64)
        for lane, members in zip(self.lanes, self._members(), strict=True):
            lane.rollback(decoder, drop[members])

    def rolled_back_copy(self, decoder: OnnxDecoder, drop: np.ndarray) -> Lanes:
        """A copy without each row's last drop[i] tokens (the original stays until the step has succeeded)."""
        drop = np.asarray(drop, dtype=np.int64)
        lanes = [lane.rolled_back_copy(decoder, drop[m]) for lane, m in zip(self.lanes, self._members(), strict=True)]
        return Lanes(lanes, list(self.where))

    def suppress(self, logits: np.ndarray, unless: Sequence[bool] | None = None) -> None:
        for lane, members in zip(self.lanes, self._members(), strict=True):
            part = logits[members]
            lane.suppress(part, None if unless is None else [unless[i] for i in members])
            logits[members] = part

    def suppress_row(self, logits: np.ndarray, row: int) -> None:
        lane, index = self.where[row]
        self.lanes[lane].suppress_row(logits, index)

    def filter(self, decoder: OnnxDecoder, rows: Sequence[int]) -> Batch | Lanes:
        """The rows at these indices, in this order (repeats copy a row), lanes merged where it costs little."""
        local: list[list[int]] = [[] for _ in self.lanes]
        where = []
        for row in rows:
            lane, index = self.where[row]
            where.append((lane, len(local[lane])))
            local[lane].append(index)
        kept = [i for i, indices in enumerate(local) if indices]
        renumber = {old: new for new, old in enumerate(kept)}
        lanes = [self.lanes[i].filter(decoder, local[i]) for i in kept]
        return _merged(decoder, lanes, [(renumber[lane], row) for lane, row in where])


def _parts(batch: Batch | Lanes) -> tuple[list[Batch], list[tuple[int, int]]]:
    if isinstance(batch, Lanes):
        return list(batch.lanes), list(batch.where)
    return [batch], [(0, row) for row in range(batch.rows)]


def join(decoder: OnnxDecoder, batches: Sequence[Batch | Lanes]) -> Batch | Lanes:
    """One batch holding the rows of `batches` in order: one buffer where that pads little, else lanes."""
    lanes: list[Batch] = []
    where: list[tuple[int, int]] = []
    for batch in batches:
        parts, places = _parts(batch)
        where += [(len(lanes) + lane, row) for lane, row in places]
        lanes += parts
    return _merged(decoder, lanes, where)


def _width(decoder: OnnxDecoder, lane: Batch) -> int:
    """Positions a lane's buffer holds per row (as kv.bytes_for counts them)."""
    return decoder.storage_cls.bytes_for([int(lane.lengths.max())], 1, decoder.context_length)


def _merged(decoder: OnnxDecoder, lanes: list[Batch], where: list[tuple[int, int]]) -> Batch | Lanes:
    """Lanes joined into one buffer wherever the padding that costs is within LANE_WASTE_BYTES (the widest
    lanes first), at most MAX_LANES left; a single lane is returned as the Batch it is."""
    per_position = decoder.kv_bytes_per_token
    groups = [[i] for i in sorted(range(len(lanes)), key=lambda i: _width(decoder, lanes[i]))]

    def waste(a: list[int], b: list[int]) -> int:
        width = max(_width(decoder, lanes[i]) for i in a + b)
        return sum(lanes[i].rows * (width - _width(decoder, lanes[i])) for i in a + b) * per_position

    merged = True
    while merged and len(groups) > 1:
        merged = False
        costs = [waste(groups[i], groups[i + 1]) for i in range(len(groups) - 1)]
        best = int(np.argmin(costs))
        if costs[best] <= LANE_WASTE_BYTES or len(groups) > MAX_LANES:
            groups[best : best + 2] = [groups[best] + groups[best + 1]]
            merged = True
    if len(groups) == len(lanes) and len(lanes) > 1:
        return Lanes(lanes, where)
    # Build each group's buffer (one copy for a group of several lanes) and map every row to its place there;
    # a group's lanes go in the caller's order, so rows that were in order stay so.
    first = {}
    for i, (lane, _) in enumerate(where):
        first.setdefault(lane, i)
    new_lanes, place = [], {}
    for group in groups:
        group = sorted(group, key=lambda i: first.get(i, len(where)))
        offset = 0
        for i in group:
            for row in range(lanes[i].rows):
                place[i, row] = (len(new_lanes), offset + row)
            offset += lanes[i].rows
        new_lanes.append(lanes[group[0]] if len(group) == 1 else Batch.concatenate(decoder, [lanes[i] for i in group]))
    where = [place[lane, row] for lane, row in where]
    if len(new_lanes) == 1 and where == [(0, row) for row in range(new_lanes[0].rows)]:
        return new_lanes[0]
    if len(new_lanes) == 1:
        return new_lanes[0].filter(decoder, [row for _, row in where])
    return Lanes(new_lanes, where)

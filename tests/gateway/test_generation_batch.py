"""Batch membership in generation/batch.py without processes: which rows a Filter keeps, in which order,
how joining batches enter a Decode, and what a lost batch leaves behind.

The lm side of the same contract (Filter with repeats, Decode concatenating batches) is tested against
real onnxruntime sessions in tests/lm; through the whole stack in tests/gateway/test_samplers_beam.py
and test_generate.py (n > 1).
"""

from __future__ import annotations

import types

from muestra.gateway.engine.generation.batch import Joining, RunningBatch, decode_batch, filter_plan, groups, requests
from muestra.gateway.engine.generation.request import BeamGroup, BeamRow, GenerationRequest, Sequence
from muestra.v1 import gateway_pb2, lm_pb2


def request(n: int = 1) -> GenerationRequest:
    return GenerationRequest(request_id="r", prompt_ids=[1, 2], max_tokens=4, n=n, seed=0, chain=None)


def sequences(count: int, req: GenerationRequest | None = None) -> list[Sequence]:
    req = req or request(count)
    sampling = types.SimpleNamespace(constraint=None, output_kind=lm_pb2.ARGMAX, mask_in_lm=True)
    return [Sequence(req, i, sampling) for i in range(count)]


def beam_group(beams: int, step=None, done=False) -> tuple[BeamGroup, list[BeamRow]]:
    group = BeamGroup(request(), types.SimpleNamespace(done=done))
    group.pending = step
    return group, [BeamRow(group, 7) for _ in range(beams)]


def test_unchanged_rows_keep_their_places():
    rows = sequences(3)
    keep, kept, cancelled = filter_plan(rows)
    assert keep == [0, 1, 2] and kept == rows and cancelled == []


def test_finished_rows_leave_and_cancelled_ones_are_handed_back():
    a, b, c = sequences(3, request(3))
    d = sequences(1)[0]
    b.finish(gateway_pb2.STOP)
    d.request.cancelled = True
    keep, kept, cancelled = filter_plan([a, b, c, d])
    assert keep == [0, 2] and kept == [a, c]
    # A row that finished by itself has emitted its end already; a cancelled request's rows have not.
    assert cancelled == [d]


def test_n_completions_of_one_request_are_separate_rows():
    first, second = sequences(2)
    first.finish(gateway_pb2.LENGTH)
    keep, kept, _ = filter_plan([first, second])
    assert keep == [1] and kept == [second]


def test_beams_are_reordered_by_their_last_search_step():
    """Beam rows follow the search: the next beams come from rows (1, 1, 0) of the group, with new tokens."""
    lone = sequences(1)[0]
    step = types.SimpleNamespace(source_rows=[1, 1, 0], next_tokens=[30, 31, 32])
    group, beams = beam_group(3, step)
    keep, kept, _ = filter_plan([lone, *beams])
    assert keep == [0, 2, 2, 1]
    assert kept[0] is lone
    assert [row.pending_token for row in kept[1:]] == [30, 31, 32]
    assert all(row.group is group for row in kept[1:]) and group.pending is None


def test_a_finished_search_leaves_the_batch_whole():
    _, beams = beam_group(2, done=True)
    lone = sequences(1)[0]
    keep, kept, cancelled = filter_plan([*beams, lone])
    assert keep == [2] and kept == [lone] and cancelled == []


def test_a_cancelled_search_hands_back_its_n_completions():
    group, beams = beam_group(2)
    group.request.cancelled = True
    keep, _, cancelled = filter_plan(beams)
    assert keep == [] and cancelled == group.sequences


def test_groups_and_requests_are_listed_once_in_order():
    group, beams = beam_group(2, types.SimpleNamespace(source_rows=[0, 0], next_tokens=[1, 2]))
    a, b = sequences(2)
    rows = [a, beams[0], b, beams[1]]
    assert groups(rows) == {group: [1, 3]}
    assert requests(rows) == [a.request, group.request]


def test_joining_batches_enter_the_next_decode_after_the_running_one():
    running, joining = sequences(2), sequences(1)
    for row, token in zip([*running, *joining], [10, 11, 12], strict=True):
        row.pending_token = token
    batch = RunningBatch()
    batch.batch_id, batch.rows = "run", list(running)
    batch.joining.append(Joining("new", joining))
    assert len(batch) == 3 and batch.all_rows() == [*running, *joining]
    decoded = batch.decode_batches(masked=False, tokens=1)
    assert [(b.batch_id, list(b.next_ids)) for b in decoded] == [("run", [10, 11]), ("new", [12])]
    assert batch.rows == [*running, *joining] and batch.joining == []


def test_a_row_with_queued_tokens_feeds_what_the_step_takes_and_keeps_the_rest():
    (row,) = sequences(1)
    row.pending_token, row.queued = 5, [6, 7, 8]
    step = decode_batch("b", [row], masked=True, tokens=2)
    assert list(step.next_ids) == [5, 6]
    assert (row.pending_token, row.queued, row.in_flight) == (7, [8], True)
    # Its next token is known already: the lm only needs its argmax.
    assert [o.kind for o in step.outputs] == [lm_pb2.ARGMAX]


def test_dropping_a_batch_names_every_batch_to_free():
    batch = RunningBatch()
    batch.batch_id, batch.rows = "run", sequences(1)
    batch.joining = [Joining("a", sequences(1)), Joining("")]
    assert batch.drop() == ["run", "a"]
    assert (batch.batch_id, batch.rows, batch.joining, len(batch)) == ("", [], [], 0)

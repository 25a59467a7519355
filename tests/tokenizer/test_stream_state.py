"""DetokenizeState, the caller's half of DetokenizeStep, on its own (no service)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from muestra.runtime.detokenize import DetokenizeState
from muestra.v1 import tokenizer_pb2


def delta(text: str, prefix_advance: int, read_advance: int) -> tokenizer_pb2.DetokenizeDelta:
    return tokenizer_pb2.DetokenizeDelta(text=text, prefix_advance=prefix_advance, read_advance=read_advance)


def test_a_new_state_sends_its_ids_as_unread():
    state = DetokenizeState()
    state.append(7)
    state.append([8, 9])
    stream = state.next_stream()
    assert list(stream.ids) == [7, 8, 9] and stream.read_offset == 0 and not stream.final
    assert state.next_stream(final=True).final
    assert state.pending == 3


def test_apply_moves_the_window_by_the_advances_and_returns_the_text():
    state = DetokenizeState([1, 2, 3, 4], prefix_offset=1, read_offset=2)
    stream = state.next_stream()
    assert list(stream.ids) == [2, 3, 4] and stream.read_offset == 1
    assert state.apply(delta("xy", prefix_advance=1, read_advance=3)) == "xy"
    assert (state.prefix_offset, state.read_offset, state.pending) == (2, 4, 0)
    state.append(5)
    stream = state.next_stream()
    assert list(stream.ids) == [3, 4, 5] and stream.read_offset == 2


def test_a_held_back_step_leaves_the_offsets_in_place():
    state = DetokenizeState([1, 2, 3], prefix_offset=1, read_offset=2)
    assert state.apply(delta("", prefix_advance=0, read_advance=1)) == ""
    assert (state.prefix_offset, state.read_offset) == (1, 2)


def test_ids_appended_while_a_step_is_in_flight_stay_pending():
    state = DetokenizeState()
    state.append([10, 11])
    in_flight = state.next_stream()
    state.append(12)
    state.apply(delta("ab", prefix_advance=in_flight.read_offset, read_advance=len(in_flight.ids)))
    assert state.pending == 1
    assert list(state.next_stream().ids) == [10, 11, 12] and state.next_stream().read_offset == 2


def test_after_prompt_starts_the_window_inside_the_prompt():
    state = DetokenizeState.after_prompt(list(range(100, 120)), context=5)
    stream = state.next_stream()
    assert list(stream.ids) == [115, 116, 117, 118, 119] and stream.read_offset == 5
    assert state.pending == 0
    short = DetokenizeState.after_prompt([1, 2], context=5).next_stream()
    assert list(short.ids) == [1, 2] and short.read_offset == 2
    assert list(DetokenizeState.after_prompt([1, 2], context=0).next_stream().ids) == []


@pytest.mark.parametrize(("prefix_offset", "read_offset"), [(-1, 0), (2, 1), (0, 4)])
def test_inconsistent_offsets_are_refused(prefix_offset, read_offset):
    with pytest.raises(ValueError, match="prefix_offset <= read_offset"):
        DetokenizeState([1, 2, 3], prefix_offset=prefix_offset, read_offset=read_offset)


def test_the_helper_imports_no_tokenizer_library():
    code = (
        "import sys; import muestra.runtime.detokenize; "
        "heavy = {'tokenizers', 'sentencepiece', 'jinja2'} & set(sys.modules); "
        "assert not heavy, heavy"
    )
    subprocess.run([sys.executable, "-c", code], check=True)

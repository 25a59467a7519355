"""Stop strings cut the text exactly before the first match, also across token boundaries."""

import pytest

from muestra.gateway.engine.generation.stops import StopStringMatcher


def stream(matcher: StopStringMatcher, pieces: list[str]) -> str:
    out = "".join(matcher.feed(p) for p in pieces)
    return out + matcher.flush()


@pytest.mark.parametrize(
    "pieces",
    [["Hello wor", "ld. END of", " text"], ["Hello world. E", "N", "D", " of text"], ["Hello world. END of text"]],
)
def test_text_is_cut_before_a_stop_string_however_it_is_split(pieces):
    matcher = StopStringMatcher(["END"])
    assert stream(matcher, pieces) == "Hello world. "
    assert matcher.matched == "END"


def test_the_earliest_of_several_stop_strings_wins():
    matcher = StopStringMatcher(["\n\n", "world"])
    assert stream(matcher, ["hello ", "wor", "ld\n\nmore"]) == "hello "
    assert matcher.matched == "world"


def test_text_that_only_looks_like_a_stop_prefix_is_released_later():
    matcher = StopStringMatcher(["ENDS"])
    released = [matcher.feed(p) for p in ["a EN", "D", " b"]]
    assert released == ["a ", "", "END b"]
    assert matcher.flush() == "" and matcher.matched is None


def test_include_stop_keeps_the_matched_string():
    matcher = StopStringMatcher(["END"], include_stop=True)
    assert stream(matcher, ["x E", "ND y"]) == "x END"


def test_without_stop_strings_everything_passes_through():
    matcher = StopStringMatcher([])
    assert [matcher.feed(p) for p in ["a", "b"]] == ["a", "b"]

"""bench/decode.py --gguf: each --ours TYPE=DIR names our export and the llama.cpp type it is timed against."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from bench.decode import parse_ours


def test_ours_names_a_llama_cpp_type_and_a_folder():
    assert parse_ours("q4_1=out/smollm2-q4_1") == ("Q4_1", Path("out/smollm2-q4_1"))
    assert parse_ours("F32=a=b") == ("F32", Path("a=b"))  # only the first "=" splits


@pytest.mark.parametrize("spec", ["out/smollm2", "=out", "q8_0="])
def test_ours_without_a_type_or_a_folder_is_refused(spec):
    with pytest.raises(argparse.ArgumentTypeError):
        parse_ours(spec)

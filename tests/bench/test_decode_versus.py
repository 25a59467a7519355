"""bench/decode.py's llama.cpp table: each round of ours against the llama.cpp runs on either side of it."""

from __future__ import annotations

import pytest

from bench.decode import versus_rows


def llama_run(tg64: float, tg1000: float, batched8: float) -> dict:
    return {"tg": {64: tg64, 1000: tg1000}, "batched": {8: batched8}}


def test_each_round_is_compared_with_the_faster_neighbouring_llama_cpp_run():
    theirs = [llama_run(100, 80, 300), llama_run(90, 85, 320), llama_run(110, 70, 310)]
    ours = [
        {(1, 64): {"burst": 92.0, "stream": 80.0, "bare": 95.0}, (8, 64): {"stream": 400.0, "bare": 420.0}},
        {(1, 64): {"burst": 105.0, "stream": 99.0, "bare": 90.0}, (8, 64): {"stream": 380.0, "bare": 450.0}},
    ]
    rows = {(r["batch"], r["past"]): r for r in versus_rows("fp32", "F32", ours, theirs)}
    single = rows[1, 64]
    assert single["llama_cpp"] == 110  # the fastest of all three runs
    assert (single["stream"], single["bare"]) == (99.0, 95.0)  # each contender's fastest round
    assert single["stream_round_ratios"] == pytest.approx([80 / 100, 99 / 110])
    assert single["burst"] == 105.0 and single["burst_round_ratios"] == pytest.approx([92 / 100, 105 / 110])
    batch = rows[8, 64]
    assert batch["llama_cpp"] == 320 and batch["stream_round_ratios"] == pytest.approx([400 / 320, 380 / 320])
    assert "burst_round_ratios" not in batch
    assert {r["precision"] for r in rows.values()} == {"fp32"} and {r["llama_cpp_type"] for r in rows.values()} == {
        "F32"
    }


def test_a_round_needs_a_llama_cpp_run_after_it():
    ours = [{(1, 64): {"stream": 80.0}}]
    with pytest.raises(ValueError):
        versus_rows("int8", "Q8_0", ours, [llama_run(100, 80, 300)])

"""bench/sampled_load.py's report: a row per streams, sampling and stack, the baseline's missing counter as n/a."""

from __future__ import annotations

from bench.sampled_load import report


def test_the_report_has_a_row_per_stack_and_says_what_a_baseline_does_not_count():
    figure = {
        "tokens_per_s": 170.3,
        "wall_s": 9.4,
        "lm_forward_ms_a_step": 36.21,
        "lm_rows_a_decode": 7.6,
        "lm_picked_tokens": 1595.0,
        "cpu_s": {"lm0": 17.65, "gateway": 0.36, "tokenizer": 0.12, "client": 0.25, "redis": 0.01},
    }
    results = {"8 model": {"ours": figure, "baseline": {**figure, "tokens_per_s": 168.2, "lm_picked_tokens": None}}}
    lines = report(results, ["ours", "baseline"]).splitlines()
    assert lines[2] == "| 8 | model | ours | 170.3 | 36.21 | 7.6 | 1595 | 17.65 / 0.36 / 0.12 / 0.25 |"
    assert lines[3] == "| 8 | model | baseline | 168.2 | 36.21 | 7.6 | n/a | 17.65 / 0.36 / 0.12 / 0.25 |"
    assert len(lines) == 4

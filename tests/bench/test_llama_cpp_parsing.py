"""bench/llama_cpp.py reads llama.cpp's tools' output right (samples captured from a real run of the
pinned build on the bench's llama-100m, Q4_0, 2 threads; llama-perplexity's on SmolLM2-135M-Instruct
Q4_1, 3 chunks of 128 tokens of pydoc_data/topics.py; llama.cpp itself never runs in CI)."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.llama_cpp import parse_batched_bench, parse_llama_bench, parse_perplexity, parse_token_ids

SAMPLES = Path(__file__).parent / "samples"


def test_llama_bench_json_gives_tokens_per_second_per_depth():
    rows = parse_llama_bench((SAMPLES / "llama-bench.json").read_text())
    assert [(r["test"], r["depth"], r["threads"]) for r in rows] == [("tg16", 0, 2), ("tg16", 64, 2)]
    assert rows[0]["tokens_per_s"] == 193.493814 and rows[0]["stddev"] == 17.307707
    assert [r["fastest_tokens_per_s"] for r in rows] == [205.732, 213.271]
    assert rows[0]["type"] == "llama ?B Q4_0"
    assert all(r["tokens_per_s"] > 0 for r in rows)


def test_llama_batched_bench_table_gives_summed_decode_speed_per_batch():
    rows = parse_batched_bench((SAMPLES / "llama-batched-bench.txt").read_text())
    assert [(r["pp"], r["tg"], r["batch"], r["n_kv"]) for r in rows] == [(32, 8, 1, 40), (32, 8, 4, 160)]
    assert [r["tg_tokens_per_s"] for r in rows] == [173.57, 306.82]
    assert [r["pp_tokens_per_s"] for r in rows] == [624.99, 654.73]


def test_lines_that_are_not_result_rows_are_skipped():
    noise = "| PP | TG | B | N_KV |\n|----|----|\nllama_batched_bench: n_kv_max = 1024\n"
    assert parse_batched_bench(noise) == []


def test_llama_perplexity_log_gives_the_final_estimate_and_its_run():
    result = parse_perplexity((SAMPLES / "llama-perplexity.txt").read_text())
    assert (result["chunks"], result["context"]) == (3, 128)
    assert (result["perplexity"], result["error"]) == (12.6639, 2.65408)
    assert result["running"] == [6.4214, 9.3306, 12.6639]  # after each chunk; the last is the estimate


def test_a_llama_perplexity_log_without_an_estimate_is_an_error():
    with pytest.raises(ValueError):
        parse_perplexity("perplexity: tokenizing the input ..\nyou need at least 1024 tokens\n")


def test_llama_tokenize_ids_are_read_from_the_one_line_that_lists_them():
    assert parse_token_ids("load_backend: loaded CPU\n[504, 476, 3391]\n") == [504, 476, 3391]
    with pytest.raises(ValueError):
        parse_token_ids("no ids here\n")

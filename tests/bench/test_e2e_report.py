"""bench/e2e.py's pure parts: what each server is sent, how a short stream is caught, how rounds become the
table's figures and issue 44's bars (no server runs here)."""

from __future__ import annotations

import pytest

from bench.e2e import MODEL_CHAIN, chain_values, check_streams, markdown_table, sampling_fields, summarize, targets


def test_muestra_gets_no_sampling_field_for_the_models_chain_and_llama_server_gets_its_values():
    assert sampling_fields("model", "muestra") == {}
    assert sampling_fields("model", "llama") == {**MODEL_CHAIN, "min_p": 0.0}


def test_llama_server_gets_min_p_off_only_when_it_samples():
    assert sampling_fields("greedy", "llama") == {"temperature": 0.0}
    assert sampling_fields("t0.7", "llama") == {"temperature": 0.7, "top_k": 40, "top_p": 0.9, "min_p": 0.0}
    assert sampling_fields("t0.7", "muestra") == {"temperature": 0.7, "top_k": 40, "top_p": 0.9}


def test_the_model_cards_default_chain_reads_as_its_three_values():
    specs = [
        {"name": "temperature", "params": {"temperature": 0.2}},
        {"name": "top_k", "params": {"top_k": 50}},
        {"name": "top_p", "params": {"top_p": 0.9}},
        {"name": "sample", "params": {}},
    ]
    assert chain_values(specs) == MODEL_CHAIN


def reply(tokens, ttft_s=0.1):
    return {"completion_tokens": tokens, "content_chunks": tokens, "finish_reason": "length", "ttft_s": ttft_s}


def test_a_stream_short_of_its_tokens_stops_the_bench_and_is_named():
    check_streams([reply(200), reply(200)], 200, "here")
    with pytest.raises(RuntimeError, match=r"here: asked for 200 tokens each; stream 1: 150 tokens"):
        check_streams([reply(200), reply(150)], 200, "here")
    with pytest.raises(RuntimeError, match="stream 0: None tokens"):  # no usage came back
        check_streams([reply(None)], 200, "here")


def rounds(*tokens_per_s, ttft_s=(0.1,)):
    return [{"tokens_per_s": t, "ttft_s": list(ttft_s)} for t in tokens_per_s]


def results():
    return {
        1: {
            "greedy": {"muestra": rounds(90, 100, 95), "llama": rounds(120, 125, 110)},
            "model": {"muestra": rounds(96, 80, 70), "llama": rounds(100, 120, 110)},
        },
        8: {
            "greedy": {"muestra": rounds(260, 250, ttft_s=(0.2, 0.3, 0.4)), "llama": rounds(200, 190)},
            "model": {"muestra": rounds(250, 240), "llama": rounds(200, 210)},
        },
    }


def test_the_best_round_counts_and_ttft_is_the_median_of_every_stream():
    rows = summarize(results())
    one_greedy, eight_greedy = rows[0], rows[2]
    assert (one_greedy["muestra_tokens_per_s"], one_greedy["llama_tokens_per_s"]) == (100, 125)
    assert one_greedy["ratio"] == 0.8
    assert eight_greedy["muestra_ttft_ms"] == 300.0
    assert rows[1]["muestra_over_greedy"] == 0.96 and rows[1]["llama_over_greedy"] == 0.96


def test_the_bars_are_judged_on_the_one_stream_figures_and_the_worst_eight_stream_ratio():
    checks = {c["target"]: c for c in targets(summarize(results()))}
    assert checks["model chain / greedy, muestra, 1 stream"]["met"]  # 0.96
    assert not checks["greedy muestra / llama-server, 1 stream"]["met"]  # 0.8
    eight = checks["muestra / llama-server, 8 streams, every configuration"]
    assert eight["value"] == pytest.approx(250 / 210, abs=1e-3) and not eight["met"]


def test_one_server_alone_gives_a_table_without_ratios():
    rows = summarize({1: {"greedy": {"muestra": rounds(100)}}})
    assert "ratio" not in rows[0] and targets(rows) == []
    assert markdown_table(rows).splitlines()[2] == "| 1 | greedy | 100.0 |  |  | 100.0 |  | 1.00 |"

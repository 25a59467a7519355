"""bench/text_quality.py --gguf scores the ids and positions llama-perplexity scores (llama.cpp itself never
runs in CI; its output's parsing is tested on captured samples in test_llama_cpp_parsing.py)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from bench.text_quality import llama_perplexity_chunks, onnx_second_half_nll, same_ids_note


def test_chunks_are_consecutive_whole_runs_of_the_context_from_the_first_id():
    chunks = llama_perplexity_chunks(list(range(10, 21)), context=4, chunks=-1, bos=None)
    assert chunks.tolist() == [[10, 11, 12, 13], [14, 15, 16, 17]]  # the 3 ids left over are not scored


def test_each_chunk_starts_with_bos_where_the_vocabulary_adds_one():
    chunks = llama_perplexity_chunks(list(range(10, 20)), context=4, chunks=-1, bos=1)
    assert chunks.tolist() == [[1, 11, 12, 13], [1, 15, 16, 17]]


def test_chunks_limits_how_many_are_taken():
    assert llama_perplexity_chunks(list(range(100)), context=8, chunks=3, bos=None).shape == (3, 8)
    assert llama_perplexity_chunks(list(range(100)), context=8, chunks=50, bos=None).shape == (12, 8)


def test_our_tokenizer_is_reported_where_it_parts_from_llama_cpp():
    assert same_ids_note([1, 2, 3], [1, 2, 3]) == "the same 3 ids"
    assert "first difference at id 1" in same_ids_note([1, 5, 3], [1, 2, 3])
    assert "first difference at id 2" in same_ids_note([1, 2], [1, 2, 3])


def test_second_half_scores_equal_transformers_log_probs(tiny_lm):
    """A chunk of C tokens is scored at positions C/2 + 1 .. C - 1, each given every token before it."""
    import torch

    from muestra.lm.export.checks import ort_session

    model = tiny_lm("llama")
    chunks = np.random.default_rng(0).integers(3, 1000, (3, 10))
    nll, count = onnx_second_half_nll(ort_session(model.onnx_dir / "model.onnx"), chunks, rows=2)
    assert count == 3 * 4  # positions 6, 7, 8, 9 of each chunk

    with torch.no_grad():
        logits = model.torch_model()(torch.from_numpy(chunks)).logits.double()
    log_probs = torch.log_softmax(logits, -1)
    expected = -sum(float(log_probs[row, k - 1, chunks[row, k]]) for row in range(3) for k in range(6, 10))
    assert nll == pytest.approx(expected, rel=1e-4)
    assert math.isfinite(nll)

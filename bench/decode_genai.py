"""Runs inside the separate onnxruntime-genai venv (bench/decode.py starts it): times genai's Generator.

Reads a JSON job on stdin, prints one JSON object: greedy tokens, single-stream tokens/s, step ms
after prompts of given lengths, batch tokens/s and prefill ms, measured as bench/decode.py does
(a prompt once, then the fastest of `repeats` chunks of `chunk` decode steps).
"""

from __future__ import annotations

import json
import sys
import time

import numpy as np
import onnxruntime_genai as og


def start(model, prompts: np.ndarray, max_length: int):
    params = og.GeneratorParams(model)
    params.set_search_options(do_sample=False, max_length=max_length, batch_size=prompts.shape[0])
    generator = og.Generator(model, params)
    generator.append_tokens(prompts.astype(np.int32))
    # append_tokens ran the prompt; the first generate_next_token only picks from its logits,
    # each later one runs a forward step on the previous token first.
    generator.generate_next_token()
    return generator


def decode(generator, steps: int) -> tuple[float, list[list[int]]]:
    tokens = []
    started = time.perf_counter()
    for _ in range(steps):
        generator.generate_next_token()
        tokens.append(generator.get_next_tokens().tolist())
    return time.perf_counter() - started, [list(t) for t in zip(*tokens, strict=True)]


def fastest_chunk(model, prompts: np.ndarray, chunk: int, repeats: int) -> float:
    generator = start(model, prompts, prompts.shape[1] + chunk * repeats + 2)
    return min(decode(generator, chunk)[0] for _ in range(repeats))


def main() -> None:
    job = json.loads(sys.stdin.read())
    model = og.Model(job["model"])
    prompt = np.array([job["prompt"]], dtype=np.int32)
    chunk, repeats = job["chunk"], job["repeats"]
    tokens = decode(start(model, prompt, prompt.shape[1] + job["check_steps"] + 2), job["check_steps"])[1][0]
    result = {"tokens": tokens, "tokens_per_s": chunk / fastest_chunk(model, prompt, chunk, repeats)}
    result["batch_tokens_per_s"] = {
        str(b): b * chunk / fastest_chunk(model, np.repeat(prompt, b, 0), chunk, repeats) for b in job["batches"]
    }
    rng = np.random.default_rng(1)
    result["step_ms"] = {
        str(past): fastest_chunk(model, rng.integers(3, job["vocab"], (1, past)), chunk, repeats) / chunk * 1000
        for past in job["pasts"]
    }
    if job["prefill"]:
        long_prompt = rng.integers(3, job["vocab"], (1, job["prefill"])).astype(np.int32)
        runs = []
        for _ in range(max(2, repeats // 2)):
            params = og.GeneratorParams(model)
            params.set_search_options(do_sample=False, max_length=job["prefill"] + 2, batch_size=1)
            generator = og.Generator(model, params)
            started = time.perf_counter()
            generator.append_tokens(long_prompt)
            runs.append(time.perf_counter() - started)
        result["prefill_ms"] = min(runs) * 1000
    print(json.dumps(result))


if __name__ == "__main__":
    main()

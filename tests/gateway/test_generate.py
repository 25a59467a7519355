"""Text generation through the whole stack: gateway → tokenizer → lm, real processes on loopback."""

from __future__ import annotations

import math
import signal
import threading
import time

import grpc
import numpy as np
import pytest
import torch

from muestra.client import Client, InvalidArgumentError, NotFoundError
from muestra.v1 import gateway_pb2
from tests.fixtures.lm_models import default_suppressed_ids

PROMPT = "The quick brown fox"


@pytest.fixture(scope="module")
def stack(text_stack):
    return text_stack("llama")


@pytest.fixture(scope="module")
def client(stack):
    with Client(stack.gateway.address, timeout=120) as c:
        yield c


@pytest.fixture(scope="module")
def reference(tiny_lm):
    lm = tiny_lm("llama")
    return lm.torch_model(), lm.tokenizer()


def hf_generate(reference, prompt: str, **kwargs) -> list[int]:
    """transformers' generate, with the suppression of special tokens the gateway applies by default."""
    model, tokenizer = reference
    ids = tokenizer(prompt, return_tensors="pt").input_ids
    kwargs.setdefault("suppress_tokens", default_suppressed_ids(model, tokenizer))
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), pad_token_id=1, **kwargs)
    generated = out[0, ids.shape[1] :].tolist()
    eos = model.generation_config.eos_token_id
    if eos in generated:  # generate pads after EOS; muestra stops at it
        generated = generated[: generated.index(eos) + 1]
    return generated


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_greedy_through_the_stack_equals_transformers_generate(text_stack, tiny_lm, family):
    stack = text_stack(family)
    lm = tiny_lm(family)
    with Client(stack.gateway.address, timeout=120) as c:
        generation = c.generate(PROMPT, max_tokens=24, samplers=[{"name": "greedy"}]).wait()
    expected = hf_generate((lm.torch_model(), lm.tokenizer()), PROMPT, max_new_tokens=24, do_sample=False)
    assert generation.token_ids[0] == expected


def test_beam_search_equals_transformers_generate(client, reference):
    params = {"num_beams": 3, "length_penalty": 1.0, "early_stopping": False}
    generation = client.generate(PROMPT, max_tokens=10, samplers=[{"name": "beam_search", "params": params}]).wait()
    expected = hf_generate(reference, PROMPT, max_new_tokens=10, num_beams=3, do_sample=False, early_stopping=False)
    assert generation.token_ids[0] == expected
    assert generation.completions[0].completion_tokens == len(expected)


def test_streamed_text_equals_the_full_decode_of_the_ids(client, reference):
    _, tokenizer = reference
    generation = client.generate(PROMPT, max_tokens=40, ignore_eos=True, temperature=1.0, seed=3)
    deltas = list(generation)
    assert len(deltas) > 1
    ids = generation.token_ids[0]
    assert len(ids) == 40
    prompt_ids = tokenizer(PROMPT).input_ids
    in_context = tokenizer.decode(prompt_ids + ids, skip_special_tokens=True)
    prefix = tokenizer.decode(prompt_ids, skip_special_tokens=True)
    assert "".join(d.text for d in deltas) == in_context[len(prefix) :]


def test_max_tokens_ends_with_length(client):
    generation = client.generate(PROMPT, max_tokens=7, ignore_eos=True, samplers=[{"name": "greedy"}]).wait()
    done = generation.completions[0]
    assert (done.finish_reason, done.completion_tokens, done.prompt_tokens) == ("length", 7, 4)
    assert done.ttft_ms > 0 and done.total_ms >= done.ttft_ms


def test_eos_ends_with_stop(client, reference):
    eos = reference[0].generation_config.eos_token_id
    chain = [{"name": "logit_bias", "params": {"logit_bias": {str(eos): 100}}}, {"name": "greedy"}]
    generation = client.generate(PROMPT, max_tokens=20, samplers=chain).wait()
    done = generation.completions[0]
    assert (done.finish_reason, done.stop_reason, done.completion_tokens) == ("stop", f"eos:{eos}", 1)
    assert generation.texts.get(0, "") == ""


def test_stop_strings_cut_the_text_exactly_even_across_tokens(client):
    free = client.generate(PROMPT, max_tokens=40, ignore_eos=True, temperature=1.0, seed=11).wait()
    text = free.texts[0]
    # A stop string that starts inside one token and ends inside a later one.
    stop = text[5:12]
    assert len(stop) == 7
    cut = client.generate(PROMPT, max_tokens=40, ignore_eos=True, temperature=1.0, seed=11, stop=[stop]).wait()
    assert cut.texts.get(0, "") == text[: text.index(stop)]
    assert (cut.completions[0].finish_reason, cut.completions[0].stop_reason) == ("stop", stop)


def test_seeded_sampling_is_reproducible_and_independent_of_batch_neighbours(client):
    kwargs = dict(max_tokens=30, ignore_eos=True, temperature=0.9, top_k=40, seed=1234)
    alone = client.generate(PROMPT, **kwargs).wait().token_ids[0]
    results: dict[int, list[int]] = {}

    def run(i: int, prompt: str, seed: int) -> None:
        results[i] = client.generate(prompt, **{**kwargs, "seed": seed}).wait().token_ids[0]

    threads = [threading.Thread(target=run, args=(i, f"neighbour {i} says", 99 + i)) for i in range(3)]
    threads.append(threading.Thread(target=run, args=(3, PROMPT, 1234)))
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results[3] == alone
    assert client.generate(PROMPT, **{**kwargs, "seed": 4321}).wait().token_ids[0] != alone


def test_n_completions_share_a_prompt_and_use_independent_streams(client):
    generation = client.generate(PROMPT, n=3, max_tokens=12, ignore_eos=True, temperature=1.0, seed=5).wait()
    assert sorted(generation.completions) == [0, 1, 2]
    assert len({tuple(generation.token_ids[i]) for i in range(3)}) == 3
    assert all(c.completion_tokens == 12 and c.prompt_tokens == 4 for c in generation.completions.values())


def test_logprobs_are_the_log_softmax_of_the_model_logits(client, reference):
    model, tokenizer = reference
    generation = client.generate(
        PROMPT, max_tokens=3, ignore_eos=True, samplers=[{"name": "greedy"}], logprobs=True, top_logprobs=3
    )
    entries = [lp for delta in generation for lp in delta.logprobs]
    assert len(entries) == 3
    ids = tokenizer(PROMPT).input_ids + generation.token_ids[0]
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0].double()
    logits[:, default_suppressed_ids(model, tokenizer)] = -math.inf  # special tokens are suppressed by default
    expected = torch.log_softmax(logits, dim=-1)
    for step, entry in enumerate(entries):
        row = expected[len(ids) - 3 - 1 + step]
        assert math.isclose(entry["logprob"], row[entry["token_id"]].item(), abs_tol=1e-4)
        assert [t["token_id"] for t in entry["top"]] == torch.topk(row, 3).indices.tolist()
        assert entry["top"][0]["token_id"] == entry["token_id"]


def test_cancelling_the_stream_frees_the_lm_rows(client, stack):
    generation = client.generate(PROMPT, max_tokens=400, ignore_eos=True, temperature=1.0, seed=1)
    stream = iter(generation)
    next(stream)
    next(stream)
    assert stack.lm_rows() >= 1
    generation.cancel()
    deadline = time.monotonic() + 5
    while stack.lm_rows() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert stack.lm_rows() == 0


def test_timeout_ms_ends_the_stream_on_time_while_the_tokenizer_is_stopped(stack):
    request = gateway_pb2.GenerateRequest(prompt=PROMPT, max_tokens=400, ignore_eos=True, seed=3, timeout_ms=2500)
    started = time.monotonic()
    stream = stack.stub.Generate(request, timeout=60)
    next(stream)
    stack.tokenizer.proc.send_signal(signal.SIGSTOP)  # the scheduler now waits on a detokenize step
    try:
        with pytest.raises(grpc.RpcError) as error:
            for _ in stream:
                pass
        took = time.monotonic() - started
    finally:
        stack.tokenizer.proc.send_signal(signal.SIGCONT)
    assert error.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert "retry with seed 3" in error.value.details() and "Detokenize" in error.value.details()
    assert took < 2.5 + 1.5, took  # not the tokenizer's own 30 s deadline
    deadline = time.monotonic() + 10
    while stack.lm_rows() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert stack.lm_rows() == 0


def test_a_requests_own_tiny_deadline_fails_it_alone_and_never_ends_empty(stack, client):
    """timeout_ms of a few ms ends that request with DEADLINE_EXCEEDED (or, once it streams, a Completion
    CANCELLED): never status OK with no Completion, never the replica out of rotation, never a neighbour."""
    bystander = client.generate(PROMPT, max_tokens=300, ignore_eos=True, temperature=1.0, seed=21)
    bystander_stream = iter(bystander)
    next(bystander_stream)
    outcomes = []
    for attempt in range(40):
        timeout_ms = (1, 2, 3, 5, 8)[attempt % 5]
        request = gateway_pb2.GenerateRequest(prompt="😀" * 100, max_tokens=8, seed=attempt, timeout_ms=timeout_ms)
        try:
            messages = list(stack.stub.Generate(request, timeout=30))
        except grpc.RpcError as error:
            assert error.code() == grpc.StatusCode.DEADLINE_EXCEEDED, (timeout_ms, error.code(), error.details())
            assert "timeout_ms" in error.details()
            outcomes.append("deadline")
        else:
            completions = [m.done for m in messages if m.HasField("done")]
            assert len(completions) == 1, (timeout_ms, messages)  # never OK with nothing in it
            outcomes.append(gateway_pb2.FinishReason.Name(completions[0].finish_reason))
        # The replica stays in rotation: an ordinary request right after is served.
        after = client.generate(PROMPT, max_tokens=2, seed=attempt).wait()
        assert after.completions[0].finish_reason in ("length", "stop")
    assert "deadline" in outcomes  # the short deadlines did cut requests before they streamed
    rest = list(bystander_stream)
    assert rest and bystander.wait().completions[0].finish_reason == "length"
    # No prefill cut by its deadline left a batch on the lm (one cut as the lm answered used to hold its KV
    # until the lease's idle limit).
    deadline = time.monotonic() + 5
    while stack.lm_rows() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert stack.lm_rows() == 0


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"samplers": [{"name": "no_such_sampler"}]}, "samplers[0].name"),
        ({"top_p": 1.5}, "top_p"),
        ({"temperature": -1.0}, "temperature"),
        ({"temperature": float("nan")}, "temperature"),
        ({"max_tokens": 100_000}, "max_tokens"),
        ({"prompt": ""}, "prompt"),
        ({"prompt": "x" * 300_000}, "prompt"),
        ({"n": 1000}, "n"),
    ],
)
def test_bad_input_is_invalid_argument_naming_the_field_and_other_streams_continue(client, kwargs, field):
    long_run = client.generate(PROMPT, max_tokens=60, ignore_eos=True, temperature=1.0, seed=8)
    stream = iter(long_run)
    next(stream)
    prompt = kwargs.pop("prompt", PROMPT)
    with pytest.raises(InvalidArgumentError) as error:
        client.generate(prompt, **kwargs).wait()
    assert field in error.value.details
    for _ in stream:
        pass
    assert long_run.completions[0].completion_tokens == 60


def test_unknown_model_is_not_found_naming_the_known_ones(client):
    with pytest.raises(NotFoundError) as error:
        client.generate(PROMPT, model="gpt-17").wait()
    assert "onnx" in error.value.details


def test_listings_describe_models_samplers_and_plugins(client):
    models = client.list_models()
    assert [(m.kind, m.context_length, m.vocab_size) for m in models] == [("text", 512, 1024)]
    samplers = {s.name: s for s in client.list_samplers()}
    assert {"greedy", "temperature", "top_k", "top_p", "min_p", "beam_search"} <= set(samplers)
    # top_p keeps the best token, so it never changes the argmax; sampling does.
    assert samplers["greedy"].argmax_invariant and samplers["top_p"].argmax_invariant
    assert not samplers["sample"].argmax_invariant
    assert '"top_p"' in samplers["top_p"].parameter_schema
    assert any("top_p" in p.samplers for p in client.list_plugins())


def test_api_keys_are_required_when_configured(text_stack):
    stack = text_stack("llama", "--api-keys", "k-123,k-456")
    with Client(stack.gateway.address, timeout=60) as anonymous:
        with pytest.raises(Exception) as error:
            anonymous.list_models()
        assert error.value.code == grpc.StatusCode.UNAUTHENTICATED
    with Client(stack.gateway.address, api_key="wrong", timeout=60) as wrong:
        with pytest.raises(Exception) as error:
            wrong.generate(PROMPT, max_tokens=2).wait()
        assert error.value.code == grpc.StatusCode.UNAUTHENTICATED
    with Client(stack.gateway.address, api_key="k-456", timeout=60) as keyed:
        _, done = keyed.complete(PROMPT, max_tokens=3, ignore_eos=True)
        assert done.completion_tokens == 3
    assert "k-123" not in stack.gateway.log_path.read_text()


def test_default_chain_comes_from_generation_config(client, reference):
    # The tiny model's generation_config.json has no do_sample: its default chain is greedy.
    generation = client.generate(PROMPT, max_tokens=8).wait()
    assert generation.token_ids[0] == hf_generate(reference, PROMPT, max_new_tokens=8, do_sample=False)
    assert np.isfinite(generation.completions[0].tokens_per_s)


def test_prometheus_metrics_count_tokens_and_latencies(text_stack):
    import urllib.request

    from tests.harness import free_port

    port = free_port()
    stack = text_stack("llama", "--metrics-port", str(port))
    with Client(stack.gateway.address, timeout=60) as c:
        c.complete(PROMPT, max_tokens=5, ignore_eos=True, samplers=[{"name": "greedy"}])
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    metrics = {line.split(" ")[0]: float(line.split(" ")[1]) for line in body.splitlines() if line and line[0] != "#"}
    assert metrics['muestra_generation_tokens_total{model="onnx"}'] == 5
    assert metrics['muestra_prompt_tokens_total{model="onnx"}'] == 4
    assert metrics['muestra_time_to_first_token_seconds_count{model="onnx"}'] == 1
    assert metrics['muestra_inter_token_latency_seconds_count{model="onnx"}'] == 4
    assert metrics['muestra_request_success_total{finish_reason="length",model="onnx"}'] == 1
    assert metrics['muestra_grpc_requests_total{code="OK",method="/muestra.v1.Gateway/Generate"}'] == 1


def test_async_client_streams_the_same_completion_as_the_blocking_one(client, stack):
    import asyncio

    from muestra.client import AsyncClient

    kwargs = dict(max_tokens=10, ignore_eos=True, temperature=0.8, seed=21)

    async def run():
        async with AsyncClient(stack.gateway.address, timeout=60) as aclient:
            generation = aclient.generate(PROMPT, **kwargs)
            deltas = [delta async for delta in generation]
            models = await aclient.list_models()
            return generation, deltas, models

    generation, deltas, models = asyncio.run(run())
    expected = client.generate(PROMPT, **kwargs).wait()
    assert generation.token_ids[0] == expected.token_ids[0]
    assert "".join(d.text for d in deltas) == expected.texts[0]
    assert generation.completions[0].completion_tokens == 10
    assert models[0].kind == "text"

"""The draft_model proposer through the real stack: a gateway serving three tiny models that share one
tokenizer, each on its own lm process. "llama" is sampled; "twin" is the same weights in the concat layout
(its greedy guesses are the target's own), "qwen2" other random weights (its guesses are mostly wrong).

For the same seed a completion is the same with either draft model as without drafts; the draft model's
KV follows the row through acceptances, rejections and pauses (the twin's guesses stay accepted); bad
params are INVALID_ARGUMENT naming the field; a draft model's lm that dies costs drafts, never a text."""

from __future__ import annotations

import json
import threading

import grpc
import pytest

from muestra.client import Client
from tests.fixtures.lm_service import start_lm
from tests.gateway.test_speculation import CHAINS, PROMPT, _logprobs, same
from tests.harness import ServiceProcess, free_port
from tests.observability.test_metrics import documented, level, scrape


def drafting(model: str, **params) -> dict:
    return {"proposer": "draft_model", "params": {"model": model, "adaptive": False, "max_draft_tokens": 6, **params}}


@pytest.fixture(scope="module")
def models(tiny_lm, tmp_path_factory):
    log_dir = tmp_path_factory.mktemp("draft-model-logs")
    lm_metrics, gateway_metrics = free_port(), free_port()
    llama = tiny_lm("llama").onnx_dir
    tokenizer = ServiceProcess("tokenizer", ["--models", str(llama)], log_dir)
    lms = {
        "llama": start_lm(llama, "llama", log_dir, "--metrics-port", str(lm_metrics)),
        "twin": start_lm(tiny_lm("llama-concat").onnx_dir, "llama-concat", log_dir),
        "qwen2": start_lm(tiny_lm("qwen2").onnx_dir, "qwen2", log_dir),
    }
    config = log_dir / "models.json"
    spec = {name: {"tokenizer": tokenizer.address, "lm": [lm.address]} for name, lm in lms.items()}
    config.write_text(json.dumps({"text": spec}))
    # Greedy rows run short bursts while their draft KV loads, so their first rounds feed what they took meanwhile.
    flags = ["--models-config", str(config), "--greedy-burst", "2", "--metrics-port", str(gateway_metrics)]
    gateway = ServiceProcess("gateway", flags, log_dir)
    gateway.metrics_url = f"http://127.0.0.1:{gateway_metrics}/metrics"
    lms["llama"].metrics_url = f"http://127.0.0.1:{lm_metrics}/metrics"
    yield gateway, lms
    gateway.stop()
    for lm in lms.values():
        lm.stop()
    tokenizer.stop()


def test_every_sampler_gives_the_same_tokens_with_a_draft_model_as_without(models):
    gateway, _ = models
    totals = {"twin": [0, 0], "qwen2": [0, 0]}
    twin_greedy = [0, 0]
    requests = drafted_requests = 0
    with Client(gateway.address, timeout=120) as c:
        for name, chain in CHAINS.items():
            for seed in (1, 2):
                job = {"model": "llama", "max_tokens": 64, "ignore_eos": True, "samplers": chain, "seed": seed}
                plain = c.generate(PROMPT, speculation="off", **job).wait()
                for draft in totals:
                    spec = c.generate(PROMPT, speculation=drafting(draft), **job).wait()
                    same(spec, plain)
                    done = spec.completions[0]
                    # A row steps without drafts until the draft model has its prompt (a Prefill in the
                    # background), which on these tiny models can take a good part of a short completion.
                    requests += 1
                    drafted_requests += done.draft_tokens > 0
                    totals[draft][0] += done.draft_tokens
                    totals[draft][1] += done.accepted_draft_tokens
                    if draft == "twin" and name in ("greedy", "top_k=1"):
                        twin_greedy[0] += done.draft_tokens
                        twin_greedy[1] += done.accepted_draft_tokens
    assert drafted_requests >= requests // 2
    # The twin guesses the target's own argmax: a greedy row keeps nearly every draft, which holds only if
    # the draft KV followed the row exactly (rollbacks and the token fed each round).
    assert twin_greedy[1] >= 0.9 * twin_greedy[0] > 0
    # Other weights guess worse, and their drafts are rejected as well as kept.
    drafted, accepted = totals["qwen2"]
    assert 0 < accepted < drafted
    assert totals["qwen2"][1] / totals["qwen2"][0] < totals["twin"][1] / totals["twin"][0]


def test_n_logprobs_stop_strings_and_concurrent_rows_are_the_same_with_a_draft_model(models):
    gateway, _ = models
    jobs = [
        {"n": 3, "temperature": 0.9, "top_k": 2, "seed": 5, "max_tokens": 30, "ignore_eos": True},
        {"logprobs": True, "top_logprobs": 3, "samplers": CHAINS["chain"], "seed": 6, "max_tokens": 30},
        {"samplers": CHAINS["greedy"], "max_tokens": 7, "ignore_eos": True},
    ]
    with Client(gateway.address, timeout=120) as c:
        free = c.generate(PROMPT, model="llama", max_tokens=60, ignore_eos=True, speculation="off").wait()
        jobs.append({"stop": [free.texts[0][25:27]], "max_tokens": 60, "ignore_eos": True, "logprobs": True})
        for job in jobs:
            plain = c.generate(PROMPT, model="llama", speculation="off", **job)
            plain_logprobs = _logprobs(plain)
            spec = c.generate(PROMPT, model="llama", speculation=drafting("twin"), **job)
            spec_logprobs = _logprobs(spec)
            same(spec, plain)
            assert spec_logprobs == plain_logprobs
    # Rows of one step loop share the draft model's batch: rows join, leave and draft different lengths.
    concurrent = [
        {
            "samplers": chain,
            "seed": 40 + i,
            "max_tokens": 15 + 4 * i,
            "ignore_eos": True,
            "speculation": ("off", drafting("twin"), drafting("qwen2", max_draft_tokens=2 + i))[i % 3],
        }
        for i, chain in enumerate(list(CHAINS.values())[:9])
    ]
    with Client(gateway.address, timeout=120) as c:
        alone = [c.generate(PROMPT, model="llama", **{**job, "speculation": "off"}).wait() for job in concurrent]
    got: dict[int, object] = {}

    def run(i: int) -> None:
        with Client(gateway.address, timeout=120) as c:
            got[i] = c.generate(PROMPT, model="llama", **concurrent[i]).wait()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(concurrent))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    for i in range(len(concurrent)):
        same(got[i], alone[i])
    assert sum(got[i].completions[0].draft_tokens for i in range(len(concurrent))) > 0


def test_the_speculation_metrics_move_as_documented(models):
    """The `drafts` rows of docs/metrics.md (the observability stack's int8 fixture cannot draft): on the gateway
    by proposer, and on the target's lm, whose greedy rows it judges itself."""
    gateway, lms = models
    rows = {name: service for name, (_, service, moves) in documented().items() if moves == "drafts"}
    assert len(rows) == 5
    where = {"gateway": gateway, "lm": lms["llama"]}
    before = {service: scrape(process, "") for service, process in where.items()}
    with Client(gateway.address, timeout=120) as c:
        c.generate(PROMPT, model="llama", max_tokens=64, ignore_eos=True, speculation=drafting("twin")).wait()
    after = {service: scrape(process, "") for service, process in where.items()}
    for name, service in rows.items():
        assert level(after[service], name) > level(before[service], name), f"{name} did not move on {service}"
    labels = {s[1]["proposer"] for s in after["gateway"]["muestra_spec_decode_num_drafts_total"]["samples"]}
    assert "draft_model" in labels


def test_bad_draft_model_params_are_invalid_argument_naming_the_field(models):
    gateway, _ = models
    cases = [
        ({"proposer": "draft_model"}, "speculation.params.model: is required"),
        (drafting("nope"), "speculation.params.model: 'nope' is not a served text model (served: llama, qwen2, twin)"),
        (drafting("llama"), "speculation.params.model: 'llama' is the model being sampled"),
        (drafting("twin", max_draft_tokens=17), "speculation.params.max_draft_tokens: "),
        (drafting("twin", temperature=1), "speculation.params.temperature: unknown parameter"),
    ]
    with Client(gateway.address, timeout=30) as c:
        for speculation, message in cases:
            with pytest.raises(Exception) as info:
                c.generate(PROMPT, model="llama", max_tokens=4, speculation=speculation).wait()
            error = info.value
            code = getattr(error, "code", None)
            code = code() if callable(code) else code
            assert code == grpc.StatusCode.INVALID_ARGUMENT, error
            assert message in str(error)
        done = c.generate(PROMPT, model="llama", max_tokens=4, speculation=drafting("twin")).wait()
        assert done.completions[0].completion_tokens == 4


def test_a_draft_model_that_dies_costs_drafts_never_a_text(models):
    """Kill the draft model's lm while rows draft from it: every text is still its twin without drafts, and the
    gateway serves on (the rows step without drafts). It runs last: the qwen2 model stays down."""
    gateway, lms = models
    jobs = [{"samplers": chain, "seed": 7, "max_tokens": 120, "ignore_eos": True} for chain in CHAINS.values()][:6]
    with Client(gateway.address, timeout=120) as c:
        alone = [c.generate(PROMPT, model="llama", speculation="off", **job).wait() for job in jobs]
    got: dict[int, object] = {}
    started = threading.Barrier(len(jobs) + 1)

    def run(i: int) -> None:
        with Client(gateway.address, timeout=120) as c:
            generation = c.generate(PROMPT, model="llama", speculation=drafting("qwen2"), **jobs[i])
            stream = iter(generation)
            next(stream)
            started.wait(60)
            got[i] = generation.wait()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(jobs))]
    for thread in threads:
        thread.start()
    started.wait(60)
    lms["qwen2"].proc.kill()  # mid-stream, without a goodbye
    lms["qwen2"].proc.wait()
    for thread in threads:
        thread.join(120)
    for i in range(len(jobs)):
        same(got[i], alone[i])
    with Client(gateway.address, timeout=60) as c:
        after = c.generate(PROMPT, model="llama", speculation=drafting("qwen2"), **jobs[0]).wait()
    same(after, alone[0])
    assert after.completions[0].draft_tokens == 0

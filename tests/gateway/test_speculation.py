"""Speculative decoding through the real stack: for the same seed, a completion's tokens, text, logprobs and
finish are the same with drafts as without, for every built-in sampler and chains of several, penalties and
mirostat included, with n > 1, logprobs, and rows of other requests in the same batch; bad proposer
parameters are INVALID_ARGUMENT naming the field."""

from __future__ import annotations

import threading
import urllib.request

import grpc
import numpy as np
import pytest

from muestra.client import Client
from muestra.gateway.engine.proposers.ngram import lookup
from tests.harness import free_port

# Draft at every step, from any earlier occurrence of the last token: the tiny random models accept few of
# a sampled row's drafts, so most steps exercise rejection and rollback, and greedy loops exercise acceptance.
ALWAYS = {"proposer": "ngram", "params": {"adaptive": False, "min_ngram": 1, "max_ngram": 1, "max_draft_tokens": 6}}
PROMPT = "a b c d a b c d a b c d a b"

CHAINS = {
    "greedy": [{"name": "greedy"}],
    "sample": [{"name": "sample"}],
    "temperature": [{"name": "temperature", "params": {"temperature": 0.7}}, {"name": "sample"}],
    "top_k": [{"name": "top_k", "params": {"top_k": 3}}, {"name": "sample"}],
    "top_k=1": [{"name": "top_k", "params": {"top_k": 1}}, {"name": "sample"}],
    "top_p": [{"name": "top_p", "params": {"top_p": 0.5}}, {"name": "sample"}],
    "min_p": [{"name": "min_p", "params": {"min_p": 0.2}}, {"name": "sample"}],
    "typical_p": [{"name": "typical_p", "params": {"typical_p": 0.5}}, {"name": "sample"}],
    "repetition_penalty": [{"name": "repetition_penalty", "params": {"repetition_penalty": 1.02}}, {"name": "greedy"}],
    # Penalties change the scores by the text so far: their state advances per accepted draft.
    "presence_penalty": [
        {"name": "presence_penalty", "params": {"presence_penalty": 0.02}},
        {"name": "top_k", "params": {"top_k": 3}},
        {"name": "sample"},
    ],
    "frequency_penalty": [
        {"name": "frequency_penalty", "params": {"frequency_penalty": 0.02}},
        {"name": "top_k", "params": {"top_k": 3}},
        {"name": "sample"},
    ],
    "logit_bias": [{"name": "logit_bias", "params": {"logit_bias": {"7": 5.0}}}, {"name": "greedy"}],
    "mirostat": [{"name": "temperature", "params": {"temperature": 0.8}}, {"name": "mirostat", "params": {"tau": 3.0}}],
    "chain": [
        {"name": "repetition_penalty", "params": {"repetition_penalty": 1.01}},
        {"name": "frequency_penalty", "params": {"frequency_penalty": 0.01}},
        {"name": "temperature", "params": {"temperature": 0.5}},
        {"name": "top_k", "params": {"top_k": 4}},
        {"name": "top_p", "params": {"top_p": 0.9}},
        {"name": "min_p", "params": {"min_p": 0.05}},
        {"name": "sample"},
    ],
}


def spec_metrics(port: int) -> dict[str, float]:
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    totals: dict[str, float] = {}
    for line in body.splitlines():
        if line.startswith("muestra_spec_decode_"):
            name = line.split("{")[0]
            totals[name] = totals.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
    return totals


def same(a, b) -> None:
    """Two generations of one request: equal in every way a client can see, timings aside."""
    assert a.token_ids == b.token_ids
    assert a.texts == b.texts
    assert sorted(a.completions) == sorted(b.completions)
    for index, x in a.completions.items():
        y = b.completions[index]
        assert (x.finish_reason, x.stop_reason, x.completion_tokens) == (
            y.finish_reason,
            y.stop_reason,
            y.completion_tokens,
        )


@pytest.fixture(scope="module")
def stack(text_stack):
    port = free_port()
    return text_stack("llama", "--metrics-port", str(port)), port


@pytest.mark.parametrize("family", ["llama", "llama-concat"])
def test_every_sampler_gives_the_same_tokens_with_drafts_as_without(text_stack, family):
    stack = text_stack(family)
    drafted = accepted = sampled_accepted = 0
    with Client(stack.gateway.address, timeout=120) as c:
        for name, chain in CHAINS.items():
            for seed in (1, 2):
                job = {"max_tokens": 48, "ignore_eos": True, "samplers": chain, "seed": seed}
                plain = c.generate(PROMPT, speculation="off", **job).wait()
                spec = c.generate(PROMPT, speculation=ALWAYS, **job).wait()
                same(spec, plain)
                done = spec.completions[0]
                assert plain.completions[0].draft_tokens == 0
                assert done.draft_tokens > 0, name
                drafted += done.draft_tokens
                accepted += done.accepted_draft_tokens
                if name not in ("greedy", "logit_bias"):
                    sampled_accepted += done.accepted_draft_tokens
    # Both verdicts ran: drafts kept (greedy loops, and sampled rows judged by their chain) and drafts dropped.
    assert 0 < accepted < drafted
    assert sampled_accepted > 0


def test_n_logprobs_stop_ids_and_max_tokens_are_the_same_with_drafts(stack):
    gateway, _ = stack
    with Client(gateway.gateway.address, timeout=120) as c:
        free = c.generate(PROMPT, max_tokens=40, ignore_eos=True, samplers=CHAINS["greedy"], speculation="off").wait()
        tokens = free.token_ids[0]
        stop = next(t for i, t in enumerate(tokens) if i >= 9 and t not in tokens[:i])
        jobs = [
            {"n": 3, "temperature": 0.9, "top_k": 2, "seed": 5, "max_tokens": 30, "ignore_eos": True},
            {"logprobs": True, "top_logprobs": 3, "samplers": CHAINS["chain"], "seed": 6, "max_tokens": 30},
            {"stop_token_ids": [stop], "samplers": CHAINS["greedy"], "max_tokens": 40, "ignore_eos": True},
            *({"samplers": CHAINS["greedy"], "max_tokens": m, "ignore_eos": True} for m in (1, 2, 7, 13)),
        ]
        for job in jobs:
            plain = c.generate(PROMPT, speculation="off", **job)
            plain_logprobs = _logprobs(plain)
            spec = c.generate(PROMPT, speculation=ALWAYS, **job)
            spec_logprobs = _logprobs(spec)
            same(spec, plain)
            assert spec_logprobs == plain_logprobs
            if "n" in job or "logprobs" in job:
                assert all(done.draft_tokens > 0 for done in spec.completions.values()), job
        stopped = c.generate(PROMPT, speculation=ALWAYS, **jobs[2]).wait()
        assert stopped.completions[0].stop_reason == f"token:{stop}"


def _logprobs(generation) -> list[tuple]:
    """Every streamed delta's logprob entries (the generation is read to its end)."""
    entries = []
    for delta in generation:
        for entry in delta.logprobs:
            top = tuple((t["token_id"], round(t["logprob"], 4)) for t in entry["top"])
            entries.append((delta.index, entry["token_id"], round(entry["logprob"], 4), top))
    return entries


def test_rows_with_and_without_drafts_in_one_batch_equal_their_runs_alone(stack):
    gateway, port = stack
    jobs = []
    for i, chain in enumerate(list(CHAINS.values())[:8]):
        speculation = ALWAYS if i % 3 else "off"
        if i % 3 == 2:
            speculation = {**ALWAYS, "params": {**ALWAYS["params"], "max_draft_tokens": 2 + i}}
        jobs.append(
            {
                "samplers": chain,
                "seed": 30 + i,
                "max_tokens": 20 + 3 * i,
                "ignore_eos": True,
                "speculation": speculation,
            }
        )
    with Client(gateway.gateway.address, timeout=120) as c:
        alone = [c.generate(PROMPT, **{**job, "speculation": "off"}).wait() for job in jobs]
    before = spec_metrics(port)
    got: dict[int, object] = {}

    def run(i: int) -> None:
        with Client(gateway.gateway.address, timeout=120) as c:
            got[i] = c.generate(PROMPT, **jobs[i]).wait()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(jobs))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    for i in range(len(jobs)):
        same(got[i], alone[i])
    after = spec_metrics(port)
    drafts = after["muestra_spec_decode_num_draft_tokens_total"] - before.get(
        "muestra_spec_decode_num_draft_tokens_total", 0
    )
    assert drafts > 0
    assert after["muestra_spec_decode_num_drafts_total"] > before.get("muestra_spec_decode_num_drafts_total", 0)


def test_a_greedy_row_drafts_wherever_a_match_begins_even_amid_greedy_bursts(stack):
    """Where no draft is possible a greedy row takes the lm's own steps in bursts; a burst ends where a match of
    min_ngram tokens could begin, so the row drafts at every token where the lookup has a match, exactly as a
    row stepping one token at a time would."""
    gateway, _ = stack
    params = {"adaptive": False, "min_ngram": 2, "max_ngram": 2, "max_draft_tokens": 6}
    prompt, max_tokens = "q r s t u v w x y z", 64
    job = {"samplers": CHAINS["greedy"], "max_tokens": max_tokens, "ignore_eos": True}
    with Client(gateway.gateway.address, timeout=120) as c:
        plain = c.generate(prompt, speculation="off", **job).wait()
        spec = c.generate(prompt, speculation={"proposer": "ngram", "params": params}, **job).wait()
        prompt_ids = list(c.tokenize(prompt).ids)
    same(spec, plain)
    tokens = plain.token_ids[0]
    # The verifications of a row that asks for drafts before every token: tokens[i] is its pending token.
    drafted = accepted = i = 0
    while i < len(tokens) - 1:
        room = min(params["max_draft_tokens"], max_tokens - (i + 1) - 1)
        ids = np.asarray(prompt_ids + tokens[: i + 1], dtype=np.int64)
        draft = lookup(ids, room, params["min_ngram"], params["max_ngram"]).tolist() if room >= 1 else []
        following = tokens[i + 1 : i + 1 + len(draft)]
        kept = next((n for n, (d, t) in enumerate(zip(draft, following, strict=False)) if d != t), len(following))
        drafted, accepted, i = drafted + len(draft), accepted + kept, i + kept + 1
    assert drafted > 0 and accepted < drafted  # the text has matches, some of them wrong
    done = spec.completions[0]
    assert (done.draft_tokens, done.accepted_draft_tokens) == (drafted, accepted)


def test_stop_strings_end_a_drafted_step_at_the_token_that_completed_them(stack):
    """A stop string found in the text of several drafted tokens ends the row where one token at a time would:
    the same text, token ids, logprobs, completion_tokens and stop reason."""
    gateway, _ = stack
    ended_mid_step = 0
    with Client(gateway.gateway.address, timeout=120) as c:
        for chain in (CHAINS["greedy"], CHAINS["top_k=1"]):
            job = {"max_tokens": 60, "ignore_eos": True, "samplers": chain, "seed": 3}
            free = c.generate(PROMPT, speculation="off", **job).wait()
            text = free.texts[0]
            for start in range(4, min(len(text) - 3, 60), 5):
                stopped = {**job, "stop": [text[start : start + 2]], "logprobs": True}
                plain = c.generate(PROMPT, speculation="off", **stopped)
                plain_logprobs = _logprobs(plain)
                spec = c.generate(PROMPT, speculation=ALWAYS, **stopped)
                spec_logprobs = _logprobs(spec)
                same(spec, plain)
                assert spec_logprobs == plain_logprobs
                done = spec.completions[0]
                assert done.stop_reason == plain.completions[0].stop_reason
                # Drafts were verified past the stop string: the row dropped what followed it.
                ended_mid_step += done.accepted_draft_tokens > 0 and done.finish_reason == "stop"
    assert ended_mid_step > 0


def test_constraints_step_one_token_at_a_time(stack):
    """A constrained row never drafts (its grammar's masks are known one token at a time); the text is the same."""
    gateway, _ = stack
    job = {"constraint": {"name": "regex", "params": {"pattern": "[a-d ]{1,20}"}}, "samplers": CHAINS["greedy"]}
    with Client(gateway.gateway.address, timeout=120) as c:
        plain = c.generate(PROMPT, speculation="off", **job).wait()
        spec = c.generate(PROMPT, speculation=ALWAYS, **job).wait()
    same(spec, plain)
    assert spec.completions[0].draft_tokens == 0


def test_bad_proposer_parameters_are_invalid_argument_naming_the_field(stack):
    gateway, _ = stack
    cases = [
        ({"proposer": "nope"}, "speculation.proposer: unknown proposer 'nope'; registered: draft_model, ngram, off"),
        ({"proposer": "ngram", "params": {"max_draft_tokens": 0}}, "speculation.params.max_draft_tokens: "),
        ({"proposer": "ngram", "params": {"max_draft_tokens": 17}}, "speculation.params.max_draft_tokens: "),
        ({"proposer": "ngram", "params": {"min_ngram": 3, "max_ngram": 2}}, "speculation.params.min_ngram: is 3"),
        ({"proposer": "ngram", "params": {"k": 2}}, "speculation.params.k: unknown parameter"),
        ({"proposer": "ngram", "params": {"adaptive": "yes"}}, "speculation.params.adaptive: "),
    ]
    with Client(gateway.gateway.address, timeout=30) as c:
        for speculation, message in cases:
            with pytest.raises(Exception) as info:
                c.generate(PROMPT, max_tokens=4, speculation=speculation).wait()
            error = info.value
            code = getattr(error, "code", None)
            code = code() if callable(code) else code
            assert code == grpc.StatusCode.INVALID_ARGUMENT, error
            assert message in str(error)
        # The gateway still serves.
        assert c.generate(PROMPT, max_tokens=4, speculation=ALWAYS).wait().completions[0].completion_tokens == 4

"""Every documented metric, scraped from real services, moves as docs/metrics.md says."""

from __future__ import annotations

import re
import threading
import time
import urllib.request
from pathlib import Path

import grpc
import httpx2 as httpx
from openai import OpenAI
from prometheus_client.parser import text_string_to_metric_families

from bench.stack import TEXT_FIXTURE
from muestra.v1 import gateway_pb2, gateway_pb2_grpc

DOC = Path(__file__).resolve().parents[2] / "docs" / "metrics.md"
ROW = re.compile(
    r"^\| `(muestra_[a-z0-9_]+)` \| (counter|gauge|histogram) \| (\w+) \| "
    r"(requests|load|faults|fixed|no-redis|drafts|hot) \|"
)
# A long prompt, sent twice: its full blocks are cached after the first time.
LONG_PROMPT = " ".join(f"def f{i}(x): return x + {i}" for i in range(40))


def documented() -> dict[str, tuple[str, str, str]]:
    rows = {}
    for line in DOC.read_text().splitlines():
        match = ROW.match(line)
        if match:
            name, kind, service, moves = match.groups()
            rows[name] = (kind, service, moves)
    return rows


def scrape(process, token: str) -> dict[str, dict]:
    """{family name: {"type": ..., "samples": [(sample name, labels, value)]}} of one service."""
    request = urllib.request.Request(process.metrics_url, headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(request, timeout=10) as reply:
        text = reply.read().decode()
    families = {}
    for family in text_string_to_metric_families(text):
        name = family.name + ("_total" if family.type == "counter" else "")
        families[name] = {"type": family.type, "samples": [(s.name, s.labels, s.value) for s in family.samples]}
    return families


def level(families: dict, name: str) -> float:
    """A counter's or gauge's sum over its labels; a histogram's observation count."""
    samples = families.get(name, {"samples": []})["samples"]
    if families.get(name, {}).get("type") == "histogram":
        return sum(value for sample, _, value in samples if sample.endswith("_count"))
    return sum(value for sample, _, value in samples if not sample.endswith("_created"))


def services(stack) -> dict[str, tuple]:
    return {
        "gateway": (stack.gateway, ""),
        "tokenizer": (stack.tokenizer, stack.internal_token),
        "lm": (stack.lm[0], stack.internal_token),
        "diffusion": (stack.diffusion, stack.internal_token),
    }


def scrape_all(stack) -> dict[str, dict]:
    return {name: scrape(process, token) for name, (process, token) in services(stack).items()}


ALWAYS_DRAFT = {"proposer": "ngram", "params": {"adaptive": False, "min_ngram": 1, "max_ngram": 1}}


def _chat(stack, content: str, max_tokens: int, **extra) -> None:
    client = OpenAI(base_url=stack.base_url, api_key="unused")
    stream = client.chat.completions.create(
        model=TEXT_FIXTURE.name, messages=[{"role": "user", "content": content}], max_tokens=max_tokens,
        stream=True, extra_body={"ignore_eos": True, **extra},
    )  # fmt: skip
    for _ in stream:
        pass


def _image(stack, errors: list) -> None:
    reply = httpx.post(
        f"{stack.base_url}/images/generations",
        json={"model": "muestra-image", "prompt": "a handwritten three", "size": "32x32"}, timeout=120,
    )  # fmt: skip
    if reply.status_code != 200:
        errors.append(reply.text)


def test_every_documented_metric_moves_as_documented_and_gauges_return_to_idle(observed):
    rows = documented()
    assert len(rows) > 40, "docs/metrics.md's table did not parse"
    before = scrape_all(observed)
    for name, (kind, service, _) in rows.items():
        for where in before if service == "all" else [service]:
            assert name in before[where], f"{name} is documented for {where} but not exported there"
            assert before[where][name]["type"] == kind, f"{name}: exported as {before[where][name]['type']}"
    exported = {
        name
        for families in before.values()
        for name in families
        if name.startswith("muestra_") and not name.endswith("_created")  # prometheus_client's creation times
    }
    assert exported <= set(rows), f"exported but not in docs/metrics.md: {sorted(exported - set(rows))}"

    # Load: four long completions through a gateway that admits two rows at a time (so two wait), two
    # images at once, then a long prompt twice (prefix-cache hits). Gauges are watched while it runs.
    errors: list = []
    threads = [threading.Thread(target=_chat, args=(observed, f"Tell me about {i}", 48)) for i in range(4)]
    threads += [threading.Thread(target=_image, args=(observed, errors)) for _ in range(2)]
    for thread in threads:
        thread.start()
    peaks: dict[tuple[str, str], float] = {}
    load_rows = [(name, service) for name, (_, service, moves) in rows.items() if moves == "load"]
    while any(thread.is_alive() for thread in threads):
        now = scrape_all(observed)
        for name, service in load_rows:
            peaks[name, service] = max(peaks.get((name, service), 0.0), level(now[service], name))
        time.sleep(0.02)
    for thread in threads:
        thread.join()
    assert not errors, errors
    # The lm stores a block once two prompts have had it, after answering the second.
    written = level(scrape(observed.lm[0], observed.internal_token), "muestra_lm_prefix_cache_written_bytes_total")
    _chat(observed, LONG_PROMPT, 4)
    _chat(observed, LONG_PROMPT, 4)
    deadline = time.monotonic() + 10
    lm_written = "muestra_lm_prefix_cache_written_bytes_total"
    while level(scrape(observed.lm[0], observed.internal_token), lm_written) == written:
        assert time.monotonic() < deadline, "the long prompt's blocks were never written to Redis"
        time.sleep(0.05)
    _chat(observed, LONG_PROMPT, 4)
    # The fixture quantizes activations to int8, so its lm refuses drafts (docs/speculative.md): a request asking
    # for them runs without, and the `drafts` rows stay put here (tests/gateway/test_draft_model.py moves them).
    _chat(observed, LONG_PROMPT, 8, temperature=0, speculation=ALWAYS_DRAFT)
    with grpc.insecure_channel(observed.gateway.address) as channel:  # the gateway's own gRPC metrics
        replies = list(
            gateway_pb2_grpc.GatewayStub(channel).Generate(gateway_pb2.GenerateRequest(prompt="El", max_tokens=3))
        )
        assert replies[-1].done.usage.completion_tokens > 0

    for name, service in load_rows:
        assert peaks[name, service] > 0, f"{name} never rose above 0 on {service} under load"
    deadline = time.monotonic() + 10
    while True:
        after = scrape_all(observed)
        busy = [(n, s, level(after[s], n)) for n, s in load_rows if level(after[s], n) != 0]
        if not busy or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert not busy, f"gauges not back to idle after the load: {busy}"
    for name, (_, service, moves) in rows.items():
        for where in before if service == "all" else [service]:
            if moves == "requests":
                assert level(after[where], name) > level(before[where], name), f"{name} did not move on {where}"
            elif moves == "fixed":
                assert level(after[where], name) > 0, f"{name} is not set on {where}"
            elif moves == "drafts":
                assert level(after[where], name) == level(before[where], name), f"{name} moved on the int8 fixture"
            elif moves == "hot":
                assert level(after[where], name) == level(before[where], name), f"{name} moved with the hot tier off"

"""One request id across every service: HTTP X-Request-Id through gateway, tokenizer, lm and diffusion logs."""

from __future__ import annotations

import time

import httpx2 as httpx
from openai import OpenAI

from bench.stack import TEXT_FIXTURE

TEXT_MODEL = TEXT_FIXTURE.name


def _lines(process, needle: str) -> list[str]:
    return [line for line in process.log_path.read_text().splitlines() if needle in line]


def _eventually(process, needle: str, fragment: str, seconds: float = 10.0) -> bool:
    """The access line is written once the response has gone out, so the client can read first."""
    deadline = time.monotonic() + seconds
    while True:
        if any(fragment in line for line in _lines(process, needle)):
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)


def _chat(stack, request_id: str) -> str:
    client = OpenAI(base_url=stack.base_url, api_key="unused", default_headers={"X-Request-Id": request_id})
    stream = client.chat.completions.create(
        model=TEXT_MODEL, messages=[{"role": "user", "content": "How do I open a file?"}],
        max_tokens=12, stream=True, extra_body={"ignore_eos": True},
    )  # fmt: skip
    return "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)


def test_one_http_requests_id_reaches_the_log_lines_of_all_four_services(observed):
    # The first request opens the gateway's step streams to the lm and the tokenizer; the second
    # travels on the same streams, so finding its id on their lines shows that it rides each message.
    first, second = "trace-first-0001", "trace-second-0002"
    assert _chat(observed, first)
    assert _chat(observed, second)
    image = httpx.post(
        f"{observed.base_url}/images/generations", headers={"X-Request-Id": "trace-image-0003"},
        json={"model": "muestra-image", "prompt": "a handwritten seven", "size": "32x32"}, timeout=120,
    )  # fmt: skip
    assert image.status_code == 200, image.text

    gateway, tokenizer, lm, diffusion = observed.gateway, observed.tokenizer, observed.lm[0], observed.diffusion
    for request_id in (first, second):
        assert _eventually(gateway, f"[{request_id}]", "/v1/chat/completions 200")
        assert any("ApplyChatTemplate OK" in line for line in _lines(tokenizer, f"[{request_id}]"))
        assert any("Prefill OK" in line for line in _lines(lm, f"[{request_id}]"))
        # The per-step lines of the shared streams name the request whose rows they carry.
        assert any("BatchSteps decode" in line for line in _lines(lm, request_id))
        assert any("DetokenizeSteps:" in line for line in _lines(tokenizer, request_id))
    # Nothing of the second request is filed under the first's id (the streams it opened carry no id): every step
    # line after the second request's first one (the first had ended by then) names the second alone. Its steps
    # may be few: the fixture samples, and sampled rows run in bursts of several tokens per step.
    for process, needle in ((lm, "BatchSteps decode"), (tokenizer, "DetokenizeSteps:")):
        steps = _lines(process, needle)
        since = next(i for i, line in enumerate(steps) if second in line)
        assert steps[since:] and not any(first in line for line in steps[since:])
    assert _eventually(diffusion, "[trace-image-0003]", "Generate OK")
    assert _eventually(gateway, "[trace-image-0003]", "/v1/images/generations 200")

"""The web playground in a real Chromium, against the real gateway, tokenizer, lm and diffusion processes.

What the page shows is checked against the same request made through the public API (the official
`openai` client or plain HTTP): same seed, same text; same seed, same pixels; same error message.
"""

from __future__ import annotations

import base64
import io
import json
import time
from importlib import resources

import httpx2 as httpx
import numpy as np
import pytest
from google.protobuf import json_format
from PIL import Image

from muestra.v1 import gateway_pb2

STATIC = resources.files("muestra.gateway.playground") / "static"
SEED = 1234
CHAT_TEXT = "Tell me about lighthouses."


def set_field(page, selector: str, value) -> None:
    page.fill(selector, str(value))


def wait_finished(page, stats_selector: str, timeout_s: float = 60) -> str:
    page.wait_for_function(
        f"() => document.querySelector({json.dumps(stats_selector)})?.dataset.finish", timeout=timeout_s * 1000
    )
    return page.eval_on_selector(stats_selector, "el => el.dataset.finish")


def sent_bodies(page, path: str) -> list[dict]:
    """Every JSON body the page POSTs to `path` from now on (a live list)."""
    bodies: list[dict] = []
    page.on("request", lambda r: bodies.append(json.loads(r.post_data)) if r.url.endswith(path) else None)
    return bodies


def chain_of(page) -> list[str]:
    return page.eval_on_selector_all("#chain-steps > li", "els => els.map(el => el.dataset.name)")


def png_pixels(data: bytes) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))


def test_the_shipped_files_are_small_and_need_no_key(playground_url):
    files = [entry for entry in STATIC.iterdir() if entry.is_file()]
    total = sum(len(entry.read_bytes()) for entry in files)
    assert total < 200_000, f"the playground's files total {total} bytes; the budget is 200,000"
    with httpx.Client(base_url=playground_url, timeout=10) as http:
        index = http.get("/")
        assert index.status_code == 200 and "text/html" in index.headers["content-type"]
        assert "default-src 'self'" in index.headers["content-security-policy"]
        for entry in files:
            reply = http.get(f"/ui/{entry.name}")
            assert reply.status_code == 200, entry.name
            assert reply.content == entry.read_bytes()
        assert http.get("/ui/no-such-file.js").status_code == 404
        assert http.get("/ui/..%2Fplayground%2F__init__.py").status_code == 404
        # Without the key, the API gives nothing.
        for path in ("/v1/models", "/v1/samplers", "/v1/schedulers", "/v1/status"):
            assert http.get(path).status_code == 401, path


def test_the_page_paints_within_a_second(browser, playground_url):
    context = browser.new_context()
    page = context.new_page()
    page.goto(playground_url)
    paint = page.evaluate(
        """() => new Promise(resolve => {
            const seen = performance.getEntriesByName('first-contentful-paint')[0];
            if (seen) return resolve(seen.startTime);
            new PerformanceObserver(list => resolve(list.getEntries()[0].startTime))
                .observe({type: 'paint', buffered: true});
        })"""
    )
    context.close()
    print(f"first contentful paint: {paint:.0f} ms")
    assert paint < 1000


CHAT_TOKENS = 160


def test_a_chat_message_streams_token_by_token_and_equals_the_api(page, openai_stack, screenshots):
    # Long enough that the stream spans many network reads: 40 tokens of the tiny model could arrive in
    # two reads under load, and the page then grew in two steps (one CI run saw [0, 3, 30, 37, 37]).
    set_field(page, "#max-tokens", CHAT_TOKENS)
    set_field(page, "#text-seed", SEED)
    page.check("#text-same-seed")
    page.check("#text-ignore-eos")
    # Each time the page changes, note how much of the answer is showing.
    page.evaluate(
        """() => {
            window.lengths = [];
            new MutationObserver(() => {
                const answer = [...document.querySelectorAll('#chat-log .message.assistant .text')].pop();
                if (answer) window.lengths.push(answer.textContent.length);
            }).observe(document.getElementById('chat-log'), {childList: true, subtree: true, characterData: true});
        }"""
    )
    bodies = sent_bodies(page, "/v1/chat/completions")
    page.fill("#chat-input", CHAT_TEXT)
    shown = page.text_content("#eq-code")  # the curl form of what the page is about to send
    page.press("#chat-input", "Enter")
    assert wait_finished(page, "#chat-log .message.assistant .stats") == "length"
    text = page.text_content("#chat-log .message.assistant .text")
    lengths = page.evaluate("window.lengths")
    assert len({n for n in lengths if 0 < n < len(text)}) >= 3, f"the answer did not grow token by token: {lengths}"

    (body,) = bodies
    assert body["seed"] == SEED and body["stream"] is True and body["max_tokens"] == CHAT_TOKENS
    assert json.loads(shown.split(" -d ", 1)[1].strip()[1:-1].replace("'\\''", "'")) == body
    with openai_stack.client(max_retries=0, timeout=60) as client:
        reference = client.chat.completions.create(
            model=body["model"], messages=[{"role": "user", "content": CHAT_TEXT}], max_tokens=CHAT_TOKENS, seed=SEED,
            extra_body={"samplers": body["samplers"], "ignore_eos": True},
        )  # fmt: skip
    assert text == reference.choices[0].message.content
    stats = page.text_content("#chat-log .message.assistant .stats")
    assert "tokens/s" in stats and "first token" in stats
    assert f"prompt {reference.usage.prompt_tokens} tokens" in stats and f"{CHAT_TOKENS} generated" in stats

    # Same seed: Regenerate gives the same answer again.
    page.click("#chat-regenerate")
    page.wait_for_function("() => document.querySelectorAll('#chat-log .message.assistant').length === 1")
    wait_finished(page, "#chat-log .message.assistant .stats")
    assert page.text_content("#chat-log .message.assistant .text") == text
    assert bodies[1] == bodies[0]
    page.screenshot(path=screenshots / "playground-chat.png", full_page=True)


def test_the_sampler_editor_lists_the_third_party_plugin_and_sends_it(page, openai_stack, screenshots):
    options = page.eval_on_selector_all("#chain-add-name option", "els => els.map(el => el.value)")
    assert "mirostat" in options and "top_p" in options
    assert chain_of(page) == ["temperature", "top_p", "sample"]
    page.click("#chain-steps > li[data-name='sample'] button[data-action='remove']")
    page.select_option("#chain-add-name", "mirostat")
    page.click("#chain-add")
    # Its parameters come from its JSON Schema, with their defaults and descriptions.
    mirostat = page.locator("#chain-steps > li[data-name='mirostat']")
    assert mirostat.locator("input[name='tau']").input_value() == "5"
    assert mirostat.locator("input[name='eta']").input_value() == "0.1"
    assert "Target surprise" in mirostat.text_content()
    mirostat.locator("input[name='tau']").fill("3")
    # Reorder by buttons: top_p before temperature.
    page.click("#chain-steps > li[data-name='top_p'] button[data-action='up']")
    assert chain_of(page) == ["top_p", "temperature", "mirostat"]
    page.click("#equivalent summary")
    page.click("#eq-python")
    assert '"name": "mirostat"' in page.text_content("#eq-code")
    page.screenshot(path=screenshots / "playground-samplers.png", full_page=True)

    bodies = sent_bodies(page, "/v1/completions")
    page.click("#tab-complete")
    page.fill("#complete-prompt", "Once upon a time")
    set_field(page, "#max-tokens", 24)
    set_field(page, "#text-seed", SEED)
    page.check("#text-same-seed")
    page.click("#complete-send")
    wait_finished(page, "#complete-stats")
    (body,) = bodies
    assert body["samplers"] == [
        {"name": "top_p", "params": {"top_p": 0.95}},
        {"name": "temperature", "params": {"temperature": 0.8}},
        {"name": "mirostat", "params": {"tau": 3, "eta": 0.1}},
    ]
    with openai_stack.client(max_retries=0, timeout=60) as client:
        reference = client.completions.create(
            model=body["model"], prompt="Once upon a time", max_tokens=24, seed=SEED,
            extra_body={"samplers": body["samplers"]},
        )  # fmt: skip
    assert page.text_content("#complete-out .generated") == reference.choices[0].text
    # A different chain is a different request: without mirostat's low tau the text changes.
    page.click("#chain-steps > li[data-name='mirostat'] button[data-action='remove']")
    page.select_option("#chain-add-name", "sample")
    page.click("#chain-add")
    page.click("#complete-regenerate")
    wait_finished(page, "#complete-stats")
    assert bodies[1]["samplers"][-1] == {"name": "sample", "params": {}}


def test_an_invalid_parameter_shows_the_apis_message(page, openai_stack):
    page.locator("#chain-steps > li[data-name='temperature']").locator("input[name='temperature']").fill("500")
    bodies = sent_bodies(page, "/v1/chat/completions")
    page.fill("#chat-input", "hello")
    page.click("#chat-send")
    page.wait_for_selector("#alert:not([hidden])")
    shown = page.text_content("#alert-text")
    reply = httpx.post(
        openai_stack.base_url + "/chat/completions", json=bodies[0], timeout=30,
        headers={"Authorization": f"Bearer {openai_stack.api_key}"},
    )  # fmt: skip
    assert reply.status_code == 400
    assert shown == f"HTTP 400: {reply.json()['error']['message']}"
    assert "temperature" in shown
    # The page stays usable.
    assert page.is_enabled("#chat-send") and not page.is_enabled("#chat-stop")


def test_an_image_shows_previews_then_the_pixels_the_api_gives(page, openai_stack, screenshots):
    page.click("#tab-images")
    page.fill("#image-prompt", "a red circle")
    set_field(page, "#image-width", 64)
    set_field(page, "#image-height", 64)
    set_field(page, "#image-steps", 4)
    set_field(page, "#image-guidance", 5)
    set_field(page, "#image-seed", 7)
    page.check("#image-same-seed")
    page.evaluate(
        """() => {
            window.previews = [];
            new MutationObserver(() => window.previews.push(document.getElementById('image-preview').src))
                .observe(document.getElementById('image-preview'), {attributes: true, attributeFilter: ['src']});
        }"""
    )
    page.click("#image-generate")
    page.wait_for_selector("#gallery figure img", timeout=120_000)
    previews = page.evaluate("window.previews")
    assert len(set(previews)) >= 2, "fewer than two distinct previews were shown"
    src = page.get_attribute("#gallery figure img", "src")
    shown = base64.b64decode(src.split(",", 1)[1])
    with openai_stack.client(max_retries=0, timeout=120) as client:
        reference = client.images.generate(
            prompt="a red circle", size="64x64", response_format="b64_json",
            extra_body={"steps": 4, "guidance_scale": 5, "seed": 7},
        )  # fmt: skip
    np.testing.assert_array_equal(png_pixels(shown), png_pixels(base64.b64decode(reference.data[0].b64_json)))
    parameters = page.text_content("#gallery figure pre")
    assert parameters.startswith("a red circle\n") and "Seed: 7" in parameters
    page.screenshot(path=screenshots / "playground-images.png", full_page=True)

    # The gallery's parameters load back into the form.
    page.fill("#image-prompt", "something else")
    set_field(page, "#image-steps", 9)
    page.click("#gallery figure button")
    assert page.input_value("#image-prompt") == "a red circle"
    assert page.input_value("#image-steps") == "4" and page.input_value("#image-seed") == "7"
    assert page.input_value("#image-width") == "64"


def test_without_the_key_the_page_gets_no_data(browser, playground_url, openai_stack):
    context = browser.new_context()
    page = context.new_page()
    statuses: dict[str, int] = {}
    page.on("response", lambda r: statuses.__setitem__(r.url.split("/", 3)[3], r.status))
    page.goto(playground_url)
    page.wait_for_selector("#key-panel:not([hidden])")
    api = {path: status for path, status in statuses.items() if path.startswith("v1/")}
    assert api and set(api.values()) == {401}, api
    assert page.eval_on_selector_all("#text-model option", "els => els.length") == 0
    assert "missing API key" in page.text_content("#key-why")
    page.fill("#key-input", "not-the-key")
    page.click("#key-form button[type='submit']")
    page.wait_for_function("() => document.getElementById('key-why').textContent.includes('invalid API key')")
    page.fill("#key-input", openai_stack.api_key)
    page.click("#key-form button[type='submit']")
    page.wait_for_function("() => document.querySelectorAll('#text-model option').length > 0")
    assert page.is_hidden("#key-panel")
    context.close()


def test_stop_cancels_the_generation(page, openai_stack):
    assert openai_stack.lm_rows() == 0
    set_field(page, "#max-tokens", 400)
    page.check("#text-ignore-eos")
    page.fill("#chat-input", "Go on for as long as you can.")
    page.press("#chat-input", "Enter")
    deadline = time.monotonic() + 30
    while openai_stack.lm_rows() == 0:
        assert time.monotonic() < deadline, "the generation never reached the lm"
        time.sleep(0.005)
    # Stop once text shows: the row can reach the lm before its first token reaches the page (CI raced here).
    page.wait_for_function(
        "() => (document.querySelector('#chat-log .message.assistant .text') || {}).textContent", timeout=30_000
    )
    assert openai_stack.lm_rows() > 0, "the generation ended before Stop (400 tokens, ignore_eos)"
    page.click("#chat-stop")
    assert wait_finished(page, "#chat-log .message.assistant .stats") == "stopped by you"
    deadline = time.monotonic() + 10
    while openai_stack.lm_rows() > 0:
        assert time.monotonic() < deadline, "the lm kept the stopped row"
        time.sleep(0.02)
    shown = page.text_content("#chat-log .message.assistant .text")
    assert shown, "nothing streamed before Stop"
    assert page.is_enabled("#chat-send")


def test_the_status_view_shows_models_replicas_and_the_cache(page, openai_stack):
    page.click("#tab-status")
    page.wait_for_selector("#status-models table")
    text = page.text_content("#view-status")
    assert openai_stack.text_model in text and "healthy" in text
    assert "requests running" in page.text_content("#status-summary")
    assert "prefix cache" in page.text_content("#status-summary")


def test_keyboard_labels_and_a_narrow_screen(browser, playground_url, openai_stack):
    context = browser.new_context(viewport={"width": 360, "height": 740})
    context.add_init_script(f"sessionStorage.setItem('muestra.apiKey', {openai_stack.api_key!r})")
    page = context.new_page()
    page.goto(playground_url)
    page.wait_for_function("() => document.querySelectorAll('#chain-add-name option').length > 0")
    # Arrow keys move between the views, as a tab list does.
    page.focus("#tab-chat")
    for expected in ("complete", "images", "status", "chat"):
        page.keyboard.press("ArrowRight")
        assert page.evaluate("document.activeElement.id") == f"tab-{expected}"
        assert page.is_visible(f"#view-{expected}")
        for other in {"chat", "complete", "images", "status"} - {expected}:
            assert page.is_hidden(f"#view-{other}"), f"#view-{other} shows beside #view-{expected}"
        assert page.is_visible("#text-settings") == (expected in ("chat", "complete"))
        unlabelled = page.evaluate(
            """() => [...document.querySelectorAll('input, select, textarea')]
                .filter(el => el.offsetParent !== null)
                .filter(el => !(el.labels && el.labels.length) && !el.getAttribute('aria-label'))
                .map(el => el.id)"""
        )
        assert unlabelled == [], f"fields without a label: {unlabelled}"
        width = page.evaluate("document.documentElement.scrollWidth")
        assert width <= 360, f"the {expected} view scrolls sideways at 360 px ({width} px wide)"
    context.close()


def test_the_grpc_form_of_the_request_is_a_valid_generate_request(page):
    page.fill("#chat-input", "hi")
    page.click("#equivalent summary")
    page.click("#eq-grpc")
    shown = page.text_content("#eq-code")
    body = shown.split(" -d '", 1)[1].split("'", 1)[0]
    request = json_format.Parse(body, gateway_pb2.GenerateRequest())
    assert request.messages.messages[0].content == "hi"
    assert [s.name for s in request.samplers] == ["temperature", "top_p", "sample"]


@pytest.fixture(autouse=True)
def _lm_is_idle(openai_stack):
    """Each test starts and ends with no rows in the lm (Stop's check relies on it)."""
    yield
    deadline = time.monotonic() + 10
    while openai_stack.lm_rows() and time.monotonic() < deadline:
        time.sleep(0.05)

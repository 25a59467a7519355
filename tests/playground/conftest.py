"""A real Chromium (Debian's, found on PATH or in MUESTRA_CHROMIUM) driven by Playwright, no browser download.

scripts/ensure_chromium.sh installs it; in CI a missing browser fails the run instead of skipping.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from tests.fixtures.openai_stack import API_KEY

# As root Chromium needs --no-sandbox; the network flags keep it from calling Google's hosts on a closed network.
CHROMIUM_FLAGS = [
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
]


def chromium_path() -> str | None:
    return os.environ.get("MUESTRA_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.fixture(scope="module")
def browser():
    """One Chromium per test module, closed at its end.

    Playwright's sync API marks its event loop as running in this thread while it is open, so
    asyncio.run() in the tests that follow would fail if the browser lived for the whole session.
    """
    path = chromium_path()
    if path is None:
        message = "chromium is not installed: scripts/ensure_chromium.sh installs it (apt-get)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=path, args=CHROMIUM_FLAGS)
        yield browser
        browser.close()


@pytest.fixture(scope="session")
def playground_url(openai_stack) -> str:
    return openai_stack.base_url.removesuffix("/v1") + "/"


@pytest.fixture
def page(browser, playground_url):
    """A page of the playground with the stack's API key already given (as the key form stores it)."""
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    context.add_init_script(f"sessionStorage.setItem('muestra.apiKey', {API_KEY!r})")
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.goto(playground_url)
    page.wait_for_function("() => document.querySelectorAll('#chain-add-name option').length > 0")
    yield page
    context.close()
    assert not errors, f"uncaught errors in the page: {errors}"


@pytest.fixture(scope="session")
def screenshots(tmp_path_factory) -> Path:
    """Where the tests save their screenshots: MUESTRA_SCREENSHOT_DIR (docs/images to refresh the docs') or tmp."""
    where = os.environ.get("MUESTRA_SCREENSHOT_DIR")
    path = Path(where) if where else tmp_path_factory.mktemp("screenshots")
    path.mkdir(parents=True, exist_ok=True)
    return path

"""Retake the playground's screenshots in docs/images/ against `muestra up` with the default models.

    python scripts/playground_screenshots.py [--out docs/images]

It starts `muestra up --base-port 0` (free ports on loopback, so not the default ones; no API key), drives
Debian's Chromium through Playwright (no browser download; MUESTRA_CHROMIUM picks another binary), and saves
playground-chat.png (a two-turn chat, its answers rendered as Markdown), playground-request.png (the "same
request" box: curl, Python and grpcurl aimed at this stack's own ports), playground-samplers.png,
playground-images-previews.png (the image view mid-generation, a preview showing) and playground-images.png.
Seeds are fixed, so a rerun on the same models gives the same text and images. The stack is stopped by its
PID at the end, also when something fails.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

from playwright.sync_api import sync_playwright

ROOT = Path(__file__).resolve().parents[1]
# As root Chromium needs --no-sandbox; the network flags keep it from calling Google's hosts.
CHROMIUM_FLAGS = [
    "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage",
]  # fmt: skip
VIEWPORT = {"width": 1280, "height": 820}
SEED = 7


def start_stack(log_dir: Path, timeout_s: float) -> subprocess.Popen:
    """`muestra up` with the default models on free loopback ports and no API key."""
    env = {k: v for k, v in os.environ.items() if k != "MUESTRA_GATEWAY_API_KEYS"}
    muestra = shutil.which("muestra") or str(Path(sys.executable).with_name("muestra"))
    command = [muestra, "up", "--base-port", "0", "--log-dir", str(log_dir), "--startup-timeout", str(timeout_s)]
    return subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def playground_url(proc: subprocess.Popen, log_dir: Path) -> str:
    """The URL `muestra up` prints, once it says every service is healthy."""
    url = None
    for line in proc.stdout:
        print(line, end="", flush=True)
        if "playground on " in line:
            url = line.split("playground on ", 1)[1].strip()
        if "all services healthy" in line and url:
            return url
    raise RuntimeError(f"muestra up exited ({proc.wait()}) before the stack was healthy; logs in {log_dir}")


def stop_stack(proc: subprocess.Popen) -> None:
    """SIGTERM to `muestra up` (it stops its services, then Redis), SIGKILL if it takes too long."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def chat(page, out: Path) -> None:
    page.fill("#chat-system", "Be brief.")
    page.fill("#text-seed", str(SEED))
    page.check("#text-same-seed")
    page.fill("#chat-input", "What is the capital of France?")
    page.press("#chat-input", "Enter")
    page.wait_for_function("() => document.querySelector('#chat-log .message.assistant .stats')?.dataset.finish")
    page.fill("#chat-input", "And of Italy?")
    page.press("#chat-input", "Enter")
    page.wait_for_function("() => document.querySelectorAll('#chat-log .stats[data-finish]').length === 2")
    page.locator("#chat-input").blur()
    page.screenshot(path=out / "playground-chat.png")


def request_box(page, out: Path) -> None:
    """The chat's last request as curl, Python and grpcurl, aimed at this stack's own (non-default) ports."""
    page.click("#equivalent summary")
    page.locator("#equivalent").screenshot(path=out / "playground-request.png")
    page.click("#equivalent summary")


def samplers(page, out: Path) -> None:
    """The settings column: the model's chain with mirostat in place of its token pick, and the curl form."""
    page.select_option("#chain-add-name", "mirostat")
    page.click("#chain-add")
    page.click("#equivalent summary")
    page.locator("#text-settings").screenshot(path=out / "playground-samplers.png")


def images(page, out: Path) -> None:
    page.click("#tab-images")
    page.fill("#image-prompt", "a handwritten nine")
    page.fill("#image-seed", str(SEED))
    page.fill("#image-n", "2")
    page.fill("#image-steps", "40")
    page.click("#image-generate")
    # Mid-generation: a preview of the first image is showing, its label and bar part of the way.
    page.wait_for_function(
        "() => !document.getElementById('image-preview').hidden"
        " && /^Step (1[2-9]|2[0-9]) of /.test(document.getElementById('image-progress-label').textContent)",
        timeout=300_000,
    )
    page.screenshot(path=out / "playground-images-previews.png")
    page.wait_for_function(
        "() => document.getElementById('image-progress-label').textContent.startsWith('Done')", timeout=300_000
    )
    page.screenshot(path=out / "playground-images.png")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "images", help="where the PNGs go")
    parser.add_argument("--log-dir", type=Path, default=None, help="the stack's logs (default: a new temporary folder)")
    parser.add_argument("--startup-timeout", type=float, default=300.0, help="seconds to wait for the stack")
    args = parser.parse_args()
    chromium = os.environ.get("MUESTRA_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        print("chromium is not installed: scripts/ensure_chromium.sh installs it (apt-get)", file=sys.stderr)
        return 1
    log_dir = args.log_dir or Path(tempfile.mkdtemp(prefix="muestra-screenshots-"))
    args.out.mkdir(parents=True, exist_ok=True)
    stack = start_stack(log_dir, args.startup_timeout)
    try:
        url = playground_url(stack, log_dir)
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=chromium, args=CHROMIUM_FLAGS)
            try:
                page = browser.new_page(viewport=VIEWPORT)
                page.set_default_timeout(120_000)
                page.goto(url)
                page.wait_for_function("() => document.querySelectorAll('#chain-add-name option').length > 0")
                chat(page, args.out)
                request_box(page, args.out)
                samplers(page, args.out)
                images(page, args.out)
            finally:
                browser.close()
    finally:
        stop_stack(stack)
    print(f"saved playground-chat.png, playground-request.png, playground-samplers.png, playground-images-previews.png"
          f" and playground-images.png in {args.out}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())

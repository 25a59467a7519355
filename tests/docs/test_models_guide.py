"""docs/models.md's text-model section runs as written, from a transformers folder to `muestra generate`.

A tiny random Llama saved with save_pretrained plays `my-model`. Every `.venv/bin/muestra` line of the
section's shell blocks runs in order in a scratch folder, with the repository's venv: `export-lm`,
then `up` (kept running, on free ports: the only change made to the commands), then `models`,
`generate` and `chat`; then the section's Python block, whose greedy check must print True.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "models.md"
MUESTRA = [sys.executable, "-m", "muestra.cli"]
# The address the guide's Python block names: `muestra up`'s default gateway port.
DOC_GATEWAY = "127.0.0.1:50051"
CHAT_TEMPLATE = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}assistant:"


def text_section() -> str:
    text = DOC.read_text()
    return text[text.index("## A text model from a transformers folder") : text.index("## An image model")]


def guide_commands(section: str) -> list[list[str]]:
    commands = []
    for block in re.findall(r"```sh\n(.*?)```", section, re.S):
        commands += [shlex.split(line)[1:] for line in block.splitlines() if line.startswith(".venv/bin/muestra ")]
    return commands


def start_up(argv: list[str], cwd: Path, env: dict) -> tuple[subprocess.Popen, str]:
    """`muestra up …` on free ports until healthy; returns it and the gateway's address."""
    proc = subprocess.Popen(
        [*MUESTRA, *argv, "--base-port", "0", "--log-dir", str(cwd / "logs")],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    lines, gateway, deadline = [], None, time.monotonic() + 180
    for line in proc.stdout:
        lines.append(line.rstrip())
        if match := re.search(r"gateway\s+serving on (\S+)", line):
            gateway = match.group(1)
        if "all services healthy" in line or "last log lines" in line or time.monotonic() > deadline:
            break
    if gateway is None or not any("all services healthy" in line for line in lines):
        proc.send_signal(signal.SIGINT)
        proc.wait(60)
        pytest.fail("muestra up did not come up:\n" + "\n".join(lines))
    return proc, gateway


def test_the_text_model_guide_runs_as_written(tiny_lm, tmp_path):
    section = text_section()
    commands = guide_commands(section)
    assert [c[0] for c in commands] == ["export-lm", "export-lm", "up", "models", "generate", "chat"], commands
    python_blocks = re.findall(r"```python\n(.*?)```", section, re.S)
    assert len(python_blocks) == 1 and DOC_GATEWAY in python_blocks[0]

    # `my-model`: a transformers folder as save_pretrained writes it, with a chat template.
    shutil.copytree(tiny_lm("llama").hf_dir, tmp_path / "my-model")
    (tmp_path / "my-model" / "chat_template.jinja").write_text(CHAT_TEMPLATE)
    (tmp_path / "held-out.txt").write_text("The quick brown fox jumps over the lazy dog. " * 8)
    env = {**os.environ, "MUESTRA_STATE_FILE": str(tmp_path / "up.json")}
    env.pop("MUESTRA_GATEWAY_ADDR", None)

    up = None
    try:
        for argv in commands:
            if argv[0] == "up":
                up, gateway = start_up(argv, tmp_path, env)
                continue
            stdin = "Hello there\n" if argv[0] == "chat" else None
            done = subprocess.run(
                [*MUESTRA, *argv], cwd=tmp_path, env=env, input=stdin, capture_output=True, text=True, timeout=300
            )
            assert done.returncode == 0, (argv, done.stdout, done.stderr)
            assert "Traceback" not in done.stderr, done.stderr
            if argv[0] == "models":
                assert "my-model-onnx" in done.stdout, done.stdout
            if argv[0] in ("generate", "chat"):
                assert done.stdout.strip(), f"{argv[0]} printed nothing"
        assert up is not None
        script = python_blocks[0].replace(DOC_GATEWAY, gateway)
        done = subprocess.run(
            [sys.executable, "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
        )
        assert done.returncode == 0, done.stderr
        assert done.stdout.startswith("True "), done.stdout
    finally:
        if up is not None:
            up.send_signal(signal.SIGINT)
            up.wait(60)

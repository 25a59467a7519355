"""`muestra up` starts the stack on loopback, the CLI talks to it, and Ctrl-C leaves no process behind."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

from muestra.cli.endpoints import HTTP_PORT, HTTP_PORT_OFFSET
from muestra.cli.launch import free_port
from tests.cli.conftest import MUESTRA, TEXT_FIXTURE, assert_fails_in_one_line, muestra

REPO = Path(__file__).resolve().parents[2]


def start_up(
    tmp_path: Path, *args: str, env: dict | None = None, text_model: Path = TEXT_FIXTURE
) -> tuple[subprocess.Popen, dict[str, tuple[str, int]], list[str]]:
    """Run `muestra up` on text_model until it reports healthy; return it, {service: (address, pid)} and its output."""
    command = [*MUESTRA, "up", "--base-port", "0", "--log-dir", str(tmp_path / "logs"), "--text-model", str(text_model)]
    proc = subprocess.Popen(
        [*command, *args],
        env={**os.environ, **(env or {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=REPO,
    )
    services, lines = {}, []
    deadline = time.monotonic() + 180
    for line in proc.stdout:
        lines.append(line.rstrip())
        match = re.search(r"(\w+)\s+serving on (\S+) \(pid (\d+)\)", line)
        if match:
            services[match.group(1)] = (match.group(2), int(match.group(3)))
        match = re.search(r"(\w+)\s+metrics on (\S+)", line)
        if match:
            services[f"{match.group(1)}-metrics"] = (match.group(2), 0)
        match = re.search(r"OpenAI API on (\S+)", line)
        if match:
            services["http"] = (match.group(1), 0)
        match = re.search(r"playground on (\S+)", line)
        if match:
            services["playground"] = (match.group(1), 0)
        if "all services healthy" in line or "last log lines" in line or time.monotonic() > deadline:
            break
    return proc, services, lines


def finish(proc: subprocess.Popen) -> str:
    """The rest of the output (read from the same buffered stream) once the process has exited."""
    rest = proc.stdout.read()
    proc.wait(timeout=60)
    return rest


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie child of an exited parent is reaped by init; treat "Z" as gone.
    stat = Path(f"/proc/{pid}/stat")
    return stat.exists() and stat.read_text().split()[2] != "Z"


def test_up_serves_its_models_and_stops_cleanly_on_ctrl_c(tmp_path):
    proc, services, lines = start_up(tmp_path)
    try:
        assert {"tokenizer", "lm", "gateway"} <= set(services), "\n".join(lines)
        tokenizer_addr = services["tokenizer"][0]
        # The internal services require the token muestra up made; the CLI reads it from the file it names.
        token_file = tmp_path / "logs" / "internal_token"
        assert token_file.stat().st_mode & 0o077 == 0
        refused = subprocess.run(
            [*MUESTRA, "tokenize", "El cielo es azul", "--tokenizer", tokenizer_addr, "--json"],
            capture_output=True, text=True, timeout=60, env={**os.environ, "MUESTRA_INTERNAL_TOKEN": ""},
        )  # fmt: skip
        assert "UNAUTHENTICATED" in refused.stderr and "Traceback" not in refused.stderr, refused.stderr
        out = subprocess.run(
            [*MUESTRA, "tokenize", "El cielo es azul", "--tokenizer", tokenizer_addr, "--json"],
            capture_output=True, text=True, timeout=60, check=True,
            env={**os.environ, "MUESTRA_INTERNAL_TOKEN_FILE": str(token_file)},
        ).stdout  # fmt: skip
        assert '"ids"' in out and '"tokens"' in out
        # No secret is on any command line of the stack (ps shows them to every user).
        secrets = [token_file.read_text().strip()]
        for name, (_, pid) in services.items():
            if pid:
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
                assert not any(secret in cmdline for secret in secrets), name
        # No --gateway: the commands find the stack through the state file muestra up wrote.
        gen = subprocess.run(
            [*MUESTRA, "generate", "El cielo es", "--max-tokens", "12", "--temperature", "0.7", "--top-p", "0.9",
             "--seed", "1", "--json"],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert gen.returncode == 0, gen.stderr + "\n".join(lines)
        assert '"completion_tokens": 12' in gen.stdout
        via_gateway = subprocess.run(
            [*MUESTRA, "tokenize", "El cielo es azul", "--json"], capture_output=True, text=True, timeout=60
        )
        assert json.loads(via_gateway.stdout) == json.loads(out)
        listed = subprocess.run([*MUESTRA, "models", "--json"], capture_output=True, text=True, timeout=60)
        assert any(m["kind"] == "text" and m["replicas"] == 1 for m in json.loads(listed.stdout)), listed.stderr
        # muestra plugins lists the running gateway's plugins, with descriptions, and the schedulers of its diffusion.
        listed = subprocess.run([*MUESTRA, "plugins", "--json"], capture_output=True, text=True, timeout=60)
        plugins = {p["name"]: p for p in json.loads(listed.stdout)}
        assert plugins["mirostat"]["samplers"][0]["description"].startswith("Mirostat"), listed.stderr
        if "diffusion" in services:
            assert "euler_a" in {s["name"] for p in plugins.values() for s in p["schedulers"]}
        # Every service's metrics URL is printed and serves (behind the internal token; the gateway's is open).
        for name in ("tokenizer", "lm", "gateway"):
            assert f"{name}-metrics" in services, "\n".join(lines)
        token = token_file.read_text().strip()
        for name in ("tokenizer", "gateway"):
            request = urllib.request.Request(
                services[f"{name}-metrics"][0], headers={"Authorization": f"Bearer {token}"}
            )
            with urllib.request.urlopen(request, timeout=10) as reply:
                assert reply.status == 200 and b"# TYPE" in reply.read()
        if "diffusion" in services:  # a default image model ships in models/muestra-image
            png = tmp_path / "seven.png"
            subprocess.run(
                [*MUESTRA, "image", "a handwritten seven", "-o", str(png), "--steps", "4", "--seed", "3",
                 "--gateway", services["gateway"][0]],
                capture_output=True, text=True, timeout=300, check=True,
            )  # fmt: skip
            assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        if shutil.which("redis-server"):
            assert any("redis-server on" in line and "password required" in line for line in lines)
    finally:
        proc.send_signal(signal.SIGINT)
        rest = finish(proc)
    assert proc.returncode == 0, rest
    assert "stopped" in rest
    for name, (_, pid) in services.items():
        assert pid == 0 or not alive(pid), f"{name} (pid {pid}) outlived muestra up"


def test_the_official_openai_streaming_example_runs_against_up(tmp_path):
    from openai import OpenAI

    metrics_port = free_port()
    proc, services, lines = start_up(
        tmp_path, "--only", "tokenizer,lm,gateway", env={"MUESTRA_GATEWAY_METRICS_PORT": str(metrics_port)}
    )
    try:
        assert "http" in services, "\n".join(lines)
        # A metrics port the environment sets is the one the gateway gets (and muestra up prints).
        assert services["gateway-metrics"][0] == f"http://127.0.0.1:{metrics_port}/metrics"
        client = OpenAI(base_url=services["http"][0], api_key="unused")
        model = client.models.list().data[0].id
        stream = client.chat.completions.create(
            model=model,
            messages=[{"role": "user", "content": "El cielo es"}],
            max_tokens=16,
            stream=True,
        )
        pieces = []
        for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                print(chunk.choices[0].delta.content, end="")
                pieces.append(chunk.choices[0].delta.content)
        assert pieces, "no text streamed"
        # The playground is served at the URL muestra up prints, beside the API.
        assert services["playground"][0] == services["http"][0].removesuffix("v1"), "\n".join(lines)
        with urllib.request.urlopen(services["playground"][0], timeout=10) as reply:
            assert reply.status == 200 and b"muestra playground" in reply.read()
    finally:
        proc.send_signal(signal.SIGINT)
        finish(proc)
    assert proc.returncode == 0


def test_up_fails_fast_showing_the_dead_services_log(tmp_path):
    broken = tmp_path / "broken-model"
    shutil.copytree(TEXT_FIXTURE, broken)
    (broken / "model.onnx").write_bytes(b"this is not an onnx file")
    proc, services, lines = start_up(tmp_path, "--only", "tokenizer,lm", text_model=broken)
    rest = finish(proc)
    output = "\n".join(lines) + rest
    assert proc.returncode == 1
    assert "lm exited; its last log lines" in output
    assert "model.onnx" in output  # the lm service's own error, shown to the user
    for name, (_, pid) in services.items():
        assert pid == 0 or not alive(pid), f"{name} (pid {pid}) outlived muestra up"


def test_up_without_the_default_text_model_names_the_command_that_builds_it(tmp_path):
    models = tmp_path / "models"  # no smollm2-135m-instruct/ here: it was never built
    models.mkdir()
    up = ["up", "--base-port", "0", "--models-dir", str(models), "--log-dir", str(tmp_path / "logs")]
    result = muestra(*up, env={"MUESTRA_LM_MODEL": ""}, timeout=60)
    line = assert_fails_in_one_line(result)
    assert str(models / "smollm2-135m-instruct") in line
    assert "make default-model" in line and "--text-model DIR" in line
    assert result.stdout == "" and not (tmp_path / "logs").exists()  # nothing was started, not even its logs
    # A stack that serves no text needs no text model: the image model it names is what is missing.
    result = muestra(*up, "--only", "diffusion", "--image-model", str(models / "absent"), timeout=60)
    assert "make default-model" not in assert_fails_in_one_line(result, exit_code=2)


@pytest.mark.parametrize("command", [["plugins", "--local"], ["--help"]])
def test_cli_commands_run(command):
    result = subprocess.run([*MUESTRA, *command], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr


def test_services_stop_by_themselves_when_muestra_up_is_killed(tmp_path):
    # No redis-server here: unlike the services, it cannot notice that its parent died.
    proc, services, lines = start_up(
        tmp_path, "--only", "tokenizer", env={"MUESTRA_REDIS_URL": "redis://127.0.0.1:9/0"}
    )
    assert "tokenizer" in services, "\n".join(lines)
    proc.kill()
    proc.wait(timeout=10)
    pid = services["tokenizer"][1]
    deadline = time.monotonic() + 20
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not alive(pid)


def test_each_stack_has_its_own_state_file_and_the_newest_is_the_default(tmp_path):
    env = {"MUESTRA_REDIS_URL": "redis://127.0.0.1:9/0"}  # no redis-server: only the tokenizer starts
    older, older_services, lines = start_up(tmp_path / "older", "--only", "tokenizer", env=env)
    newer, newer_services, more_lines = start_up(tmp_path / "newer", "--only", "tokenizer", env=env)
    try:
        assert "tokenizer" in older_services and "tokenizer" in newer_services, "\n".join(lines + more_lines)
        state_dir = Path(os.environ["MUESTRA_STATE_DIR"])
        keys = {path.stem for path in state_dir.glob("*.json")}
        assert keys == {address.rpartition(":")[2] for address, _ in (older_services["tokenizer"],
                                                                       newer_services["tokenizer"])}  # fmt: skip
        listed = muestra("up", "--list", timeout=60).stdout.splitlines()
        assert len(listed) == 2, listed
        assert "(the default)" in listed[0] and newer_services["tokenizer"][0] in listed[0]
        assert older_services["tokenizer"][0] in listed[1]
        # The older stack's tokenizer is asked with the older stack's internal token, found through its file.
        result = muestra("tokenize", "El cielo", "--tokenizer", older_services["tokenizer"][0], "--json", timeout=60)
        assert result.returncode == 0, result.stderr
    finally:
        for proc in (newer, older):
            proc.send_signal(signal.SIGINT)
            finish(proc)
    assert list(state_dir.glob("*.json")) == []
    assert "no `muestra up` is running" in muestra("up", "--list", timeout=60).stdout


def stack_ports(base: int) -> list[int]:
    """The ports `muestra up --base-port base` opens: services, their metrics, the HTTP API (as --help says)."""
    return [*range(base, base + 4), *range(base + 10, base + 14), base + HTTP_PORT_OFFSET]


def free_now(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_base_port() -> int:
    """A base port whose every port is free (none of them 8000)."""
    candidates = range(free_port() % 20000 + 30000, 60000, 50)
    return next(base for base in candidates if all(map(free_now, stack_ports(base))))


def hold(port: int) -> socket.socket:
    """A listening socket on port (already taken by someone else: fine, it is taken either way)."""
    holder = socket.socket()
    try:
        holder.bind(("127.0.0.1", port))
        holder.listen()
    except OSError:
        pass
    return holder


def test_base_port_moves_the_http_api_too(tmp_path):
    base = free_base_port()
    with hold(HTTP_PORT):
        proc, services, lines = start_up(tmp_path, "--only", "tokenizer,lm,gateway", "--base-port", str(base))
        try:
            assert services["gateway"][0] == f"127.0.0.1:{base}", "\n".join(lines)
            assert services["http"][0] == f"http://127.0.0.1:{base + HTTP_PORT_OFFSET}/v1", "\n".join(lines)
            with urllib.request.urlopen(services["http"][0] + "/models", timeout=10) as reply:
                assert reply.status == 200 and json.loads(reply.read())["data"]
        finally:
            proc.send_signal(signal.SIGINT)
            finish(proc)
    assert proc.returncode == 0


def test_a_taken_port_names_a_base_port_whose_ports_are_all_free(tmp_path):
    base = free_base_port()
    up = ["up", "--only", "tokenizer,lm,gateway", "--text-model", str(TEXT_FIXTURE), "--log-dir", str(tmp_path)]
    with hold(base + HTTP_PORT_OFFSET):
        line = assert_fails_in_one_line(muestra(*up, "--base-port", str(base), timeout=60))
        assert f"port {base + HTTP_PORT_OFFSET} (gateway HTTP API)" in line and "is taken" in line, line
        other = int(re.search(r"rerun with --base-port (\d+) ", line).group(1))
        assert other != base
        assert all(map(free_now, stack_ports(other))), line
        # An HTTP port given with --http-port does not move with --base-port: another --http-port is the way out.
        line = assert_fails_in_one_line(
            muestra(*up, "--base-port", str(base), "--http-port", str(base + HTTP_PORT_OFFSET), timeout=60)
        )
        assert "--base-port" not in line, line
        suggested = int(re.search(r"rerun with --http-port (\d+) ", line).group(1))
        assert suggested != base + HTTP_PORT_OFFSET and free_now(suggested), line

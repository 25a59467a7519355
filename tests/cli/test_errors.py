"""Every user error or interruption ends `muestra` with one line and a documented exit code, never a traceback."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time

import pytest

from muestra.cli.launch import free_port
from tests.cli.conftest import MUESTRA, TEXT_FIXTURE, assert_fails_in_one_line, muestra


@pytest.fixture(scope="module")
def own_gateway(text_stack):
    """A gateway of its own (over the shared llama tokenizer and lm), so that a test may pause it."""
    return text_stack("llama", "--max-queue", "200")


@pytest.mark.parametrize(
    "command",
    [["plugins"], ["models"], ["generate", "El cielo es"], ["tokenize", "El cielo"], ["chat"], ["image", "un siete"]],
)
def test_an_unreachable_gateway_is_one_line(command, tmp_path):
    address = f"127.0.0.1:{free_port()}"
    args = [*command, "--gateway", address]
    if command[0] == "image":
        args += ["-o", str(tmp_path / "out.png")]
    line = assert_fails_in_one_line(muestra(*args, timeout=60))
    assert "UNAVAILABLE" in line and address in line


def test_image_checks_the_output_folder_before_generating(tmp_path):
    # The gateway address is unreachable: had the command asked it first, the error would be UNAVAILABLE.
    missing = tmp_path / "no-such-folder" / "out.png"
    result = muestra("image", "un siete", "-o", str(missing), "--gateway", "127.0.0.1:9")
    line = assert_fails_in_one_line(result, exit_code=2)
    assert str(missing.parent) in line and "does not exist" in line


def test_ctrl_c_during_generate_cancels_the_request_and_exits_130(own_gateway):
    proc = subprocess.Popen(
        [*MUESTRA, "generate", "El cielo es", "--max-tokens", "400", "--ignore-eos", "--gateway",
         own_gateway.gateway.address],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    gateway_pid = own_gateway.gateway.proc.pid
    log = own_gateway.gateway.log_path
    cancelled_before = log.read_text().count("Generate CANCELLED")
    try:
        assert proc.stdout.read(1), "no text streamed"
        # Paused, the gateway cannot finish the request before the interrupt reaches the CLI.
        os.kill(gateway_pid, signal.SIGSTOP)
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=30)
    finally:
        os.kill(gateway_pid, signal.SIGCONT)
    stderr = stderr.decode()
    assert proc.returncode == 130, stderr
    assert "Traceback" not in stderr and "cancelled" in stderr

    # The gateway saw the cancellation and the lm holds no row for the request any more.
    def cancelled() -> int:
        return log.read_text().count("Generate CANCELLED") - cancelled_before

    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and not (cancelled() and own_gateway.lm_rows() == 0):
        time.sleep(0.1)
    assert cancelled() == 1
    assert own_gateway.lm_rows() == 0


def test_ctrl_c_while_reading_standard_input_exits_130():
    proc = subprocess.Popen(
        [*MUESTRA, "generate", "-", "--gateway", "127.0.0.1:9"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    time.sleep(1.5)  # importing grpc and the client, then blocking in read()
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=30)
    assert proc.returncode == 130 and "Traceback" not in stderr, stderr


def test_a_closed_pipe_ends_generate_quietly(own_gateway):
    proc = subprocess.Popen(
        [*MUESTRA, "generate", "El cielo es", "--max-tokens", "400", "--ignore-eos", "--gateway",
         own_gateway.gateway.address],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    assert proc.stdout.read(5)
    proc.stdout.close()  # as `| head -c 5` does
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 141, stderr
    assert stderr.decode().strip() == ""


def test_a_bad_sampler_parameter_is_the_gateways_one_line(own_gateway):
    line = assert_fails_in_one_line(
        muestra("generate", "El cielo", "--sampler", "top_k", "top_k=-3", "--gateway", own_gateway.gateway.address)
    )
    assert "INVALID_ARGUMENT" in line and "top_k" in line


def test_a_parameter_without_a_value_is_one_line():
    result = muestra("generate", "--sampler", "top_k", "El cielo", "--gateway", "127.0.0.1:9")
    assert "KEY=VALUE" in assert_fails_in_one_line(result, exit_code=2)


def _up_ports_free(base: int) -> bool:
    for port in (*range(base, base + 4), *range(base + 10, base + 14)):
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                return False
    return True


def test_up_with_a_taken_lm_port_is_one_line(tmp_path):
    base = next(port for port in range(free_port() % 20000 + 30000, 60000, 20) if _up_ports_free(port))
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", base + 2))  # the lm's port
        holder.listen()
        result = muestra(
            "up", "--base-port", str(base), "--http-port", str(free_port()), "--only", "tokenizer,lm",
            "--text-model", str(TEXT_FIXTURE), "--log-dir", str(tmp_path / "logs"), timeout=60,
        )  # fmt: skip
    line = assert_fails_in_one_line(result)
    assert f"port {base + 2} (lm)" in line and "taken" in line
    assert result.stdout == ""  # nothing was started, so nothing stops: that one line is all


def test_up_refuses_a_transformers_folder_and_names_export_lm(tiny_lm, tmp_path):
    hf_dir = tiny_lm("llama").hf_dir
    result = muestra(
        "up", "--base-port", "0", "--text-model", str(hf_dir), "--only", "tokenizer,lm,gateway",
        "--log-dir", str(tmp_path / "logs"), timeout=60,
    )  # fmt: skip
    line = assert_fails_in_one_line(result, exit_code=2)
    assert f"muestra export-lm {hf_dir} " in line
    assert "healthy" not in result.stdout and "serving on" not in result.stdout

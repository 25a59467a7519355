"""The HTTP server's life in the gateway process: its port, its limits, request ids, and SIGTERM."""

from __future__ import annotations

import http.client
import json
import re
import signal
import socket
import time

import openai
import pytest

from tests.fixtures.text_stack import start_gateway
from tests.harness import ServiceProcess

PROMPT = "The quick brown fox"
BODY_LIMIT = 2048


@pytest.fixture(scope="module")
def backends(text_stack):
    return text_stack("llama")


@pytest.fixture(scope="module")
def gateway(backends, tmp_path_factory) -> ServiceProcess:
    """A gateway of its own (the last test stops it) that picks a free HTTP port."""
    process = start_gateway(
        tmp_path_factory.mktemp("openai-server-logs"), backends.tokenizer.address, backends.lm.address,
        "--http-port", "0", "--http-max-body-bytes", str(BODY_LIMIT),
    )  # fmt: skip
    yield process
    process.stop()


def http_port(process: ServiceProcess) -> int:
    match = re.search(r"OpenAI-compatible HTTP API on http://127\.0\.0\.1:(\d+)/v1", process.log_path.read_text())
    assert match, process.log_tail()
    return int(match.group(1))


def test_http_port_zero_picks_a_free_port_and_logs_the_url(gateway):
    connection = http.client.HTTPConnection("127.0.0.1", http_port(gateway), timeout=30)
    connection.request("GET", "/health")
    response = connection.getresponse()
    assert (response.status, json.loads(response.read())) == (200, {"status": "ok"})


def test_a_taken_http_port_stops_the_gateway_with_a_clear_message(backends, tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(RuntimeError) as error:
            start_gateway(tmp_path, backends.tokenizer.address, backends.lm.address, "--http-port", str(port))
    assert f"cannot bind the HTTP API to 127.0.0.1:{port}" in str(error.value)


def test_a_chunked_body_over_the_limit_is_413(gateway):
    connection = http.client.HTTPConnection("127.0.0.1", http_port(gateway), timeout=30)
    chunks = [b'{"prompt": "', b"x" * BODY_LIMIT, b'"}']
    connection.request("POST", "/v1/completions", body=iter(chunks), encode_chunked=True)
    response = connection.getresponse()
    assert response.status == 413
    message = json.loads(response.read())["error"]["message"]
    assert message == f"the request body is over the limit of {BODY_LIMIT} bytes"


def test_the_request_id_is_echoed_and_on_the_log_line(gateway):
    connection = http.client.HTTPConnection("127.0.0.1", http_port(gateway), timeout=30)
    connection.request("GET", "/v1/models", headers={"X-Request-Id": "req-openai-42"})
    response = connection.getresponse()
    response.read()
    assert response.getheader("x-request-id") == "req-openai-42"
    deadline = time.monotonic() + 5
    while "[req-openai-42] muestra.requests: HTTP GET /v1/models 200" not in gateway.log_path.read_text():
        assert time.monotonic() < deadline, gateway.log_tail()
        time.sleep(0.05)


def test_a_request_id_that_grpc_could_not_carry_is_replaced(gateway):
    # It travels on to the tokenizer and the lm as a gRPC header: "é" there failed the call (a 500).
    connection = http.client.HTTPConnection("127.0.0.1", http_port(gateway), timeout=30)
    body = json.dumps({"model": "", "prompt": PROMPT, "max_tokens": 2})
    connection.putrequest("POST", "/v1/completions")
    connection.putheader("X-Request-Id", "é".encode())
    connection.putheader("Content-Type", "application/json")
    connection.putheader("Content-Length", str(len(body)))
    connection.endheaders(body.encode())
    response = connection.getresponse()
    assert response.status == 200, response.read()
    replaced = response.getheader("x-request-id")
    assert replaced and replaced.isascii() and len(replaced) == 16


def test_sigterm_lets_a_running_http_stream_finish_then_exits(gateway, backends):
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{http_port(gateway)}/v1", api_key="none", max_retries=0)
    stream = client.completions.create(
        model="", prompt=PROMPT, max_tokens=450, temperature=1.0, seed=4, stream=True,
        stream_options={"include_usage": True}, extra_body={"ignore_eos": True},
    )  # fmt: skip
    chunks = iter(stream)
    next(chunks)
    assert backends.lm_rows() >= 1  # still generating when the signal comes
    gateway.proc.send_signal(signal.SIGTERM)
    rest = list(chunks)
    assert rest[-1].usage.completion_tokens == 450
    assert gateway.proc.wait(30) == 0
    assert backends.lm_rows() == 0


def test_streams_still_running_when_the_grace_period_ends_get_an_error_event_and_done(backends, tmp_path):
    gateway = start_gateway(
        tmp_path, backends.tokenizer.address, backends.lm.address, "--http-port", "0", "--grace-period-s", "2"
    )
    try:
        port = http_port(gateway)
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        body = {"model": "", "prompt": PROMPT, "max_tokens": 400, "stream": True, "ignore_eos": True, "seed": 9}
        connection.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
        response = connection.getresponse()
        assert response.status == 200
        assert response.readline().startswith(b"data: {")
        # A stopped tokenizer holds the stream mid-way for longer than the grace period.
        backends.tokenizer.proc.send_signal(signal.SIGSTOP)
        try:
            started = time.monotonic()
            gateway.proc.send_signal(signal.SIGTERM)
            events = [line for line in response.read().decode().splitlines() if line.startswith("data: ")]
        finally:
            backends.tokenizer.proc.send_signal(signal.SIGCONT)
        assert time.monotonic() - started < 5
        assert events[-1] == "data: [DONE]"
        error = json.loads(events[-2].removeprefix("data: "))["error"]
        assert "the gateway is shutting down; retry with seed 9" in error["message"], error
        assert gateway.proc.wait(30) == 0
    finally:
        gateway.stop()
    deadline = time.monotonic() + 5
    while backends.lm_rows() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert backends.lm_rows() == 0

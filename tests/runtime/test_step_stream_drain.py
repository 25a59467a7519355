"""SIGTERM and the gateway's open step streams (lm BatchSteps, tokenizer DetokenizeSteps).

A gateway keeps one stream open to its lm and one to its tokenizer between steps. A draining
service must still serve the steps of the rows in flight, and must not wait out its whole grace
period for a stream left idle.
"""

from __future__ import annotations

import threading

from muestra.client import Client
from tests.fixtures.lm_service import start_lm
from tests.fixtures.text_stack import start_gateway
from tests.harness import ServiceProcess

GRACE = "120"  # far longer than any stop below may take


def _backends(tiny_lm, log_dir) -> tuple[ServiceProcess, ServiceProcess]:
    model = tiny_lm("llama").onnx_dir
    tokenizer = ServiceProcess("tokenizer", ["--models", str(model), "--grace-period-s", GRACE], log_dir)
    return tokenizer, start_lm(model, "llama", log_dir, "--grace-period-s", GRACE)


def test_services_with_an_idle_open_stream_stop_without_waiting_out_the_grace_period(tiny_lm, tmp_path):
    tokenizer, lm = _backends(tiny_lm, tmp_path)
    gateway = start_gateway(tmp_path, tokenizer.address, lm.address)
    try:
        with Client(gateway.address, timeout=60) as client:
            done = client.generate("open the streams", max_tokens=4, ignore_eos=True).wait()
        assert done.completions[0].completion_tokens == 4
        # The gateway is still up, its two streams open and idle. 30 s is a fraction of the grace period.
        assert tokenizer.stop(timeout_s=30) == 0
        assert lm.stop(timeout_s=30) == 0
        for service in (tokenizer, lm):
            assert "stopped" in service.log_tail()
    finally:
        gateway.stop()
        tokenizer.stop()
        lm.stop()


def test_a_draining_lm_keeps_serving_the_rows_in_flight_over_the_open_stream(tiny_lm, tmp_path):
    """Two requests in one batch; the shorter one ends during the drain, so the batch is filtered then too."""
    tokenizer, lm = _backends(tiny_lm, tmp_path)
    gateway = start_gateway(tmp_path, tokenizer.address, lm.address)
    lengths = (480, 300)
    results: dict[int, object] = {}
    streaming = [threading.Event() for _ in lengths]
    try:

        def run(i: int) -> None:
            with Client(gateway.address, timeout=120) as client:
                generation = client.generate(
                    f"drain the lm {i}", max_tokens=lengths[i], ignore_eos=True, temperature=1.0, seed=i
                )
                tokens = 0
                for delta in generation:
                    tokens += len(delta.token_ids)
                    if tokens >= 5:
                        streaming[i].set()  # decode steps are flowing over the open stream
                results[i] = generation

        threads = [threading.Thread(target=run, args=(i,)) for i in range(len(lengths))]
        for thread in threads:
            thread.start()
        assert all(event.wait(60) for event in streaming)
        assert lm.stop(timeout_s=60) == 0
        for thread in threads:
            thread.join(60)
        for i, length in enumerate(lengths):
            completion = results[i].completions[0]
            assert (completion.completion_tokens, completion.error) == (length, "")
        assert "stopping" in lm.log_tail()
    finally:
        gateway.stop()
        tokenizer.stop()
        lm.stop()

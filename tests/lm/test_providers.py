"""providers=auto on a machine without an NVIDIA driver: CPU, with no onnxruntime CUDA loading errors."""

from __future__ import annotations

import grpc
import onnxruntime as ort
import pytest

from muestra.lm.providers import nvidia_driver_present
from muestra.v1 import lm_pb2, lm_pb2_grpc
from tests.fixtures.lm_service import start_lm


@pytest.mark.skipif(nvidia_driver_present(), reason="this machine has an NVIDIA driver: auto may pick CUDA")
def test_auto_providers_without_a_driver_start_quietly_on_the_cpu(served_lm, tmp_path):
    lm = start_lm(served_lm("llama").onnx_dir, "llama", tmp_path, "--providers", "auto")
    try:
        with grpc.insecure_channel(lm.address) as channel:
            info = lm_pb2_grpc.LanguageModelStub(channel).Describe(lm_pb2.DescribeModelRequest(), timeout=10)
        log = lm.log_path.read_text(errors="replace")
    finally:
        lm.stop()
    assert list(info.providers) == ["CPUExecutionProvider"]
    assert "providers in use: CPUExecutionProvider" in log
    assert "Failed to load library" not in log and "libonnxruntime_providers_cuda" not in log
    if "CUDAExecutionProvider" in ort.get_available_providers():  # onnxruntime-gpu installed: it was skipped
        assert "no NVIDIA driver on this machine: not asking onnxruntime for CUDA" in log

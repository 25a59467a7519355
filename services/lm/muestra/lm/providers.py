"""Which onnxruntime execution providers the lm asks for: the `providers` setting, with auto's choice."""

from __future__ import annotations

import logging
from pathlib import Path

import onnxruntime as ort

from muestra.lm.model_folder import ModelFolderError

log = logging.getLogger("muestra.lm")

_PROVIDER_ALIASES = {
    "cpu": "CPUExecutionProvider",
    "cuda": "CUDAExecutionProvider",
    "tensorrt": "TensorrtExecutionProvider",
    "rocm": "ROCMExecutionProvider",
}
# Where an NVIDIA driver shows itself; without one, CUDA cannot start whatever libraries are installed.
_NVIDIA_DRIVER_PATHS = ("/dev/nvidiactl", "/proc/driver/nvidia/version")


def nvidia_driver_present() -> bool:
    return any(Path(path).exists() for path in _NVIDIA_DRIVER_PATHS)


def resolve_providers(requested: str) -> list[str]:
    """Turn the `providers` setting into onnxruntime provider names, in priority order."""
    available = ort.get_available_providers()
    if requested.strip().lower() == "auto":
        # onnxruntime-gpu lists CUDA wherever it is installed; asking it for CUDA on a machine with no
        # driver only prints its library-loading errors before falling back to the CPU.
        if "CUDAExecutionProvider" in available and not nvidia_driver_present():
            log.info("no NVIDIA driver on this machine: not asking onnxruntime for CUDA")
            available = [p for p in available if p != "CUDAExecutionProvider"]
        return [p for p in ("CUDAExecutionProvider", "CPUExecutionProvider") if p in available]
    names = [_PROVIDER_ALIASES.get(p.strip().lower(), p.strip()) for p in requested.split(",") if p.strip()]
    missing = [n for n in names if n not in available]
    if not names or missing:
        raise ModelFolderError(f"providers {requested!r}: {missing or 'none given'} not in {available}")
    return names

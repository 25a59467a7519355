#!/usr/bin/env bash
# The GPU check (issue 15): onnxruntime's CUDA provider and the diffusion service on CUDA, measured
# and compared with the CPU. Run from anywhere on a machine with an NVIDIA GPU:
#
#     bench/gpu_check.sh            # prints providers, lm tokens/s at batch 1/8/32, greedy and image checks
#
# It installs from the repository's own files into .venv-gpu (bench/requirements-gpu.txt; kept, so a
# second run starts at once) and runs bench/gpu_check.py. It exits 2, loudly, on a machine without
# an NVIDIA GPU: nothing here falls back to the CPU.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
    echo "gpu_check: FAIL: no NVIDIA GPU here (nvidia-smi is missing or lists none); this check never runs on CPU" >&2
    exit 2
fi
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader

VENV=${MUESTRA_GPU_VENV:-.venv-gpu}
if [ ! -f "$VENV/.installed" ] || [ bench/requirements-gpu.txt -nt "$VENV/.installed" ]; then
    test -x "$VENV/bin/python" || python3 -m venv "$VENV"
    "$VENV/bin/python" -m pip install -q --upgrade pip
    "$VENV/bin/python" -m pip install -q -r bench/requirements-gpu.txt
    touch "$VENV/.installed"
fi
# NVIDIA's wheels keep their libraries under site-packages/nvidia/*/lib.
NVIDIA_LIBS=$("$VENV/bin/python" -c 'import glob, sysconfig; print(":".join(glob.glob(sysconfig.get_paths()["purelib"] + "/nvidia/*/lib")))')
export LD_LIBRARY_PATH="${NVIDIA_LIBS}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export PYTHONUNBUFFERED=1
exec timeout 470 "$VENV/bin/python" -P bench/gpu_check.py "$@"

"""A folder that is not a supported diffusers pipeline stops start-up with a message naming it."""

from __future__ import annotations

import json
import os
import subprocess
import sys


def _start(*args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("MUESTRA_DIFFUSION_MODEL", "MUESTRA_MODEL")}
    return subprocess.run(
        [sys.executable, "-m", "muestra.diffusion", "--port", "0", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )


def test_a_folder_without_model_index_stops_start_up(tmp_path):
    result = _start("--model", str(tmp_path))
    assert result.returncode != 0
    assert f"--model {tmp_path}: no model_index.json" in result.stderr


def test_an_unsupported_pipeline_class_stops_start_up(tmp_path):
    (tmp_path / "model_index.json").write_text(json.dumps({"_class_name": "KandinskyPipeline"}))
    result = _start("--model", str(tmp_path))
    assert result.returncode != 0
    assert "pipeline 'KandinskyPipeline' is not supported; supported: StableDiffusionPipeline" in result.stderr


def test_no_model_stops_start_up_naming_the_flag_and_variable():
    result = _start()
    assert result.returncode != 0
    assert "--model is required (or MUESTRA_DIFFUSION_MODEL)" in result.stderr

"""Start-up: which folders the service serves under which names, and clear refusals of bad ones."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from muestra.tokenizer.loader import parse_models


def test_models_are_named_explicitly_or_after_their_folder():
    assert parse_models("chat=/m/llama, /m/tiny-text-fixture ,, other=rel/dir") == [
        ("chat", Path("/m/llama")),
        ("tiny-text-fixture", Path("/m/tiny-text-fixture")),
        ("other", Path("rel/dir")),
    ]


def test_a_name_used_twice_is_refused():
    with pytest.raises(ValueError, match="repeated: a"):
        parse_models("a=/x,/y/a")


def start(args: list[str], env: dict | None = None) -> subprocess.CompletedProcess:
    """Run the service's entry point, expecting it to refuse to start."""
    clean_env = {k: v for k, v in os.environ.items() if not k.startswith("MUESTRA_")}
    return subprocess.run(
        [sys.executable, "-m", "muestra.tokenizer", "--port", "0", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**clean_env, **(env or {})},
    )


def test_without_models_it_says_how_to_give_them():
    result = start([])
    assert result.returncode != 0
    assert "--models" in result.stderr and "MUESTRA_TOKENIZER_MODELS" in result.stderr


def test_a_missing_folder_is_named(tmp_path):
    result = start(["--models", str(tmp_path / "absent")])
    assert result.returncode != 0
    assert "absent: not a directory" in result.stderr and "Traceback" not in result.stderr


def test_a_folder_without_tokenizer_files_is_named(tmp_path):
    result = start(["--models", f"empty={tmp_path}"])
    assert result.returncode != 0
    assert "no tokenizer.json and no SentencePiece .model" in result.stderr


def test_a_broken_chat_template_stops_start_up(tokenizer_folders, tmp_path):
    folder = shutil.copytree(tokenizer_folders["bpe"], tmp_path / "broken")
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config["chat_template"] = "{% for m in messages %}{{ m.content }}"
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    result = start(["--models", str(folder)])
    assert result.returncode != 0
    assert "cannot load tokenizer 'broken'" in result.stderr
    assert "TemplateSyntaxError" in result.stderr and "endfor" in result.stderr

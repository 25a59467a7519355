"""The project's own soak and chaos runs, short, as a new user would start them: both must exit zero."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fixtures.default_model import default_model_or_skip

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow


def bench(module: str, args: list[str], tmp_path: Path, timeout_s: float) -> dict:
    report = tmp_path / "report.json"
    command = [sys.executable, "-m", module, *args, "--log-dir", str(tmp_path / "logs"), "--json", str(report)]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=timeout_s)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    return json.loads(report.read_text())


def test_a_short_soak_loses_hangs_and_garbles_nothing(tmp_path):
    # The tests' fixture, for speed; the default model's replays: the test below.
    args = ["--concurrency", "32", "--seconds", "60", "--text-model", str(ROOT / "models" / "tiny-text-fixture")]
    report = bench("bench.soak", args, tmp_path, timeout_s=600)
    assert report["failures"] == []
    assert report["by_status"].get("ok", 0) >= 300, report["by_status"]
    assert report["texts_checked"] >= 200 and report["replays"] >= 20
    assert set(report["by_status"]) <= {"ok", "cancelled"}, report["by_status"]


def test_a_short_chaos_run_survives_an_lm_kill_and_a_redis_kill(tmp_path):
    args = ["--faults", "lm_kill,redis_kill", "--concurrency", "16", "--settle-s", "5"]
    report = bench("bench.chaos", args, tmp_path, timeout_s=900)
    assert report["verdict"] == "PASS", report
    assert [f["fault"] for f in report["faults"]] == ["lm_kill", "redis_kill"]


@pytest.mark.parametrize("speculation", ["", "ngram"], ids=["plain", "speculation"])
def test_seeded_requests_give_the_same_tokens_under_load_as_alone_on_the_default_model(tmp_path, capsys, speculation):
    """32 seeded sampled requests at once (half at temperature 1.0, half with the model's own chain, bursting in
    the lm), then each alone: the same tokens; greedy ones too. Without the prefix cache, whose hits may adopt KV
    that other rows computed one position at a time (docs/architecture.md, "Determinism under load")."""
    model = default_model_or_skip()
    args = ["--requests", "32", "--greedy", "8", "--concurrency", "32", "--max-tokens", "48", "--no-prefix-cache"]
    args += ["--text-model", str(model)] + (["--speculation", speculation] if speculation else [])
    report = bench("bench.replays", args, tmp_path, timeout_s=900)
    assert report["greedy"] == {"requests": 8, "different": 0, "first_difference_median": None, "differing": []}
    assert report["sampled"] == {"requests": 32, "different": 0, "first_difference_median": None, "differing": []}
    with capsys.disabled():  # for the log of a CI run
        print(
            f"\nseeded replays under 32-way load on the default model{' with ' + speculation if speculation else ''}:"
            " 0 of 32 sampled and 0 of 8 greedy differ"
        )

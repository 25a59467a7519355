"""The project's own soak and chaos runs, short, as a new user would start them: both must exit zero."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow


def bench(module: str, args: list[str], tmp_path: Path, timeout_s: float) -> dict:
    report = tmp_path / "report.json"
    command = [sys.executable, "-m", module, *args, "--log-dir", str(tmp_path / "logs"), "--json", str(report)]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=timeout_s)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    return json.loads(report.read_text())


def test_a_short_soak_loses_hangs_and_garbles_nothing(tmp_path):
    report = bench("bench.soak", ["--concurrency", "32", "--seconds", "60"], tmp_path, timeout_s=600)
    assert report["failures"] == []
    assert report["by_status"].get("ok", 0) >= 300, report["by_status"]
    assert report["texts_checked"] >= 200 and report["replays"] >= 20
    assert set(report["by_status"]) <= {"ok", "cancelled"}, report["by_status"]


def test_a_short_chaos_run_survives_an_lm_kill_and_a_redis_kill(tmp_path):
    args = ["--faults", "lm_kill,redis_kill", "--concurrency", "16", "--settle-s", "5"]
    report = bench("bench.chaos", args, tmp_path, timeout_s=900)
    assert report["verdict"] == "PASS", report
    assert [f["fault"] for f in report["faults"]] == ["lm_kill", "redis_kill"]


def test_seeded_replays_report_their_differences_and_greedy_ones_never_differ(tmp_path, capsys):
    args = ["--requests", "40", "--greedy", "16", "--concurrency", "16", "--max-tokens", "24"]
    report = bench("bench.replays", args, tmp_path, timeout_s=600)
    assert report["greedy"] == {"requests": 16, "different": 0, "first_difference_median": None, "differing": []}
    sampled = report["sampled"]
    assert sampled["requests"] == 40 and len(sampled["differing"]) == sampled["different"]
    assert all(set(d) == {"seed", "at", "under_load", "alone", "cached_tokens"} for d in sampled["differing"])
    with capsys.disabled():  # the figure docs/architecture.md quotes, for the log of a CI run
        print(f"\nseeded sampled replays that differ under 16-way load: {report['sampled']['different']} of 40")

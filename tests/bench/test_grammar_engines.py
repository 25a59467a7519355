"""bench/grammar_engines.py measures llguidance on the text fixture's tokenizer and prints a table of positive figures
(tiny mode, seconds; the xgrammar side needs its own venv and never runs in CI)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from tokenizers import Tokenizer

ROOT = Path(__file__).resolve().parents[2]
FIXTURE = ROOT / "models" / "tiny-text-fixture"
FIGURES = ["compile ms p50 / p95", "first walk ms p50", "mask µs p50 / p95", "advance µs p50 / p95"]


@pytest.fixture(scope="module")
def bench_run(tmp_path_factory) -> tuple[str, list[dict]]:
    figures = tmp_path_factory.mktemp("grammar-engines") / "figures.json"
    command = [sys.executable, "bench/grammar_engines.py", "--engines", "llguidance"]
    command += ["--tokenizers", FIXTURE.name, "--tiny", "--json", str(figures)]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    return done.stdout, json.loads(figures.read_text())


def markdown_rows(text: str) -> list[dict[str, str]]:
    """The rows of the first markdown table in text, keyed by its header."""
    lines = [line for line in text.split("\n\n")[0].splitlines() if line.startswith("|")]
    header, *rows = [[cell.strip() for cell in line.strip("|").split("|")] for line in lines]
    return [dict(zip(header, row, strict=True)) for row in rows if not set(row[0]) <= {"-"}]


def test_the_table_has_a_row_per_grammar_with_positive_times(bench_run):
    rows = markdown_rows(bench_run[0])
    assert [(r["tokenizer"], r["engine"], r["grammar"]) for r in rows] == [
        (FIXTURE.name, "llguidance", "json_schema"),
        (FIXTURE.name, "llguidance", "regex"),
        (FIXTURE.name, "llguidance", "lark"),
    ]
    for row in rows:
        for column in FIGURES:
            assert all(float(value) > 0 for value in row[column].split(" / ")), (column, row)
        assert int(row["steps"]) > 10
        assert 0 <= float(row["forced"].rstrip("%")) <= 100


def test_the_schema_forces_its_keys_and_the_p95_is_not_below_the_median(bench_run):
    (result,) = bench_run[1]
    vocab_size = Tokenizer.from_file(str(FIXTURE / "tokenizer.json")).get_vocab_size()
    assert result["engine"] == "llguidance" and result["vocab_size"] == vocab_size
    rows = {row["grammar"]: row for row in result["rows"]}
    assert rows["json_schema"]["forced_share"] > 0.2  # keys, quotes and separators are fixed
    for row in rows.values():
        for figure in ("compile_ms", "mask_ms", "advance_ms"):
            median, p95 = row[figure]
            assert 0 < median <= p95

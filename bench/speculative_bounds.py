"""How far drafts could go on bench/speculative.py's prompts: the same runs with proposers that know the answer.

    .venv/bin/python bench/speculative_bounds.py [--rounds 2] [--tokens 128] [--json out.json]

First every text runs without drafts (greedy, and sampled at temperature 0.7, seeds as in the bench, at 1
stream); those outputs are the answers. Then a second stack, whose gateway also loads bench/oracle_proposer.py,
runs each text in these modes, back to back, each mode first in turn:
- off, and ngram (the gateway's default proposer, as in bench/speculative.py);
- "any proposer": drafts of the true continuation at every step, all accepted: no proposer drafting up to
  max_draft_tokens (16) can do better on this stack;
- "lookup, n=1" and "lookup, n=6": the ngram lookup after a match of at least 1 (or 6, the default) tokens,
  cut to its right part, and only where at least one token of it is right: prompt lookup with a perfect judge
  of when and how long to draft.
Every output is compared with its twin (off). The gap between ngram and the lookup bounds is what a better
policy could still win; the gap between those and "any proposer" needs better guesses than the text's own.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:] = [str(ROOT), *(p for p in sys.path if Path(p or ".").resolve() != ROOT / "bench")]

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import tempfile  # noqa: E402

from bench.speculative import PROPOSER, Stack, cpu_name, prompt_sets  # noqa: E402
from muestra.client.types import build_tokenize_request  # noqa: E402


def oracle(table: int, ngram: int = 0) -> dict:
    return {"proposer": "bench_oracle", "params": {"adaptive": False, "table": table, "ngram": ngram}}


def plugin_dir(root: Path) -> Path:
    """A folder whose dist-info publishes bench/oracle_proposer.py under muestra's entry points."""
    info = root / "muestra_bench_oracle-0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: muestra-bench-oracle\nVersion: 0\n")
    (info / "entry_points.txt").write_text("[muestra]\nbench_oracle = bench.oracle_proposer\n")
    return root


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    sets = prompt_sets()
    work = Path(tempfile.mkdtemp(prefix="bench-speculative-bounds-"))
    # The answers: per sampling mode, every text's prompt ids followed by its output without drafts.
    answers: list[list[list[int]]] = [[], []]
    (work / "logs-answers").mkdir()
    (work / "logs").mkdir()
    stack = Stack(work / "logs-answers", 0)
    try:
        for texts in sets.values():
            for i, text in enumerate(texts):
                prompt = list(stack.stub.Tokenize(build_tokenize_request(text, None, "", None), timeout=60).ids)
                for table, sampled in enumerate((False, True)):
                    answers[table].append(prompt + stack.generate(text, args.tokens, 100 + i, sampled, "off")["ids"])
    finally:
        stack.close()
    path = work / "answers.json"
    path.write_text(json.dumps(answers))
    os.environ["MUESTRA_BENCH_ORACLE"] = str(path)
    os.environ["PYTHONPATH"] = os.pathsep.join(
        [str(ROOT), str(plugin_dir(work / "plugin")), *filter(None, [os.environ.get("PYTHONPATH")])]
    )
    stack = Stack(work / "logs", 0)
    rows = []
    try:
        stack.generate(sets["grounded"][0], 32, 1, False, "off")  # warm-up
        for kind, texts in sets.items():
            for table, sampled in enumerate((False, True)):
                modes = {
                    "off": "off",
                    "ngram": PROPOSER,
                    "any proposer": oracle(table),
                    "lookup, n=1": oracle(table, 1),
                    "lookup, n=6": oracle(table, 6),
                }
                totals = {name: [0, 0.0, 0, 0] for name in modes}
                twins = {name: 0 for name in modes}
                for index in range(args.rounds):
                    names = list(modes)
                    order = names[index % len(names) :] + names[: index % len(names)]
                    for i, text in enumerate(texts):
                        runs = {
                            name: stack.generate(text, args.tokens, 100 + i, sampled, modes[name]) for name in order
                        }
                        for name, run in runs.items():
                            total = totals[name]
                            total[0] += run["tokens"] - 1
                            total[1] += run["decode_s"]
                            total[2] += run["drafted"]
                            total[3] += run["accepted"]
                            twins[name] += run["ids"] == runs["off"]["ids"]
                off = totals["off"][0] / totals["off"][1]
                for name, (tokens, seconds, drafted, accepted) in totals.items():
                    row = {
                        "set": kind,
                        "mode": "sampled" if sampled else "greedy",
                        "proposer": name,
                        "tokens_per_s": tokens / seconds,
                        "ratio": tokens / seconds / off,
                        "acceptance": accepted / drafted if drafted else 0.0,
                        "identical": f"{twins[name]}/{args.rounds * len(texts)}",
                    }
                    rows.append(row)
                    print(
                        f"{kind:9} {row['mode']:8} {name:13} {row['tokens_per_s']:6.1f} tok/s {row['ratio']:.2f}x "
                        f"acceptance {row['acceptance']:.0%} identical {row['identical']}",
                        flush=True,
                    )
    finally:
        stack.close()
    if args.json:
        args.json.write_text(json.dumps({"machine": cpu_name(), "tokens": args.tokens, "rows": rows}, indent=2))


if __name__ == "__main__":
    main()

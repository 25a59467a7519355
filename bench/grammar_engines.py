"""Choose the grammar engine by measurement: llguidance against xgrammar, on three tokenizers.

    .venv/bin/python bench/grammar_engines.py                     # both engines, three tokenizers
    .venv/bin/python bench/grammar_engines.py --engines llguidance --tokenizers tiny-text-fixture --tiny

xgrammar imports torch (and wants transformers and triton), which the gateway must never import, so
it has its own venv, and the bench runs each engine in a subprocess of its venv:

    python -m venv .venv-xgrammar && .venv-xgrammar/bin/pip install -r bench/requirements-xgrammar.txt

Tokenizers: the tiny text fixture's 4,096-token byte-level BPE; a 32,000-token Llama-2-style BPE
(metaspace, byte fallback; bench/llama_cpp.py's, with the byte tokens as plain vocabulary as in Llama
2's own tokenizer.json); a 50,257-token GPT-2-style byte-level BPE. The last two are trained on
CPython's standard library once and cached in bench/decode_models.py's cache folder.

Per engine, tokenizer and grammar (a JSON Schema of eleven fields, a regex, a small Lark grammar):
- compile: from the grammar's text to a matcher in its start state (llguidance: the grammar's
  conversion and LLMatcher; xgrammar: GrammarCompiler with its cache off, one thread), and the
  first mask of a new matcher after it;
- mask and advance: the time to fill one row's numpy bitmask and to advance by one token, at every
  step of a walk through a valid document (each step takes the longest allowed token that the
  document continues with, and the last takes EOS);
- forced: the share of the document's tokens the engine forces (llguidance compute_ff_tokens,
  xgrammar find_jump_forward_tokens), taken without sampling in a second walk.
Each figure is over --repeats runs after one warm-up, timed with perf_counter_ns; every thread
count the engines expose is 1.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# bench/tokenize.py would shadow the standard library's tokenize; the repository root takes bench/'s place.
sys.path[:] = [str(ROOT), *(p for p in sys.path if Path(p or ".").resolve() != ROOT / "bench")]

import argparse  # noqa: E402
import hashlib  # noqa: E402
import importlib  # noqa: E402
import importlib.metadata  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import re  # noqa: E402
import subprocess  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402

VENVS = {"llguidance": ROOT / ".venv", "xgrammar": ROOT / ".venv-xgrammar"}
TOKENIZERS = {  # name: (tokenizer vocabulary size, EOS token)
    "tiny-text-fixture": (4096, "<|eos|>"),
    "llama-32k": (32000, "</s>"),
    "gpt2-50k": (50257, "<|endoftext|>"),
}
THREAD_ENV = {"RAYON_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "0"}

SCHEMA = {
    "type": "object",
    "properties": {
        "id": {"type": "integer", "minimum": 1, "maximum": 1_000_000},
        "name": {"type": "string", "minLength": 1, "maxLength": 40},
        "email": {"type": "string", "pattern": "^[a-z0-9._]{1,20}@[a-z0-9-]{1,20}\\.(com|org|net|es)$"},
        "plan": {"enum": ["free", "pro", "enterprise"]},
        "balance": {"type": "number", "minimum": -10000, "maximum": 10000},
        "active": {"type": "boolean"},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 16}, "minItems": 1, "maxItems": 5},
        "address": {
            "type": "object",
            "properties": {
                "street": {"type": "string", "maxLength": 40},
                "city": {"type": "string", "maxLength": 24},
                "postal_code": {"type": "string", "pattern": "^[0-9]{5}$"},
                "country": {"enum": ["ES", "MX", "AR", "CO", "CL"]},
            },
            "required": ["street", "city", "postal_code", "country"],
            "additionalProperties": False,
        },
        "orders": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "sku": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{4}$"},
                    "quantity": {"type": "integer", "minimum": 1, "maximum": 99},
                },
                "required": ["sku", "quantity"],
                "additionalProperties": False,
            },
            "maxItems": 3,
        },
        "nickname": {"type": "string", "maxLength": 20},
        "notes": {"type": "string", "maxLength": 80},
    },
    "required": ["id", "name", "email", "plan", "balance", "active", "tags", "address"],
    "additionalProperties": False,
}
DOCUMENT = {  # in the schema's order (both engines keep it), "nickname" left out
    "id": 48213,
    "name": "Lucía Romero Ñúñez",
    "email": "lucia.romero@correo.es",
    "plan": "pro",
    "balance": 1234.5,
    "active": True,
    "tags": ["vip", "newsletter"],
    "address": {"street": "Calle Larios 12", "city": "Málaga", "postal_code": "29005", "country": "ES"},
    "orders": [{"sku": "ABC-1234", "quantity": 2}, {"sku": "XYZ-0042", "quantity": 1}],
    "notes": "Prefers delivery in the morning.",
}
REGEX = (
    r"[A-Z][a-z]+ [A-Z][a-z]+ <[a-z0-9._]{1,20}@[a-z0-9-]{1,20}\.(com|org|net|es)>, "
    r"(\+34 )?[6-9][0-9]{2} [0-9]{3} [0-9]{3}"
)
LARK = r"""
start: expr
expr: term ((" + " | " - ") term)*
term: factor ((" * " | " / ") factor)*
factor: NUMBER | NAME | NAME "(" expr (", " expr)* ")" | "(" expr ")"
NUMBER: /[0-9]+(\.[0-9]+)?/
NAME: /[a-z_][a-z0-9_]*/
"""
GRAMMARS = {  # name: (kind, source, a document of its language)
    "json_schema": ("json_schema", json.dumps(SCHEMA), json.dumps(DOCUMENT, ensure_ascii=False)),
    "regex": ("regex", REGEX, "Lucia Romero <lucia.romero@correo.es>, +34 612 345 678"),
    "lark": ("lark", LARK, "max(price * 1.21, 10) - (discount + 2.5) / qty + round(total / 3, 2)"),
}


# ---------------------------------------------------------------- engines (run in their own venv)


class Llguidance:
    """llguidance as the gateway uses it: an LLMatcher per grammar, a deep copy of it per row."""

    def __init__(self, tokenizer_json: str, eos: int) -> None:
        import llguidance
        import llguidance.numpy

        self.llg = llguidance
        self.tokenizer = llguidance.LLTokenizer(tokenizer_json, eos_token=eos)
        self.vocab_size = self.tokenizer.vocab_size
        self.token_bytes = [self.tokenizer.decode_bytes([i]) for i in range(self.vocab_size)]
        self.version = importlib.metadata.version("llguidance")

    def compile(self, kind: str, source: str):
        matcher_from = self.llg.LLMatcher
        if kind == "json_schema":  # the gateway's options: no free whitespace, ", " and ": "
            options = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
            grammar = matcher_from.grammar_from_json_schema(source, defaults=options)
        elif kind == "regex":
            grammar = matcher_from.grammar_from_regex(source)
        else:
            grammar = matcher_from.grammar_from_lark(source)
        matcher = matcher_from(self.tokenizer, grammar, log_level=0)
        if matcher.is_error():
            raise RuntimeError(f"llguidance: {matcher.get_error()}")
        return matcher

    def new_matcher(self, compiled):
        return compiled.deep_copy()  # as the gateway gives each row its own state

    def fill(self, matcher, mask: np.ndarray) -> None:
        self.llg.numpy.fill_next_token_bitmask(matcher, mask)

    def advance(self, matcher, token: int) -> bool:
        return matcher.consume_token(token)

    def forced(self, matcher) -> list[int]:
        return matcher.compute_ff_tokens()


class Xgrammar:
    """xgrammar as vLLM and SGLang use it: a CompiledGrammar per grammar, a GrammarMatcher per row."""

    def __init__(self, tokenizer_json: str, eos: int) -> None:
        import torch
        import xgrammar
        from tokenizers import Tokenizer
        from transformers import PreTrainedTokenizerFast

        torch.set_num_threads(1)
        self.xgr = xgrammar
        hf = PreTrainedTokenizerFast(tokenizer_object=Tokenizer.from_str(tokenizer_json))
        self.info = xgrammar.TokenizerInfo.from_huggingface(hf, stop_token_ids=[eos])
        self.vocab_size = self.info.vocab_size
        self.token_bytes = list(self.info.decoded_vocab)
        self.version = importlib.metadata.version("xgrammar")

    def compile(self, kind: str, source: str):
        compiler = self.xgr.GrammarCompiler(self.info, max_threads=1, cache_enabled=False)
        if kind == "json_schema":
            return compiler.compile_json_schema(source, any_whitespace=False, separators=(", ", ": "))
        if kind == "regex":
            return compiler.compile_regex(source)
        return compiler.compile_lark(source)

    def new_matcher(self, compiled):
        return self.xgr.GrammarMatcher(compiled)

    def fill(self, matcher, mask: np.ndarray) -> None:
        matcher.fill_next_token_bitmask(mask)

    def advance(self, matcher, token: int) -> bool:
        return matcher.accept_token(token)

    def forced(self, matcher) -> list[int]:
        return matcher.find_jump_forward_tokens()


ENGINES = {"llguidance": Llguidance, "xgrammar": Xgrammar}


def allowed(mask: np.ndarray, token: int) -> bool:
    return bool((int(mask[0, token >> 5]) >> (token & 31)) & 1)


class Walker:
    """Steps through a document: the longest allowed token it continues with, then EOS."""

    def __init__(self, engine, eos: int, specials: set[int]) -> None:
        self.engine, self.eos = engine, eos
        self.by_bytes: dict[bytes, list[int]] = {}
        for token, data in enumerate(engine.token_bytes):
            if data and token not in specials:
                self.by_bytes.setdefault(data, []).append(token)
        self.longest = max(map(len, self.by_bytes))
        self.mask = np.zeros((1, (engine.vocab_size + 31) // 32), dtype=np.int32)

    def next_token(self, rest: bytes) -> int:
        if not rest:
            if not allowed(self.mask, self.eos):
                raise RuntimeError("the document is whole but the engine does not allow EOS")
            return self.eos
        for n in range(min(self.longest, len(rest)), 0, -1):
            for token in self.by_bytes.get(rest[:n], ()):
                if allowed(self.mask, token):
                    return token
        raise RuntimeError(f"the engine allows no token that continues the document at {rest[:20]!r}")

    def timed_walk(self, compiled, document: bytes) -> tuple[list[int], list[int]]:
        """Per step: the ns to fill the mask, and to advance by the chosen token."""
        engine, matcher, rest = self.engine, self.engine.new_matcher(compiled), document
        masks, advances = [], []
        while True:
            started = time.perf_counter_ns()
            engine.fill(matcher, self.mask)
            masks.append(time.perf_counter_ns() - started)
            token = self.next_token(rest)
            started = time.perf_counter_ns()
            ok = engine.advance(matcher, token)
            advances.append(time.perf_counter_ns() - started)
            if not ok:
                raise RuntimeError(f"the engine refused token {token} it had allowed")
            if token == self.eos:
                return masks, advances
            rest = rest[len(engine.token_bytes[token]) :]

    def forced_walk(self, compiled, document: bytes) -> tuple[int, int]:
        """How many of the document's tokens the engine forces, of how many in all."""
        engine, matcher, rest = self.engine, self.engine.new_matcher(compiled), document
        forced = total = 0
        while rest:
            tokens = engine.forced(matcher)
            text = b"".join(engine.token_bytes[t] for t in tokens)
            if tokens and rest.startswith(text):
                forced += len(tokens)
            else:
                engine.fill(matcher, self.mask)
                tokens = [self.next_token(rest)]
            for token in tokens:
                if not engine.advance(matcher, token):
                    raise RuntimeError(f"the engine refused token {token} it had forced or allowed")
            total += len(tokens)
            rest = rest[len(b"".join(engine.token_bytes[t] for t in tokens)) :]
        return forced, total


def percentiles_ms(ns: list[int]) -> tuple[float, float]:
    return float(np.percentile(ns, 50)) / 1e6, float(np.percentile(ns, 95)) / 1e6


def measure(engine_name: str, tokenizer_file: Path, eos_token: str, repeats: int) -> dict:
    """Every figure for one engine and tokenizer (runs in the engine's venv)."""
    tokenizer_json = tokenizer_file.read_text()
    added = json.loads(tokenizer_json)["added_tokens"]
    specials = {t["id"] for t in added if t["special"]}
    eos = next(t["id"] for t in added if t["content"] == eos_token)
    started = time.perf_counter_ns()
    importlib.import_module(engine_name)  # xgrammar's imports torch
    imported_at = time.perf_counter_ns()
    engine = ENGINES[engine_name](tokenizer_json, eos)
    load_ms = (time.perf_counter_ns() - imported_at) / 1e6
    import_ms = (imported_at - started) / 1e6
    walker = Walker(engine, eos, specials)
    rows = []
    for grammar, (kind, source, document) in GRAMMARS.items():
        # Compiles are lazy in part (llguidance builds its lexer as masks ask for it), so the first walk
        # of a document right after a compile counts apart from the walks that follow it.
        compiles, first_walks = [], []
        for i in range(repeats + 1):
            started = time.perf_counter_ns()
            compiled = engine.compile(kind, source)
            compiled_at = time.perf_counter_ns()
            step_masks, step_advances = walker.timed_walk(compiled, document.encode())
            if i:  # the first is the warm-up
                compiles.append(compiled_at - started)
                first_walks.append(sum(step_masks) + sum(step_advances))
        masks, advances = [], []
        for _ in range(repeats):
            step_masks, step_advances = walker.timed_walk(compiled, document.encode())
            masks += step_masks
            advances += step_advances
        forced, total = walker.forced_walk(compiled, document.encode())
        rows.append(
            {
                "grammar": grammar,
                "compile_ms": percentiles_ms(compiles),
                "first_walk_ms": percentiles_ms(first_walks),
                "mask_ms": percentiles_ms(masks),
                "advance_ms": percentiles_ms(advances),
                "steps": len(step_masks),
                "forced_share": forced / total,
            }
        )
    return {
        "engine": engine_name,
        "version": engine.version,
        "vocab_size": engine.vocab_size,
        "import_ms": import_ms,
        "load_ms": load_ms,
        "rows": rows,
    }


# ---------------------------------------------------------------- tokenizers and the table (main venv)


def tokenizer_file(name: str) -> Path:
    """The tokenizer.json of `name`, trained once and cached (the tiny text fixture's is in the repository)."""
    vocab_size, eos = TOKENIZERS[name]
    if name == "tiny-text-fixture":
        return ROOT / "models" / "tiny-text-fixture" / "tokenizer.json"
    import tokenizers

    recipe = f"{name} {sys.version} tokenizers {tokenizers.__version__} v1"
    out = cache_folder() / f"{name}-{hashlib.sha256(recipe.encode()).hexdigest()[:12]}" / "tokenizer.json"
    if not out.is_file():
        data = train_llama(vocab_size) if name == "llama-32k" else train_gpt2(vocab_size, eos)
        out.parent.mkdir(parents=True, exist_ok=True)
        staging = out.with_suffix(".tmp")
        staging.write_text(json.dumps(data, ensure_ascii=False))
        staging.replace(out)
    return out


def cache_folder() -> Path:
    from bench import decode_models

    return decode_models.CACHE / "grammar-engines"


def train_llama(vocab_size: int) -> dict:
    """bench/llama_cpp.py's Llama-2-style tokenizer, its <0xXX> byte tokens made plain vocabulary.

    Trained as special tokens, they are also listed as special added tokens, which engines take as
    control tokens that match no text; in Llama 2's tokenizer.json they are only in the vocabulary."""
    import tempfile

    from bench.llama_cpp import llama_tokenizer

    with tempfile.TemporaryDirectory() as scratch:
        llama_tokenizer(Path(scratch), vocab_size)
        data = json.loads((Path(scratch) / "tokenizer.json").read_text())
    data["added_tokens"] = [t for t in data["added_tokens"] if not re.fullmatch(r"<0x[0-9A-F]{2}>", t["content"])]
    return data


def train_gpt2(vocab_size: int, eos: str) -> dict:
    """A GPT-2-style byte-level BPE (GPT-2's pre-tokenizer regex, EOS last), trained on CPython's stdlib."""
    import sysconfig

    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    stdlib = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(p for p in stdlib.rglob("*.py") if "site-packages" not in p.parts)
    texts = (p.read_text(encoding="utf-8", errors="replace") for p in files)
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size - 1,
        min_frequency=2,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)
    tokenizer.add_special_tokens([eos])
    if tokenizer.get_vocab_size() != vocab_size:
        raise RuntimeError(f"the stdlib gave {tokenizer.get_vocab_size()} tokens, not {vocab_size}")
    return json.loads(tokenizer.to_str())


def run_worker(engine: str, tokenizer: Path, eos: str, repeats: int) -> dict:
    python = VENVS[engine] / "bin" / "python"
    if not python.is_file():
        raise SystemExit(
            f"{engine} needs {python.parent.parent.name}: python -m venv {python.parent.parent.name} && "
            f"{python.parent.parent.name}/bin/pip install -r bench/requirements-xgrammar.txt"
        )
    command = [str(python), __file__, "--worker", engine, "--tokenizer-file", str(tokenizer), "--eos", eos]
    command += ["--repeats", str(repeats)]
    done = subprocess.run(command, capture_output=True, text=True, env={**os.environ, **THREAD_ENV}, check=False)
    if done.returncode:
        raise SystemExit(f"{engine} on {tokenizer}: exit {done.returncode}\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.splitlines()[-1])


HEADER = (
    "| tokenizer | engine | grammar | compile ms p50 / p95 | first walk ms p50 | mask µs p50 / p95 "
    "| advance µs p50 / p95 | steps | forced |"
)


def table(results: list[dict]) -> str:
    lines = [HEADER, "|" + "---|" * (HEADER.count("|") - 1)]
    for result in results:
        for row in result["rows"]:
            compile_ms, mask_us, advance_us = row["compile_ms"], row["mask_ms"], row["advance_ms"]
            lines.append(
                f"| {result['tokenizer']} | {result['engine']} | {row['grammar']} "
                f"| {compile_ms[0]:.2f} / {compile_ms[1]:.2f} | {row['first_walk_ms'][0]:.2f} "
                f"| {1000 * mask_us[0]:.1f} / {1000 * mask_us[1]:.1f} "
                f"| {1000 * advance_us[0]:.1f} / {1000 * advance_us[1]:.1f} "
                f"| {row['steps']} | {100 * row['forced_share']:.0f}% |"
            )
    lines += ["", "| tokenizer | engine | vocabulary | import ms | tokenizer load ms |", "|---|---|---|---|---|"]
    for result in results:
        engine = f"{result['engine']} {result['version']}"
        figures = f"{result['vocab_size']} | {result['import_ms']:.0f} | {result['load_ms']:.0f}"
        lines.append(f"| {result['tokenizer']} | {engine} | {figures} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engines", nargs="+", choices=list(ENGINES), default=list(ENGINES))
    parser.add_argument("--tokenizers", nargs="+", choices=list(TOKENIZERS), default=list(TOKENIZERS))
    parser.add_argument("--repeats", type=int, default=10, help="timed runs of each figure, after one warm-up")
    parser.add_argument("--tiny", action="store_true", help="one timed run (a smoke test, not a measurement)")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    parser.add_argument("--worker", choices=list(ENGINES), help=argparse.SUPPRESS)
    parser.add_argument("--tokenizer-file", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--eos", help=argparse.SUPPRESS)
    args = parser.parse_args()
    repeats = 1 if args.tiny else args.repeats
    if args.worker:
        print(json.dumps(measure(args.worker, args.tokenizer_file, args.eos, repeats)))
        return
    results = []
    for name in args.tokenizers:
        path = tokenizer_file(name)
        for engine in args.engines:
            result = run_worker(engine, path, TOKENIZERS[name][1], repeats)
            results.append({"tokenizer": name, **result})
    print(table(results))
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()

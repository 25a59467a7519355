"""The default text model's training corpus: English prose that ships with CPython (PSF License Version 2).

Documents, in a fixed order:
- every help topic of `pydoc_data/topics.py` (the reference manual text behind `help()`), one document each;
- per standard-library module, its docstrings and comment blocks in source order (`ast` and `tokenize`),
  one document per file.

Nothing is downloaded. The same Python version gives the same corpus (CORPUS_PYTHON names the one the
committed model was trained on; `corpus_sha256()` says whether this one matches). A deterministic ~5% of the
corpus, whole module documents picked in the order of a hash of their path, is held out for evaluation; the help
topics always train.
"""

from __future__ import annotations

import ast
import hashlib
import io
import pydoc_data.topics
import re
import sysconfig
import tokenize
from dataclasses import dataclass
from pathlib import Path

CORPUS_PYTHON = "3.11.7"
# Left out: the top-level test suite (1.8 MB of mostly scaffolding comments), the generated codec tables of
# encodings/ (character maps, not prose), the build configuration, and two test packages of their own.
EXCLUDED_TOP_LEVEL = ("test", "encodings", "idlelib/idle_test", "lib2to3/tests", "tkinter/test", "config-")
HELD_OUT_FRACTION = 0.05
_RULER = re.compile(r"^[\W_]*$")  # comment lines of only punctuation: rulers, separators, empty '#'
_PRAGMA = re.compile(r"^(!|-\*-|\s*(fmt|type|noqa|pragma|pylint|XXX)\b:?)")


@dataclass(frozen=True)
class Document:
    name: str  # "topics/<topic>" or the module's path under the stdlib, e.g. "asyncio/tasks.py"
    text: str


def stdlib_dir() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def topic_documents() -> list[Document]:
    topics = pydoc_data.topics.topics
    return [Document(f"topics/{name}", topics[name].strip()) for name in sorted(topics)]


def module_files(lib: Path) -> list[Path]:
    """The standard library's .py files, sorted by path, without tests, codec tables and site-packages."""
    files = []
    for path in lib.rglob("*.py"):
        rel = path.relative_to(lib).as_posix()
        if "site-packages/" in rel or any(rel.startswith(prefix) for prefix in EXCLUDED_TOP_LEVEL):
            continue
        files.append((rel, path))
    return [path for _, path in sorted(files)]


def prose_of_module(source: str) -> str:
    """Docstrings and comment blocks of one module, in source order, separated by blank lines."""
    pieces: list[tuple[int, str]] = []
    tree = ast.parse(source)
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            doc = ast.get_docstring(node, clean=True)
            if doc and doc.strip():
                line = node.body[0].lineno if node.body else 0
                pieces.append((line, doc.strip()))
    block: list[str] = []
    block_line = 0
    last_line = -2
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type != tokenize.COMMENT:
            continue
        text = tok.string[1:].strip()
        if _RULER.match(text) or _PRAGMA.match(text):
            continue
        line = tok.start[0]
        if block and line != last_line + 1:
            pieces.append((block_line, "\n".join(block)))
            block = []
        if not block:
            block_line = line
        block.append(text)
        last_line = line
    if block:
        pieces.append((block_line, "\n".join(block)))
    pieces.sort(key=lambda piece: piece[0])
    return "\n\n".join(text for _, text in pieces)


def module_documents(lib: Path | None = None) -> list[Document]:
    lib = lib or stdlib_dir()
    documents = []
    for path in module_files(lib):
        try:
            text = prose_of_module(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError, tokenize.TokenError):
            continue  # a few stdlib files are deliberately not Python 3 (lib2to3 fixtures, bad-syntax samples)
        if text:
            documents.append(Document(path.relative_to(lib).as_posix(), text))
    return documents


def documents() -> list[Document]:
    """The whole corpus in its fixed order: help topics, then modules."""
    return topic_documents() + module_documents()


def split(docs: list[Document] | None = None) -> tuple[list[Document], list[Document]]:
    """(train, held_out): module documents in sha256(path) order go to held_out until it has 5% of the bytes."""
    docs = docs if docs is not None else documents()
    budget = HELD_OUT_FRACTION * sum(len(d.text.encode()) for d in docs)
    modules = sorted(
        (d for d in docs if not d.name.startswith("topics/")), key=lambda d: hashlib.sha256(d.name.encode()).digest()
    )
    held: set[str] = set()
    size = 0
    for doc in modules:
        if size >= budget:
            break
        held.add(doc.name)
        size += len(doc.text.encode())
    return [d for d in docs if d.name not in held], [d for d in docs if d.name in held]


def corpus_sha256(docs: list[Document] | None = None) -> str:
    digest = hashlib.sha256()
    for doc in docs if docs is not None else documents():
        digest.update(doc.name.encode() + b"\0" + doc.text.encode() + b"\0")
    return digest.hexdigest()

"""`muestra export-lm` on a damaged GGUF file: truncated in its header, metadata, tensor table or tensor data, or
with garbage or an impossible length in it, it is refused with exit 1 and one line that names the file, the part
and the byte, in our words (issue 48: numpy's "cannot reshape array..." used to follow). The damaged files are cut
from the default model's GGUF; handmade ones check each impossible entry the layout walk refuses."""

from __future__ import annotations

import os
import random
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from muestra.lm.export.__main__ import main
from muestra.lm.export.errors import ExportError
from muestra.lm.export.gguf_layout import check_layout
from tests.fixtures.default_model import SOURCE_GGUF, default_model_or_skip

NOT_OURS = ("Traceback", "IndexError", "ValueError", "numpy", "reshape", "dtype")


def _copy(path: Path, size: int | None = None, patch: tuple[int, bytes] | None = None) -> Path:
    with SOURCE_GGUF.open("rb") as source, path.open("wb") as copy:
        shutil.copyfileobj(source, copy) if size is None else copy.write(source.read(size))
    if patch is not None:
        with path.open("r+b") as copy:
            copy.seek(patch[0])
            copy.write(patch[1])
    return path


@pytest.fixture(scope="module")
def damaged(tmp_path_factory) -> dict[str, tuple[Path, str]]:
    """name -> (file, words its refusal says), cut or spoiled where the intact file's parts are."""
    default_model_or_skip()
    import gguf

    reader = gguf.GGUFReader(SOURCE_GGUF)
    tokens = reader.fields["tokenizer.ggml.tokens"].offset
    tenth_tensor = reader.tensors[10].field.offset
    size = SOURCE_GGUF.stat().st_size
    root = tmp_path_factory.mktemp("damaged-gguf")
    garbage = root / "garbage.gguf"
    garbage.write_bytes(b"GGUF" + random.Random(0).randbytes(4096))
    key_length = len("tokenizer.ggml.tokens")
    return {
        "header": (_copy(root / "header.gguf", 12), "is truncated: its header needs 24 bytes, the file has 12"),
        "metadata": (_copy(root / "metadata.gguf", tokens + 1000), "inside its metadata (key "),
        "tensor table": (_copy(root / "table.gguf", tenth_tensor + 5), "inside its tensor table (tensor 11 of "),
        "tensor data": (_copy(root / "data.gguf", reader.data_offset + 1000), "inside its tensor data (tensor "),
        "last byte": (_copy(root / "last.gguf", size - 1), f"the file ends at byte {size - 1}, inside its tensor data"),
        "garbage": (garbage, "is corrupt: GGUF version"),
        # The vocabulary's array length (after its key, its type and the items' type) made impossible.
        "impossible length": (
            _copy(root / "length.gguf", tokens + 100_000, patch=(tokens + 8 + key_length + 4 + 4, b"\xff" * 8)),
            "is corrupt: an array of 18446744073709551615 items, in its metadata (key ",
        ),
    }


@pytest.mark.parametrize(
    "part", ["header", "metadata", "tensor table", "tensor data", "last byte", "garbage", "impossible length"]
)
def test_a_damaged_gguf_is_refused_in_one_line_naming_the_part(damaged, part, capsys, tmp_path):
    path, words = damaged[part]
    out = tmp_path / "out"
    assert main([str(path), str(out), "--quiet"], prog="muestra export-lm") == 1
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"muestra export-lm: error: {path} "), lines
    assert words in lines[0], lines[0]
    assert not any(word in lines[0] for word in NOT_OURS), lines[0]
    assert not out.exists()


def test_the_muestra_command_exits_1_with_that_line(damaged, tmp_path):
    path, words = damaged["tensor data"]
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    command = [sys.executable, "-m", "muestra.cli", "export-lm", str(path), str(tmp_path / "out")]
    result = subprocess.run(command, capture_output=True, text=True, timeout=120, env=env)
    assert result.returncode == 1, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"muestra export-lm: error: {path} "), lines
    assert words in result.stderr and not any(word in result.stderr for word in NOT_OURS), result.stderr


def _handmade(keys: bytes = b"", key_count: int = 0, tensors: bytes = b"", tensor_count: int = 0) -> bytes:
    return b"GGUF" + struct.pack("<IQQ", 3, tensor_count, key_count) + keys + tensors


def _key(name: bytes, kind: int, value: bytes) -> bytes:
    return struct.pack("<Q", len(name)) + name + struct.pack("<I", kind) + value


def _tensor(name: bytes, shape: list[int], kind: int) -> bytes:
    dims = struct.pack(f"<I{len(shape)}Q", len(shape), *shape)
    return struct.pack("<Q", len(name)) + name + dims + struct.pack("<IQ", kind, 0)


NESTED = _key(b"x.nested", 9, struct.pack("<IQ", 9, 1) * 12)


@pytest.mark.parametrize(
    "data, words",
    [
        (b"", "is empty"),
        (_handmade(NESTED, 1), "metadata key 'x.nested' nests arrays over 8 deep (at byte 24)"),
        (_handmade(_key(b"general.alignment", 10, struct.pack("<Q", 64)), 1), "general.alignment has value type 10"),
        (_handmade(_key(b"general.alignment", 4, struct.pack("<I", 48)), 1), "general.alignment is 48, not a power"),
        (_handmade(_key(b"general.name", 13, b"x"), 1), "metadata key 'general.name' has value type 13, not a GGUF"),
        (_handmade(_key(b"a", 4, b"\0" * 4) * 2, 2), "metadata key 2 of 2 ('a') is a repeat"),
        (_handmade(tensors=_tensor(b"w", [2, 2, 2, 2, 2], 0), tensor_count=1), "tensor 'w' has 5 dimensions"),
        (_handmade(tensors=_tensor(b"w", [32], 99), tensor_count=1), "tensor 'w' has type 99, which is not a ggml"),
        (_handmade(tensors=_tensor(b"w", [33], 2), tensor_count=1), "tensor 'w' has 33 values, not whole blocks of 32"),
    ],
)
def test_impossible_metadata_and_tensor_entries_are_corrupt_naming_them(tmp_path, data, words):
    path = tmp_path / "handmade.gguf"
    path.write_bytes(data)
    with pytest.raises(ExportError) as refused:
        check_layout(path)
    assert words in str(refused.value) and str(refused.value).startswith(f"{path} is "), refused.value


def test_a_whole_handmade_gguf_passes_and_one_byte_less_is_truncated_in_its_data(tmp_path):
    head = _handmade(_key(b"general.name", 8, struct.pack("<Q", 2) + b"ok"), 1, _tensor(b"w", [32], 0), 1)
    whole = head + b"\0" * ((-len(head)) % 32) + b"\0" * 128  # 32 float32 values, aligned to 32
    path = tmp_path / "whole.gguf"
    path.write_bytes(whole)
    check_layout(path)
    path.write_bytes(whole[:-1])
    with pytest.raises(ExportError, match=f"ends at byte {len(whole) - 1}, inside its tensor data .tensor 'w'"):
        check_layout(path)

"""A GGUF file's layout, walked before anything else reads it: header, metadata, tensor table, tensor data.

The gguf package maps a truncated or corrupt file into numpy views and fails there, in numpy's words
("cannot reshape array of size 503360 into shape (576,960)"). Walked here first, the first part of the file
that is missing or impossible is refused in one line that names the part and the byte where it broke.
The layout is the GGUF spec's (ggml's docs/gguf.md), versions 2 and 3, as the gguf package reads it.
"""

from __future__ import annotations

import mmap
import struct
from pathlib import Path

from muestra.lm.export.errors import ExportError

VERSIONS = (2, 3)
HEADER_BYTES = 24  # magic, version, tensor count, metadata key count
MAX_DIMS = 4  # ggml's GGML_MAX_DIMS
DEFAULT_ALIGNMENT = 32
# Metadata value types (gguf.GGUFValueType) and the bytes of one value; 8 is a string, 9 an array.
VALUE_BYTES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
UINT32, STRING, ARRAY = 4, 8, 9
# A length or count past this is garbage, not a file cut short (which reads as truncated, whatever it lacks).
IMPOSSIBLE = 1 << 40
MAX_NESTING = 8  # arrays of arrays: real files nest one or two deep


class _Ended(Exception):
    """The file ended inside what was being read; or, with `impossible`, a length no file could hold."""

    def __init__(self, impossible: str = "") -> None:
        super().__init__(impossible)
        self.impossible = impossible


def check_layout(path: Path) -> None:
    """Refuse, with ExportError, a file that is not a whole GGUF file: what is wrong, and where."""
    size = path.stat().st_size
    if size == 0:
        raise ExportError(f"{path} is empty, not a GGUF file")
    from gguf import GGML_QUANT_SIZES  # the export extra's, as in gguf_file.py

    blocks = {int(kind): sizes for kind, sizes in GGML_QUANT_SIZES.items()}
    with path.open("rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
        _Walk(path, data, blocks).check()


def _shown(name: bytes) -> str:
    text = name.decode("utf-8", errors="replace")
    return repr(text if len(text) <= 60 else text[:57] + "...")


class _Walk:
    def __init__(self, path: Path, data: mmap.mmap, blocks: dict[int, tuple[int, int]]) -> None:
        self.path = path
        self.data = data
        self.blocks = blocks  # ggml type -> (values per block, bytes per block)
        self.size = len(data)
        self.pos = 0
        self.order = "<"

    def check(self) -> None:
        if self.data[:4] != b"GGUF"[: min(4, self.size)]:
            raise ExportError(f"{self.path} is not a GGUF file (its first bytes are not 'GGUF')")
        if self.size < HEADER_BYTES:
            raise ExportError(
                f"{self.path} is truncated: its header needs {HEADER_BYTES} bytes, the file has {self.size}"
            )
        self.pos = 4
        version = self.u32()
        if version & 0xFFFF == 0:  # written on a machine of the other byte order (the gguf package reads those)
            self.order = ">"
            version = struct.unpack_from(">I", self.data, 4)[0]
        if version not in VERSIONS:
            raise ExportError(f"{self.path} is corrupt: GGUF version {version} in its header (readable: 2 and 3)")
        tensor_count, key_count = self.u64(), self.u64()
        alignment = self.metadata(key_count)
        tensors = self.tensor_table(tensor_count)
        self.tensor_data(tensors, self.pos + (-self.pos) % alignment)

    def metadata(self, count: int) -> int:
        """Walks the metadata keys; the data alignment they set."""
        alignment = DEFAULT_ALIGNMENT
        keys: set[bytes] = set()
        for index in range(count):
            where, key = self.pos, b""
            try:
                key = self.string()
                kind = self.u32()
                if key == b"general.alignment":
                    if kind != UINT32:
                        raise self.corrupt(f"general.alignment has value type {kind}, not uint32", where)
                    alignment = self.u32()
                    if alignment == 0 or alignment & (alignment - 1):
                        raise self.corrupt(f"general.alignment is {alignment}, not a power of two", where)
                else:
                    self.value(kind, key, where)
            except _Ended as ended:
                named = f" {_shown(key)}" if key else ""
                raise self.ended(ended, "its metadata", f"key {index + 1} of {count}{named}", where) from None
            if key in keys or not _is_utf8(key):
                raise self.corrupt(
                    f"metadata key {index + 1} of {count} ({_shown(key)}) is a repeat or not UTF-8", where
                )
            keys.add(key)
        return alignment

    def tensor_table(self, count: int) -> list[tuple[bytes, int, int]]:
        """Walks the tensor table: (name, offset in the data, bytes) of each tensor."""
        tensors = []
        names: set[bytes] = set()
        for index in range(count):
            where, name = self.pos, b""
            try:
                name = self.string()
                dims = self.u32()
                if dims > MAX_DIMS:
                    raise self.corrupt(f"tensor {_shown(name)} has {dims} dimensions (at most {MAX_DIMS})", where)
                shape = [self.u64() for _ in range(dims)]
                kind, offset = self.u32(), self.u64()
            except _Ended as ended:
                named = f" {_shown(name)}" if name else ""
                raise self.ended(ended, "its tensor table", f"tensor {index + 1} of {count}{named}", where) from None
            if name in names or not _is_utf8(name):
                raise self.corrupt(f"tensor {index + 1} of {count} ({_shown(name)}) is a repeat or not UTF-8", where)
            names.add(name)
            if kind not in self.blocks:
                raise self.corrupt(f"tensor {_shown(name)} has type {kind}, which is not a ggml type", where)
            block, block_bytes = self.blocks[kind]
            elements = 1
            for dim in shape:
                elements *= dim
            if elements % block:
                raise self.corrupt(f"tensor {_shown(name)} has {elements} values, not whole blocks of {block}", where)
            tensors.append((name, offset, elements // block * block_bytes))
        return tensors

    def tensor_data(self, tensors: list[tuple[bytes, int, int]], start: int) -> None:
        short = sorted(
            (start + offset + size, name) for name, offset, size in tensors if start + offset + size > self.size
        )
        if short:
            (first_end, first), last_end = short[0], short[-1][0]
            raise ExportError(
                f"{self.path} is truncated: the file ends at byte {self.size}, inside its tensor data (tensor "
                f"{_shown(first)} ends at byte {first_end}, the last at byte {last_end})"
            )

    def value(self, kind: int, key: bytes, where: int, depth: int = 0) -> None:
        if kind in VALUE_BYTES:
            self.skip(VALUE_BYTES[kind])
        elif kind == STRING:
            self.string()
        elif kind == ARRAY:
            if depth == MAX_NESTING:
                raise self.corrupt(f"metadata key {_shown(key)} nests arrays over {MAX_NESTING} deep", where)
            item, count = self.u32(), self.u64()
            if count >= IMPOSSIBLE:
                raise _Ended(f"an array of {count} items")
            if item in VALUE_BYTES:
                self.skip(count * VALUE_BYTES[item])
            elif item in (STRING, ARRAY):
                for _ in range(count):
                    self.value(item, key, where, depth + 1)
            else:
                raise self.corrupt(f"metadata key {_shown(key)} is an array of type {item}, not a GGUF type", where)
        else:
            raise self.corrupt(f"metadata key {_shown(key)} has value type {kind}, not a GGUF type", where)

    def u32(self) -> int:
        return self.unpack("I")

    def u64(self) -> int:
        return self.unpack("Q")

    def unpack(self, kind: str) -> int:
        size = struct.calcsize(kind)
        if self.pos + size > self.size:
            raise _Ended
        self.pos += size
        return struct.unpack_from(self.order + kind, self.data, self.pos - size)[0]

    def string(self) -> bytes:
        length = self.u64()
        if length >= IMPOSSIBLE:
            raise _Ended(f"a string of {length} bytes")
        self.skip(length)
        return self.data[self.pos - length : self.pos]

    def skip(self, count: int) -> None:
        if self.pos + count > self.size:
            raise _Ended
        self.pos += count

    def ended(self, ended: _Ended, part: str, item: str, where: int) -> ExportError:
        if ended.impossible:
            return ExportError(f"{self.path} is corrupt: {ended.impossible}, in {part} ({item}, from byte {where})")
        return ExportError(
            f"{self.path} is truncated: the file ends at byte {self.size}, inside {part} ({item}, from byte {where})"
        )

    def corrupt(self, what: str, where: int) -> ExportError:
        return ExportError(f"{self.path} is corrupt: {what} (at byte {where})")


def _is_utf8(name: bytes) -> bool:
    try:
        name.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True

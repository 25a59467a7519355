"""The infotext's sampler under A1111's name ("Sampler: euler_a" as "Sampler: Euler a"): written into the text and
the PNG's "parameters" chunk (the pixels are not decoded), and read back from either name by png-info."""

from __future__ import annotations

import re
import struct
import zlib

from muestra.gateway.http.a1111.convert import display_name
from muestra.v1 import diffusion_pb2

SAMPLER = re.compile(r"(^|, )Sampler: ([^,]*)")
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
KEYWORD = b"parameters\0"


def a1111_names(schedulers: list[diffusion_pb2.SchedulerInfo]) -> dict[str, str]:
    """Every name and alias of each scheduler, lowercased, to its A1111 name."""
    return {name.lower(): display_name(info) for info in schedulers for name in (info.name, *info.aliases)}


def renamed(text: str, names: dict[str, str]) -> str:
    """The infotext with the Sampler of its last line under its A1111 name."""
    head, newline, last = text.rpartition("\n")
    last = SAMPLER.sub(lambda m: f"{m[1]}Sampler: {names.get(m[2].lower(), m[2])}", last, count=1)
    return head + newline + last


def renamed_image(image: diffusion_pb2.GeneratedImage, names: dict[str, str]) -> diffusion_pb2.GeneratedImage:
    """The image with its parameters text and PNG chunk renamed as renamed() does."""
    parameters = renamed(image.parameters, names)
    if parameters == image.parameters:
        return image
    out = diffusion_pb2.GeneratedImage()
    out.CopyFrom(image)
    out.parameters, out.png = parameters, with_parameters(image.png, parameters)
    return out


def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def with_parameters(png: bytes, text: str) -> bytes:
    """The PNG with its "parameters" text chunk holding `text`: tEXt when Latin-1, else iTXt (as Pillow writes)."""
    if not png.startswith(PNG_SIGNATURE):
        return png
    try:
        chunk = _chunk(b"tEXt", KEYWORD + text.encode("latin-1"))
    except UnicodeEncodeError:
        chunk = _chunk(b"iTXt", KEYWORD + b"\0\0\0\0" + text.encode())
    parts, pos = [PNG_SIGNATURE], len(PNG_SIGNATURE)
    while pos + 8 <= len(png):
        (length,) = struct.unpack(">I", png[pos : pos + 4])
        kind, end = png[pos + 4 : pos + 8], pos + 12 + length
        if kind in (b"tEXt", b"iTXt", b"zTXt") and png[pos + 8 : pos + 8 + len(KEYWORD)] == KEYWORD:
            parts.append(chunk)
        else:
            parts.append(png[pos:end])
        pos = end
    return b"".join(parts)

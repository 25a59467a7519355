"""Hypothesis strategies for hostile protobuf requests, and a raw gRPC caller that sends any bytes.

`messages(cls, hints)` fills any subset of a message's fields (recursively) with edge values: the
limits of each integer type and one past them, NaN and infinities, empty and huge strings, control
characters, unknown enum numbers, huge repeated fields, Structs of hostile JSON. `hints` maps field
names to strategies of plausible values (known sampler names, real token ids), so that examples also
get past the first checks. `wire(message)` then may add what a protobuf object cannot hold: invalid
UTF-8 in a string field, unknown fields, a truncated message, random bytes.
"""

from __future__ import annotations

import asyncio
import dataclasses
import math

import grpc
from google.protobuf import struct_pb2
from google.protobuf.descriptor import FieldDescriptor
from hypothesis import strategies as st

F = FieldDescriptor
INT_RANGES = {
    F.TYPE_INT32: (-(2**31), 2**31 - 1),
    F.TYPE_SINT32: (-(2**31), 2**31 - 1),
    F.TYPE_SFIXED32: (-(2**31), 2**31 - 1),
    F.TYPE_ENUM: (-(2**31), 2**31 - 1),
    F.TYPE_INT64: (-(2**63), 2**63 - 1),
    F.TYPE_SINT64: (-(2**63), 2**63 - 1),
    F.TYPE_SFIXED64: (-(2**63), 2**63 - 1),
    F.TYPE_UINT32: (0, 2**32 - 1),
    F.TYPE_FIXED32: (0, 2**32 - 1),
    F.TYPE_UINT64: (0, 2**64 - 1),
    F.TYPE_FIXED64: (0, 2**64 - 1),
}
HUGE_REPEATED = 100_000
HUGE_STRING = 1_000_000


def integers(field_type: int) -> st.SearchStrategy[int]:
    low, high = INT_RANGES[field_type]
    edges = [low, high, 0, 1, 2, 3, -1, 7, 255, 256, 4095, 4096, 65535, 2**31 - 1, 2**31, 2**32 - 1, 2**53 + 1]
    edges = [e for e in edges if low <= e <= high]
    return st.one_of(st.sampled_from(edges), st.integers(min_value=max(low, -1000), max_value=min(high, 1000)),
                     st.integers(min_value=low, max_value=high))  # fmt: skip


def floats(width: int) -> st.SearchStrategy[float]:
    edges = [math.nan, math.inf, -math.inf, 0.0, -0.0, 1e-45, 1e38, -1e38, 0.5, 1.0, 2.0, -1.0, 100.0]
    if width == 64:
        edges += [1e308, -1e308, 5e-324]
    return st.one_of(st.sampled_from(edges), st.floats(width=width), st.floats(min_value=-5, max_value=5))


def texts() -> st.SearchStrategy[str]:
    return st.one_of(
        st.text(max_size=40),
        st.text(st.characters(codec="utf-8", categories=("Cc", "Cf", "Zs", "Co")), max_size=20),
        st.sampled_from(["", " ", "\x00", "a" * 5000, "🙂" * 300, "<|eos|>", "\ufeff", "\u202e", "%s%n{0}"]),
        st.just("x" * HUGE_STRING),
    )


def json_values() -> st.SearchStrategy:
    leaves = st.one_of(
        st.none(), st.booleans(), floats(64), st.integers(-(2**60), 2**60), texts(),
    )  # fmt: skip
    return st.recursive(
        leaves, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
        max_leaves=12,
    )  # fmt: skip


def structs(hint: st.SearchStrategy | None = None) -> st.SearchStrategy[struct_pb2.Struct]:
    keys = st.text(max_size=16) if hint is None else st.one_of(hint, st.text(max_size=16))

    def build(values: dict) -> struct_pb2.Struct:
        struct = struct_pb2.Struct()
        struct.update(values)
        return struct

    return st.dictionaries(keys, json_values(), max_size=5).map(build)


def scalar(field: FieldDescriptor) -> st.SearchStrategy:
    if field.type in INT_RANGES:
        return integers(field.type)
    if field.type == F.TYPE_BOOL:
        return st.booleans()
    if field.type == F.TYPE_FLOAT:
        return floats(32)
    if field.type == F.TYPE_DOUBLE:
        return floats(64)
    if field.type == F.TYPE_STRING:
        return texts()
    if field.type == F.TYPE_BYTES:
        return st.one_of(st.binary(max_size=64), st.just(b"\x00" * HUGE_STRING))
    raise TypeError(f"no strategy for field type {field.type} ({field.full_name})")


def messages(cls, hints: dict[str, st.SearchStrategy] | None = None, depth: int = 0) -> st.SearchStrategy:
    """Instances of the protobuf class `cls` with any subset of their fields set to hostile values."""
    hints = hints or {}
    if cls is struct_pb2.Struct:
        return structs(hints.get("struct_keys"))

    @st.composite
    def build(draw):
        message = cls()
        for field in cls.DESCRIPTOR.fields:
            if draw(st.integers(0, 2)) == 0:  # a third of the fields stay unset
                continue
            repeated = field.is_repeated
            hint = hints.get(f"{cls.DESCRIPTOR.name}.{field.name}")
            if hint is None and field.type != F.TYPE_MESSAGE:
                hint = hints.get(field.name)  # plain names hint scalar fields of any message
            if field.type == F.TYPE_MESSAGE:
                child = messages(field.message_type._concrete_class, hints, depth + 1)
                if hint is not None:
                    child = st.one_of(hint, child)
                if depth >= 3:
                    continue
                if repeated:
                    getattr(message, field.name).extend(draw(st.lists(child, max_size=3)))
                else:
                    getattr(message, field.name).CopyFrom(draw(child))
                continue
            values = scalar(field) if hint is None else st.one_of(hint, hint, scalar(field))
            if repeated:
                if hint is not None and draw(st.booleans()):
                    items = draw(st.lists(hint, max_size=8))  # a list a real client could send
                elif draw(st.integers(0, 15)) == 0:
                    item = draw(values)
                    if isinstance(item, (str, bytes)):
                        item = item[:8]  # a huge list, not a huge message: 100,000 of them
                    items = [item] * HUGE_REPEATED
                else:
                    items = draw(st.lists(values, max_size=8))
                getattr(message, field.name).extend(items)
            else:
                setattr(message, field.name, draw(values))
        return message

    return build()


# -- the wire ---------------------------------------------------------------------------------------


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _length_delimited(number: int, payload: bytes) -> bytes:
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


INVALID_UTF8 = [b"\xff", b"\xc3\x28", b"\xed\xa0\x80", b"a\x80b", b"\xf4\x90\x80\x80"]


def wire(cls) -> st.SearchStrategy[tuple[str, bytes]]:
    """(how, bytes) for a request of type `cls`: its serialization, or that made invalid in one of several ways."""
    string_fields = [f.number for f in cls.DESCRIPTOR.fields if f.type == F.TYPE_STRING]

    @st.composite
    def build(draw, message):
        data = message.SerializeToString()
        how = draw(st.sampled_from(["valid"] * 6 + ["invalid utf-8", "unknown field", "truncated", "random bytes"]))
        if how == "invalid utf-8" and string_fields:
            data += _length_delimited(draw(st.sampled_from(string_fields)), draw(st.sampled_from(INVALID_UTF8)))
        elif how == "unknown field":
            data += _varint(draw(st.integers(1000, 2**29 - 1)) << 3 | 0) + _varint(draw(st.integers(0, 2**63)))
        elif how == "truncated" and len(data) > 1:
            data = data[: draw(st.integers(1, len(data) - 1))]
        elif how == "random bytes":
            data = draw(st.binary(min_size=1, max_size=64))
        else:
            how = "valid"
        return how, data

    return build


@dataclasses.dataclass
class Reply:
    """What one raw call got: its status code name (or HANG), its response messages, the error details."""

    code: str
    responses: list[bytes]
    details: str = ""


async def call(channel: grpc.aio.Channel, method: str, kind: str, requests: list[bytes], timeout: float) -> Reply:
    """Send `requests` (raw bytes) to `method` of kind unary_unary, unary_stream or stream_stream."""
    identity = {"request_serializer": None, "response_deserializer": None}
    responses: list[bytes] = []
    try:
        if kind == "unary_unary":
            responses.append(await channel.unary_unary(method, **identity)(requests[0], timeout=timeout))
        elif kind == "unary_stream":
            async for response in channel.unary_stream(method, **identity)(requests[0], timeout=timeout):
                responses.append(response)
        else:
            stream = channel.stream_stream(method, **identity)(timeout=timeout)
            try:
                for request in requests:
                    await stream.write(request)
                await stream.done_writing()
            except (grpc.aio.AioRpcError, asyncio.InvalidStateError):
                # The service ended the call before it read them all (it refused an earlier one):
                # grpc's client then reports its own "Internal error from Core", not the service's status
                # (through a channel with interceptors, on done_writing too).
                return Reply("ENDED_EARLY", responses)
            try:
                while (response := await stream.read()) is not grpc.aio.EOF:
                    responses.append(response)
            except grpc.aio.AioRpcError as exc:
                if len(requests) > 1 and exc.details() == "Internal error from Core":
                    return Reply("ENDED_EARLY", responses)  # the same, noticed by the read
                raise
    except grpc.aio.AioRpcError as exc:
        code = "HANG" if exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED else exc.code().name
        return Reply(code, responses, exc.details() or "")
    except asyncio.TimeoutError:
        return Reply("HANG", responses)
    return Reply("OK", responses)

"""Declared sampler parameters: one declaration gives both the JSON Schema and the validation.

    parameters = {"top_p": Float(1.0, "Probability mass to keep.", gt=0.0, le=1.0)}

Values arrive from a protobuf Struct, so every number is a float: Int accepts 40.0 and
rejects 40.5. Errors are SamplerParamError naming the sampler and the field.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from collections.abc import Callable, Mapping
from typing import Any


class SamplerParamError(ValueError):
    """A sampler parameter is missing, of the wrong type or outside its limits."""

    def __init__(self, sampler: str, field: str, message: str) -> None:
        super().__init__(f"{sampler}.{field}: {message}")
        self.sampler = sampler
        self.field = field
        self.message = message


@dataclasses.dataclass(frozen=True)
class Param:
    """One parameter: its JSON Schema and how to turn a raw value into a checked one."""

    default: Any
    help: str
    schema: dict
    parse: Callable[[Any], Any]  # raises ValueError(message) for a bad value

    def json_schema(self) -> dict:
        return {**self.schema, "default": self.default, "description": self.help}


def _bounds_text(gt, ge, lt, le) -> str:
    if (gt is not None or ge is not None) and (lt is not None or le is not None):
        low = f"({gt:g}" if gt is not None else f"[{ge:g}"
        high = f"{lt:g})" if lt is not None else f"{le:g}]"
        return f"must be in {low}, {high}"
    parts = [f"> {gt:g}" if gt is not None else "", f">= {ge:g}" if ge is not None else ""]
    parts += [f"< {lt:g}" if lt is not None else "", f"<= {le:g}" if le is not None else ""]
    return "must be " + " and ".join(p for p in parts if p)


def _number_schema(kind: str, gt, ge, lt, le) -> dict:
    schema: dict = {"type": kind}
    for key, value in (("exclusiveMinimum", gt), ("minimum", ge), ("exclusiveMaximum", lt), ("maximum", le)):
        if value is not None:
            schema[key] = value
    return schema


def _check_bounds(value, gt, ge, lt, le) -> None:
    ok = (
        (gt is None or value > gt)
        and (ge is None or value >= ge)
        and (lt is None or value < lt)
        and (le is None or value <= le)
    )
    if not ok:
        raise ValueError(f"{_bounds_text(gt, ge, lt, le)}, got {value:g}")


def _as_number(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"must be a number, got {value!r}")
    if not math.isfinite(value):
        raise ValueError(f"must be a finite number, got {value}")
    return value


def Float(default: float | None, help: str, *, gt=None, ge=None, lt=None, le=None) -> Param:
    """A finite number, optionally bounded (gt/ge below, lt/le above)."""

    def parse(value: Any) -> float:
        number = float(_as_number(value))
        _check_bounds(number, gt, ge, lt, le)
        return number

    return Param(default, help, _number_schema("number", gt, ge, lt, le), parse)


def Int(default: int | None, help: str, *, ge=None, le=None) -> Param:
    """An integer (an integral float such as 40.0 counts), optionally bounded."""

    def parse(value: Any) -> int:
        number = _as_number(value)
        if number != int(number):
            raise ValueError(f"must be an integer, got {value}")
        _check_bounds(int(number), None, ge, None, le)
        return int(number)

    return Param(default, help, _number_schema("integer", None, ge, None, le), parse)


def Bool(default: bool | None, help: str) -> Param:
    def parse(value: Any) -> bool:
        if not isinstance(value, bool):
            raise ValueError(f"must be true or false, got {value!r}")
        return value

    return Param(default, help, {"type": "boolean"}, parse)


def String(default: str | None, help: str, *, max_length: int = 1 << 20) -> Param:
    """A string of at most max_length characters."""

    def parse(value: Any) -> str:
        if not isinstance(value, str):
            raise ValueError(f"must be a string, got {type(value).__name__}")
        if len(value) > max_length:
            raise ValueError(f"is {len(value)} characters; the limit is {max_length}")
        return value

    return Param(default, help, {"type": "string", "maxLength": max_length}, parse)


def StringList(default: list[str] | None, help: str, *, min_items: int = 0, max_items: int = 1024) -> Param:
    """A list of strings, min_items to max_items long."""

    def parse(value: Any) -> list[str]:
        if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
            raise ValueError("must be a list of strings")
        if not min_items <= len(value) <= max_items:
            raise ValueError(f"must hold {min_items} to {max_items} strings, got {len(value)}")
        return list(value)

    schema = {"type": "array", "items": {"type": "string"}, "minItems": min_items, "maxItems": max_items}
    return Param(default, help, schema, parse)


def Object(default: dict | None, help: str) -> Param:
    """A JSON object, passed on as it is (its own consumer checks its contents)."""

    def parse(value: Any) -> dict:
        if not isinstance(value, Mapping):
            raise ValueError(f"must be an object, got {type(value).__name__}")
        return dict(value)

    return Param(default, help, {"type": "object"}, parse)


REQUIRED = object()
"""Default of a parameter the request must give."""


def validate_params(sampler: str, declared: Mapping[str, Param], params: Mapping[str, Any] | None) -> dict:
    """Check `params` against the declarations; return them with defaults filled in."""
    params = {} if params is None else params
    if not isinstance(params, Mapping):
        raise SamplerParamError(sampler, "params", f"must be an object, got {type(params).__name__}")
    for key in params:
        if key not in declared:
            expected = ", ".join(declared) or "no parameters"
            raise SamplerParamError(sampler, str(key), f"unknown parameter; {sampler!r} takes {expected}")
    normalized = {}
    for key, param in declared.items():
        if key not in params or params[key] is None:
            if param.default is REQUIRED:
                raise SamplerParamError(sampler, key, "is required")
            normalized[key] = param.default
            continue
        try:
            normalized[key] = param.parse(params[key])
        except ValueError as exc:
            raise SamplerParamError(sampler, key, str(exc)) from None
    return normalized


def parameter_schema(declared: Mapping[str, Param]) -> dict:
    """The JSON Schema (draft 2020-12) of a sampler's params object."""
    properties = {}
    required = []
    for key, param in declared.items():
        if param.default is REQUIRED:
            required.append(key)
            properties[key] = {**param.schema, "description": param.help}
        else:
            properties[key] = param.json_schema()
    schema = {"type": "object", "properties": properties, "additionalProperties": False}
    if required:
        schema["required"] = required
    return schema


_NAME = re.compile(r"^[a-z][a-z0-9_]{0,63}$")


def check_registrable(
    value: object, is_kind: Callable[[object], bool], kind: str, reserved: tuple[str, ...] = ()
) -> None:
    """What every registry checks of a sampler, constraint kind or proposer before taking it: an instance of its
    kind, a lowercase name, a one-line description and parameters whose schema is JSON. Raises TypeError or
    ValueError."""
    if isinstance(value, type):
        raise TypeError(f"{value.__name__} is a class; register an instance")
    if not is_kind(value):
        raise TypeError(f"{value!r} is not a {kind}")
    name = getattr(value, "name", "")
    if not _NAME.match(name or "") or name in reserved:
        but = f" and not be {' or '.join(repr(r) for r in reserved)}" if reserved else ""
        raise ValueError(f"name {name!r} must match {_NAME.pattern}{but}")
    if not value.description or "\n" in value.description:
        raise ValueError(f"{name}: description must be one non-empty line")
    json.dumps(value.parameter_schema)  # the schema travels as JSON text

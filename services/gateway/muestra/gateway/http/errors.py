"""Errors in OpenAI's JSON shape: {"error": {"message", "type", "param", "code"}}, with the matching HTTP status."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping

import grpc

from muestra.runtime.errors import InvalidArgument, MuestraError

# gRPC status of a muestra error -> (HTTP status, OpenAI error type, code).
_BY_GRPC_CODE = {
    grpc.StatusCode.INVALID_ARGUMENT: (400, "invalid_request_error", "invalid_value"),
    grpc.StatusCode.OUT_OF_RANGE: (400, "invalid_request_error", "invalid_value"),
    grpc.StatusCode.FAILED_PRECONDITION: (400, "invalid_request_error", "failed_precondition"),
    grpc.StatusCode.UNAUTHENTICATED: (401, "invalid_request_error", "invalid_api_key"),
    grpc.StatusCode.PERMISSION_DENIED: (403, "invalid_request_error", "permission_denied"),
    grpc.StatusCode.NOT_FOUND: (404, "invalid_request_error", "not_found"),
    grpc.StatusCode.RESOURCE_EXHAUSTED: (429, "rate_limit_error", "queue_full"),
    grpc.StatusCode.CANCELLED: (499, "invalid_request_error", "cancelled"),
    grpc.StatusCode.UNIMPLEMENTED: (501, "server_error", "unimplemented"),
    grpc.StatusCode.UNAVAILABLE: (503, "server_error", "unavailable"),
    grpc.StatusCode.DEADLINE_EXCEEDED: (504, "server_error", "timeout"),
}
# "temperature: must be ..." or "samplers[0].params.top_p: ..." -> the field the message starts with.
_FIELD_PREFIX = re.compile(r"^([A-Za-z_][\w.\[\]]*): ")


class OpenAIError(Exception):
    """An error response: HTTP status and OpenAI's error object."""

    def __init__(
        self, status: int, message: str, type_: str = "invalid_request_error", param: str | None = None, code=None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type_
        self.param = param
        self.code = code

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def json_bytes(self) -> bytes:
        return json.dumps(self.body(), ensure_ascii=False).encode()


def bad_request(param: str | None, message: str, code: str = "invalid_value") -> OpenAIError:
    text = f"{param}: {message}" if param else message
    return OpenAIError(400, text, "invalid_request_error", param, code)


def unauthorized(message: str) -> OpenAIError:
    return OpenAIError(401, message, "invalid_request_error", None, "invalid_api_key")


def internal(request_id: str) -> OpenAIError:
    message = f"internal error (request id {request_id}); the gateway log has the details"
    return OpenAIError(500, message, "server_error", None, "internal_error")


def from_muestra(exc: MuestraError, renames: Mapping[str, str] | None = None) -> OpenAIError:
    """A gateway or backend error as OpenAI's error; `renames` maps gateway field names to this endpoint's."""
    status, type_, code = _BY_GRPC_CODE.get(exc.code, (500, "server_error", "internal_error"))
    message = str(exc)
    if isinstance(exc, InvalidArgument):
        field = exc.field
    else:  # a backend's status keeps only its message, which starts with the field when there is one
        match = _FIELD_PREFIX.match(message)
        field = match.group(1) if match else None
    param = rename_field(field, renames or {}) if field else None
    if param and field and param != field and message.startswith(field):
        message = f"{param} ({field}){message[len(field) :]}"
    if status == 404 and param == "model":
        code = "model_not_found"
    return OpenAIError(status, message, type_, param, code)


def rename_field(field: str, renames: Mapping[str, str]) -> str:
    """The request parameter a gateway field came from: longest matching prefix of `renames` wins."""
    for prefix in sorted(renames, key=len, reverse=True):
        if field == prefix or field.startswith((prefix + ".", prefix + "[")):
            return renames[prefix]
    return field


def _is_type_tag(part) -> bool:
    """pydantic puts the union member it tried into the error location ('str', 'list[str]', 'ChatMessage')."""
    return isinstance(part, str) and ("[" in part or part[:1].isupper() or part in {"str", "int", "float", "bool"})


def location_param(loc: Iterable) -> str | None:
    """('body', 'messages', 0, 'content') -> 'messages[0].content'; ('query', 'limit') -> 'limit'."""
    parts = [p for p in loc if not _is_type_tag(p)]
    if parts and parts[0] in ("body", "query", "path"):
        parts = parts[1:]
    param = ""
    for part in parts:
        if isinstance(part, int):
            param += f"[{part}]"
        else:
            param += f".{part}" if param else str(part)
    return param or None


def from_validation(errors: list[dict]) -> OpenAIError:
    """The first of pydantic's errors, naming the parameter (and how many more there were)."""
    if not errors:
        return bad_request(None, "invalid request body")
    first = errors[0]
    kind = first.get("type", "")
    if kind == "json_invalid":
        return bad_request(None, f"the body is not valid JSON ({first.get('ctx', {}).get('error', 'parse error')})")
    param = location_param(first.get("loc", ()))
    if kind == "missing" and param is None:
        return bad_request(None, "the request needs a JSON body", "missing_body")
    if kind == "extra_forbidden":
        message = "unrecognized request argument (muestra does not support it)"
        code = "unknown_parameter"
    elif kind == "missing":
        message, code = "is required", "missing_required_parameter"
    else:
        message, code = first.get("msg", "is invalid"), "invalid_value"
    more = len({location_param(e.get("loc", ())) for e in errors} - {param})
    if more:
        message += f" (and {more} more invalid parameter{'s' if more > 1 else ''})"
    return bad_request(param, message, code)

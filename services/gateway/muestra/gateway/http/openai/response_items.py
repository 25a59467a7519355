"""The Responses API's items, both ways: a request's input items (and a stored conversation) as chat messages for
the model's chat template, and a finished chat choice as output items.

Every refusal names the field as the client sent it: `input[2].type`, `tools[0].type`, `text.format.schema`.
"""

from __future__ import annotations

import secrets
from typing import Any

from muestra.gateway.http.errors import OpenAIError, bad_request
from muestra.gateway.http.openai.response_bodies import ResponsesRequest

MESSAGE_ROLES = ("user", "assistant", "system", "developer")
INPUT_TYPES = ("message", "function_call", "function_call_output", "item_reference")
# Chat-completions parameters as the Responses API names them (for errors raised by the chat path).
_CHAT_TO_RESPONSES = (
    ("max_completion_tokens", "max_output_tokens"),
    ("response_format.json_schema.schema", "text.format.schema"),
    ("response_format", "text.format"),
    ("messages", "input"),
)


def new_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(16)}"


def responses_param(param: str | None) -> str | None:
    """A chat-completions parameter path as the Responses API spells it."""
    if not param:
        return param
    for chat, ours in _CHAT_TO_RESPONSES:
        if param == chat or param.startswith((chat + ".", chat + "[")):
            return ours + param[len(chat) :] if chat != "messages" else ours
    if param.startswith("tools[") and ".function." in param:
        return param.replace(".function.", ".", 1)
    if param == "tool_choice.function.name":
        return "tool_choice.name"
    return param


def renamed(error: OpenAIError) -> OpenAIError:
    """An error of the chat path with its parameter renamed (message and param)."""
    param = responses_param(error.param)
    if param == error.param:
        return error
    message = error.message
    if error.param and message.startswith(error.param):
        message = param + message[len(error.param) :]
    return OpenAIError(error.status, message, error.type, param, error.code)


def unsupported(field: str, message: str) -> OpenAIError:
    return bad_request(field, message, "unsupported_parameter")


def refuse_unserved(body: ResponsesRequest) -> None:
    """A 400 naming each field that asks for what muestra does not do, rather than silence."""
    if body.reasoning and any(v is not None for v in body.reasoning.values()):
        raise unsupported("reasoning", "the model does not reason (no reasoning tokens); leave reasoning out")
    if body.background:
        raise unsupported("background", "background responses are not supported; use stream or wait for the answer")
    if body.conversation is not None:
        raise unsupported("conversation", "the Conversations API is not served; continue with previous_response_id")
    if body.prompt is not None:
        raise unsupported("prompt", "stored prompt templates are not served; send instructions and input")
    if body.max_tool_calls is not None:
        raise unsupported("max_tool_calls", "is not supported; parallel_tool_calls false allows one call")
    if body.include:
        raise unsupported("include[0]", f"{body.include[0]!r} is not supported; muestra includes nothing extra")
    if body.top_logprobs:
        raise unsupported("top_logprobs", "logprobs are not served on /v1/responses; use /v1/chat/completions")
    if body.truncation == "auto":
        raise unsupported("truncation", "'auto' is not supported: an input over the model's context is refused (400)")
    if body.text is not None and body.text.verbosity not in (None, "medium"):
        raise unsupported("text.verbosity", "only 'medium' is served: the model has no verbosity setting")
    if body.input is None or body.input == "" or body.input == []:
        raise bad_request("input", "is required: a string or a list of input items", "missing_required_parameter")
    if body.metadata is not None:
        if len(body.metadata) > 16:
            raise bad_request("metadata", f"holds {len(body.metadata)} keys; the limit is 16")
        for key, value in body.metadata.items():
            if len(key) > 64:
                raise bad_request(f"metadata.{key[:16]}", "keys are at most 64 characters")
            if len(value) > 512:
                raise bad_request(f"metadata.{key}", "values are at most 512 characters")


# -- input ------------------------------------------------------------------------------------------


def _text(where: str, value: Any) -> str:
    if not isinstance(value, str):
        raise bad_request(where, f"must be a string, not {type(value).__name__}")
    return value


def _content_parts(where: str, role: str, content: Any) -> list[dict]:
    """A message's content as parts: a string, or input_text/output_text parts (images and files refused)."""
    kind = "output_text" if role == "assistant" else "input_text"
    if isinstance(content, str):
        return [{"type": kind, "text": content, **({"annotations": []} if role == "assistant" else {})}]
    if not isinstance(content, list):
        raise bad_request(f"{where}.content", "must be a string or a list of content parts")
    parts = []
    for k, part in enumerate(content):
        at = f"{where}.content[{k}]"
        if not isinstance(part, dict):
            raise bad_request(at, "must be an object with a type")
        kind = part.get("type")
        if kind in ("input_text", "output_text"):
            text = _text(f"{at}.text", part.get("text"))
            parts.append({"type": kind, "text": text, **({"annotations": []} if kind == "output_text" else {})})
        elif kind == "refusal":
            parts.append({"type": "refusal", "refusal": _text(f"{at}.refusal", part.get("refusal"))})
        else:
            raise unsupported(f"{at}.type", f"{kind!r} parts are not supported; only input_text and output_text are")
    return parts


def _input_item(where: str, item: dict, known: dict[str, dict]) -> dict:
    """One input item, checked and completed (an id, a status) as it is stored and listed."""
    kind = item.get("type", "message" if "role" in item else None)
    if kind == "message":
        role = item.get("role")
        if role not in MESSAGE_ROLES:
            raise bad_request(f"{where}.role", f"must be one of {', '.join(MESSAGE_ROLES)}, not {role!r}")
        parts = _content_parts(where, role, item.get("content", ""))
        return {"type": "message", "id": item.get("id") or new_id("msg"), "role": role, "content": parts,
                "status": "completed"}  # fmt: skip
    if kind == "function_call":
        call = {
            "type": "function_call",
            "id": item.get("id") or new_id("fc"),
            "call_id": _text(f"{where}.call_id", item.get("call_id")),
            "name": _text(f"{where}.name", item.get("name")),
            "arguments": _text(f"{where}.arguments", item.get("arguments")),
            "status": "completed",
        }
        return call
    if kind == "function_call_output":
        output = item.get("output")
        if isinstance(output, list):
            output = "".join(_text(f"{where}.output[{k}].text", p.get("text") if isinstance(p, dict) else p)
                             for k, p in enumerate(output))  # fmt: skip
        return {
            "type": "function_call_output",
            "id": item.get("id") or new_id("fco"),
            "call_id": _text(f"{where}.call_id", item.get("call_id")),
            "output": _text(f"{where}.output", output),
            "status": "completed",
        }
    if kind == "item_reference":
        reference = _text(f"{where}.id", item.get("id"))
        if reference not in known:
            raise OpenAIError(
                404, f"{where}.id: no item {reference!r} in the conversation of previous_response_id",
                "invalid_request_error", f"{where}.id", "not_found",
            )  # fmt: skip
        return known[reference]
    if kind is None:
        raise bad_request(f"{where}.type", "is required (or a role, for a message)", "missing_required_parameter")
    raise unsupported(f"{where}.type", f"{kind!r} items are not supported; input items are {', '.join(INPUT_TYPES)}")


def input_items(body: ResponsesRequest, history: list[dict]) -> list[dict]:
    """The request's input as items, each with its id; an item_reference is resolved from `history`."""
    if isinstance(body.input, str):
        return [_input_item("input", {"role": "user", "content": body.input}, {})]
    known = {item["id"]: item for item in history if "id" in item}
    items = []
    for i, item in enumerate(body.input or ()):
        items.append(_input_item(f"input[{i}]", item, known))
    return items


def _joined_text(parts: list[dict]) -> str:
    return "\n".join(p["text"] if "text" in p else p.get("refusal", "") for p in parts)


def chat_messages(instructions: str | None, conversation: list[dict]) -> list[dict]:
    """The conversation as chat-completions messages: the instructions first (as the system message); a run of
    function calls joins the assistant message before it, as the chat path writes calls; outputs as tool messages."""
    messages: list[dict] = []
    if instructions:
        messages.append({"role": "system", "content": instructions})
    for item in conversation:
        if item["type"] == "message":
            role = "system" if item["role"] == "developer" else item["role"]
            messages.append({"role": role, "content": _joined_text(item["content"])})
        elif item["type"] == "function_call":
            call = {"id": item["call_id"], "type": "function",
                    "function": {"name": item["name"], "arguments": item["arguments"]}}  # fmt: skip
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant":
                last.setdefault("tool_calls", []).append(call)
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif item["type"] == "function_call_output":
            messages.append({"role": "tool", "tool_call_id": item["call_id"], "content": item["output"]})
    return messages


# -- tools and format -------------------------------------------------------------------------------


def chat_tools(tools: list[dict] | None) -> list[dict] | None:
    """Function tools as chat completions takes them; a built-in tool (web_search, file_search, ...) is refused."""
    if not tools:
        return None
    converted = []
    for i, tool in enumerate(tools):
        kind = tool.get("type")
        if kind != "function":
            raise unsupported(
                f"tools[{i}].type", f"{kind!r} tools are not served (no built-in tools); only function tools are"
            )
        function = {key: tool[key] for key in ("name", "description", "parameters", "strict") if key in tool}
        unknown = sorted(set(tool) - {"type", "name", "description", "parameters", "strict"})
        if unknown:
            raise bad_request(f"tools[{i}].{unknown[0]}", "unrecognized tool field", "unknown_parameter")
        if "name" not in function:
            raise bad_request(f"tools[{i}].name", "is required", "missing_required_parameter")
        converted.append({"type": "function", "function": function})
    return converted


def chat_tool_choice(choice: str | dict | None):
    if choice is None or isinstance(choice, str):
        if choice not in (None, "none", "auto", "required"):
            raise bad_request("tool_choice", f"must be none, auto, required or a function, not {choice!r}")
        return choice
    if choice.get("type") != "function":
        raise unsupported("tool_choice.type", f"{choice.get('type')!r} is not supported; choose a function tool")
    return {"type": "function", "function": {"name": _text("tool_choice.name", choice.get("name"))}}


def chat_response_format(body: ResponsesRequest) -> dict | None:
    fmt = body.text.format if body.text is not None else None
    if not fmt or fmt.get("type") == "text":
        return None
    kind = fmt.get("type")
    if kind == "json_object":
        return {"type": "json_object"}
    if kind == "json_schema":
        if not isinstance(fmt.get("schema"), dict):
            raise bad_request("text.format.schema", "is required with type 'json_schema' (a JSON Schema object)")
        schema = {key: fmt[key] for key in ("name", "description", "schema", "strict") if key in fmt}
        return {"type": "json_schema", "json_schema": schema}
    raise bad_request("text.format.type", f"{kind!r} is not supported; use text, json_object or json_schema")


def text_format(body: ResponsesRequest) -> dict:
    """The response's `text` field: the format as asked (text when none was)."""
    fmt = body.text.format if body.text is not None and body.text.format else {"type": "text"}
    return {"format": fmt, "verbosity": "medium"}


# -- output -----------------------------------------------------------------------------------------


def message_item(item_id: str, text: str, status: str = "completed") -> dict:
    return {
        "id": item_id, "type": "message", "status": status, "role": "assistant",
        "content": [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}],
    }  # fmt: skip


def call_item(item_id: str, call_id: str, name: str, arguments: str, status: str = "completed") -> dict:
    return {"id": item_id, "type": "function_call", "status": status, "call_id": call_id, "name": name,
            "arguments": arguments}  # fmt: skip


def output_items(message: dict) -> list[dict]:
    """A finished chat choice's message as output items: its text (if any), then each of its calls."""
    items = []
    if message.get("content"):
        items.append(message_item(new_id("msg"), message["content"]))
    for call in message.get("tool_calls") or ():
        function = call["function"]
        items.append(call_item(new_id("fc"), call["id"], function["name"], function["arguments"]))
    return items


def usage(chat_usage: dict) -> dict:
    return {
        "input_tokens": chat_usage["prompt_tokens"],
        "input_tokens_details": {"cached_tokens": chat_usage["prompt_tokens_details"]["cached_tokens"]},
        "output_tokens": chat_usage["completion_tokens"],
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": chat_usage["total_tokens"],
    }

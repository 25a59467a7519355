"""OpenAI's tools on chat completions: the request's tools and tool_choice as a chat-template input and a
constraint, and the model's text back as `tool_calls` (whole, or as stream deltas).

The text format of a call lives in muestra.gateway.engine.tool_calls.
"""

from __future__ import annotations

import json
import secrets

from muestra.gateway.engine.tool_calls import check_tools, cut_call, parse_tool_calls, tool_call_grammar
from muestra.gateway.http.errors import bad_request, from_muestra
from muestra.gateway.http.openai.schemas import ChatCompletionRequest, ChatMessage
from muestra.runtime.errors import InvalidArgument


def tool_inputs(body: ChatCompletionRequest) -> tuple[str, str | None]:
    """(tools_json for the template, the Lark grammar the answer must follow or None).

    tool_choice none: the tools still go to the template, nothing is constrained; auto (the default with
    tools): free text, or calls once the model starts one; required: one or more calls; a named function:
    calls of that function. parallel_tool_calls false: at most one call.
    """
    choice = body.tool_choice
    if not body.tools:
        if choice not in (None, "none", "auto"):
            raise bad_request("tool_choice", "needs tools: there is no tool to call", "missing_required_parameter")
        return "", None
    tools = [tool.model_dump(exclude_none=True) for tool in body.tools]
    try:
        check_tools(tools, "tools")
    except InvalidArgument as exc:
        raise from_muestra(exc) from None
    tools_json = json.dumps(tools, ensure_ascii=False)
    parallel = body.parallel_tool_calls is not False
    if choice == "none":
        return tools_json, None
    if choice is None or choice == "auto":
        return tools_json, tool_call_grammar(tools, required=False, parallel=parallel)
    if choice == "required":
        return tools_json, tool_call_grammar(tools, required=True, parallel=parallel)
    named = [tool for tool in tools if tool["function"]["name"] == choice.function.name]
    if not named:
        known = ", ".join(tool["function"]["name"] for tool in tools)
        raise bad_request("tool_choice.function.name", f"no tool is named {choice.function.name!r}; tools: {known}")
    return tools_json, tool_call_grammar(named, required=True, parallel=parallel)


def template_tool_calls(message: ChatMessage) -> str:
    """An assistant message's tool_calls for the template: arguments as objects, as templates render them
    (OpenAI sends them as JSON text; text that is not JSON stays text)."""
    calls = []
    for call in message.tool_calls or ():
        try:
            arguments = json.loads(call.function.arguments)
        except json.JSONDecodeError:
            arguments = call.function.arguments
        calls.append(
            {"id": call.id, "type": "function", "function": {"name": call.function.name, "arguments": arguments}}
        )
    return json.dumps(calls, ensure_ascii=False) if calls else ""


def _call_id() -> str:
    return f"call_{secrets.token_hex(12)}"


def incomplete_tool_call(text: str, calls: list) -> dict | None:
    """What max_tokens (or a stop string) cut from the whole text: the unfinished call's index in tool_calls
    (where it is there, its arguments cut short; where its name was cut, it is not) and its text as written."""
    cut = cut_call(text)
    if not cut:
        return None
    return {"index": len(calls) - 1 if calls and not calls[-1].complete else len(calls), "text": cut}


def message_with_calls(text: str) -> dict:
    """A choice's message from its whole text: the text before the calls as content, the calls, and the call
    the text was cut inside of, if any (incomplete_tool_call)."""
    content, calls = parse_tool_calls(text, final=True)
    incomplete = incomplete_tool_call(text, calls)
    called = calls or incomplete is not None
    message: dict = {"role": "assistant", "content": content if content or not called else None, "refusal": None}
    if calls:
        message["tool_calls"] = [
            {"id": _call_id(), "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
            for c in calls
        ]
    if incomplete is not None:
        message["incomplete_tool_call"] = incomplete
    return message


class ToolCallDeltas:
    """One streamed choice's text as deltas of content and tool_calls (which the official client merges by index).

    Every delta re-reads the whole text so far and sends what is new: the deltas concatenate to
    message_with_calls of the whole text, and the last one carries its incomplete_tool_call."""

    def __init__(self) -> None:
        self.text = ""
        self.sent_content = 0
        self.sent_arguments: list[int] = []
        self.called = False

    def delta(self, piece: str, final: bool = False) -> dict:
        self.text += piece
        content, calls = parse_tool_calls(self.text, final)
        delta: dict = {}
        if len(content) > self.sent_content:
            delta["content"] = content[self.sent_content :]
            self.sent_content = len(content)
        tool_calls = []
        for index, call in enumerate(calls):
            if index == len(self.sent_arguments):
                function = {"name": call.name, "arguments": call.arguments}
                tool_calls.append({"index": index, "id": _call_id(), "type": "function", "function": function})
            elif len(call.arguments) > self.sent_arguments[index]:
                new = call.arguments[self.sent_arguments[index] :]
                tool_calls.append({"index": index, "function": {"arguments": new}})
            else:
                continue
            if index == len(self.sent_arguments):
                self.sent_arguments.append(len(call.arguments))
            else:
                self.sent_arguments[index] = len(call.arguments)
        if tool_calls:
            delta["tool_calls"] = tool_calls
            self.called = True
        incomplete = incomplete_tool_call(self.text, calls) if final else None
        if incomplete is not None:
            delta["incomplete_tool_call"] = incomplete
        return delta

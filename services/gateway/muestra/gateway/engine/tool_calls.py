"""Tool calls in a model's text: how they are written, the grammar that holds the model to it, how they are read.

The format is Hermes's, which Qwen's chat templates also render and their models were trained on: each call is
`<tool_call>\\n{"name": NAME, "arguments": {...}}\\n</tool_call>`, calls are separated by a newline, and text
may come before the first. The markers below are the only place the format is spelled out: a model trained on
other markers needs them changed here, and nowhere else.
"""

from __future__ import annotations

import dataclasses
import json
import re

import llguidance

from muestra.runtime.errors import InvalidArgument

TRIGGER = "<tool_call>"  # where a call starts: with tool_choice auto, the text is free until this appears
CALL_START = TRIGGER + "\n"
CALL_END = "\n</tool_call>"
SEPARATOR = "\n"  # between two calls
# The JSON inside the markers: no free whitespace, and the separators the templates' `tojson` writes.
JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
# OpenAI's rule for function names.
_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
NO_PARAMETERS = {"type": "object", "properties": {}, "additionalProperties": False}


def check_tools(tools, field: str) -> list[dict]:
    """OpenAI's tool objects, checked: each a function with a valid name and a parameter schema that compiles.

    `field` names the list in errors (`tools`, or `tools_json` over gRPC): `tools[1].function.parameters`.
    """
    if not isinstance(tools, list):
        raise InvalidArgument(field, f"must be a JSON array of tools, got {type(tools).__name__}")
    names: set[str] = set()
    for i, tool in enumerate(tools):
        at = f"{field}[{i}]"
        if not isinstance(tool, dict) or tool.get("type") != "function":
            raise InvalidArgument(f"{at}.type", 'must be "function" (a tool is {"type": "function", "function": {…}})')
        function = tool.get("function")
        if not isinstance(function, dict):
            raise InvalidArgument(f"{at}.function", "must be an object with name, description and parameters")
        name = function.get("name")
        if not isinstance(name, str) or not _NAME.match(name):
            raise InvalidArgument(f"{at}.function.name", f"must be 1-64 letters, digits, _ or -, got {name!r}")
        if name in names:
            raise InvalidArgument(f"{at}.function.name", f"{name!r} names two tools")
        names.add(name)
        parameters = function.get("parameters")
        if parameters is None:
            continue
        if not isinstance(parameters, dict):
            raise InvalidArgument(f"{at}.function.parameters", "must be a JSON Schema object")
        try:
            grammar = llguidance.LLMatcher.grammar_from_json_schema(parameters)
            problem = llguidance.LLMatcher.validate_grammar(grammar)
        except (ValueError, TypeError) as exc:  # what the schema cannot be written as JSON for
            problem = str(exc) or type(exc).__name__
        if problem:
            first = problem.strip().splitlines()[0]
            raise InvalidArgument(f"{at}.function.parameters", f"is not a JSON Schema the gateway can use: {first}")
    return tools


def parse_tools_json(text: str, field: str) -> list[dict]:
    """check_tools on JSON text (GenerateRequest.tools_json)."""
    try:
        tools = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InvalidArgument(field, f"is not valid JSON: {exc}") from None
    return check_tools(tools, field)


def _lark_literal(text: str) -> str:
    return json.dumps(text)  # a JSON string is a string literal in llguidance's Lark


def _named_rule(index: int, function: dict) -> str:
    """One tool's JSON: {"name": NAME, "arguments": <valid against its parameters' JSON Schema>}."""
    schema = {"x-guidance": JSON_OPTIONS, **(function.get("parameters") or NO_PARAMETERS)}
    head = _lark_literal('{"name": ' + json.dumps(function["name"]) + ', "arguments": ')
    return f'named_{index}: {head} args_{index} "}}"\nargs_{index}: %json {json.dumps(schema)}'


def tool_call_grammar(tools: list[dict], required: bool, parallel: bool) -> str:
    """A Lark grammar (llguidance's dialect) for the model's answer when it may call `tools`.

    required: the answer is one call (several with `parallel`), nothing else. Otherwise (tool_choice auto) the
    text is free until it writes TRIGGER; from there it must finish a valid call, then end (or, with
    `parallel`, write more calls).
    """
    end = _lark_literal(CALL_END)
    more = f" ({_lark_literal(SEPARATOR)} call)*" if parallel else ""
    lines = [
        "%llguidance {}",
        f"call: {_lark_literal(CALL_START)} named {end}",
        f"named: {' | '.join(f'named_{i}' for i in range(len(tools)))}",
        *(_named_rule(i, tool["function"]) for i, tool in enumerate(tools)),
    ]
    if required:
        return "\n".join([*lines, f"start: call{more}"])
    # The trigger is a lazy lexeme: it ends at the first TRIGGER in the text, so the text before it is free
    # and the text from it on is held to a call.
    return "\n".join(
        [
            *lines,
            f"start: TEXT | text_then_trigger {_lark_literal(CALL_START[len(TRIGGER) :])} named {end}{more}",
            r"TEXT: /(.|\n)*/",
            f"text_then_trigger[lazy]: TEXT {_lark_literal(TRIGGER)}",
        ]
    )


@dataclasses.dataclass
class ParsedCall:
    name: str
    arguments: str  # the arguments' JSON text (so far, while the call is still being written)
    complete: bool


_HEAD = re.compile(r'\{"name": ("(?:[^"\\]|\\.)*"), "arguments": ')


def _held(text: str, marker: str) -> int:
    """How many characters at the end of `text` could be the start of `marker` (so cannot be shown yet)."""
    for k in range(min(len(marker), len(text)), 0, -1):
        if text.endswith(marker[:k]):
            return k
    return 0


def _without_wrapper_end(arguments: str) -> str:
    """Truncated arguments without a trailing piece of the wrapper's `}` and CALL_END, where that leaves JSON."""
    held = _held(arguments, "}" + CALL_END)
    if held:
        try:
            json.loads(arguments[:-held])
            return arguments[:-held]
        except json.JSONDecodeError:
            pass
    return arguments


def parse_tool_calls(text: str, final: bool) -> tuple[str, list[ParsedCall]]:
    """The text before the first call, and the calls; `final` is False while the text may still grow.

    While it grows, whatever might turn out to be a marker is held back, so that what is returned only ever
    grows: a stream can send the difference each time and end with what the whole text gives. A call the
    final text ends inside of (cut by max_tokens or a stop string) is never content: see cut_call.
    """
    content, calls, _ = _parse(text, final)
    return content, calls


def cut_call(text: str) -> str:
    """The unfinished call the final text ends in, markers included ("" when it ends with its calls whole).

    Its name and arguments so far are the last of parse_tool_calls's calls if its head was written whole."""
    return _parse(text, final=True)[2]


def _parse(text: str, final: bool) -> tuple[str, list[ParsedCall], str]:
    start = text.find(TRIGGER)
    if start < 0:
        held = _held(text, TRIGGER)
        return text[: len(text) - held], [], text[len(text) - held :] if final else ""
    content, calls, pos = text[:start], [], start
    while text.startswith(CALL_START, pos):
        body_start = pos + len(CALL_START)
        end = text.find(CALL_END, body_start)
        body = text[body_start:] if end < 0 else text[body_start:end]
        head = _HEAD.match(body)
        try:
            name = json.loads(head.group(1)) if head else None
        except json.JSONDecodeError:
            name = None
        if name is None:
            break
        arguments = body[head.end() :]
        if end < 0:  # still being written (or cut short by max_tokens or a stop string)
            if final:
                arguments = _without_wrapper_end(arguments)
            else:
                arguments = arguments[: len(arguments) - _held(arguments, "}" + CALL_END)]
            calls.append(ParsedCall(name, arguments, False))
            return content, calls, text[pos:] if final else ""
        calls.append(ParsedCall(name, arguments[:-1] if arguments.endswith("}") else arguments, True))
        pos = end + len(CALL_END)
        if text.startswith(SEPARATOR + TRIGGER, pos):
            pos += len(SEPARATOR)
    if not final:
        return content, calls, ""
    rest = text[pos:]
    if calls and rest == SEPARATOR:  # the calls' separator, cut before the next call's first character
        return content, calls, ""
    after_separator = rest[len(SEPARATOR) :] if calls and rest.startswith(SEPARATOR) else rest
    # A call cut before its name was whole: a piece of the start marker, or the marker and a piece of the head.
    if (after_separator and TRIGGER.startswith(after_separator)) or (
        after_separator.startswith(TRIGGER) and CALL_END not in after_separator
    ):
        return content, calls, after_separator
    return content + rest, calls, ""

"""Tool calling for a ChatML chat template that ignores tools (SmolLM2's): Hermes's format, as Qwen2.5 renders it.

The gateway reads calls in that format (muestra.gateway.engine.tool_calls): `<tool_call>\\n{"name": ..., "arguments":
...}\\n</tool_call>`. Without tools the model's own template renders the chat, byte for byte.
"""

from __future__ import annotations

import json

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment

_START, _END = "<|im_start|>", "<|im_end|>"

# Whether the chat needs the tools branch: tools given, or a call or an answer to one in the history.
_USES_TOOLS = (
    "tools or messages | selectattr('tool_calls') | list or messages | selectattr('role', 'equalto', 'tool') | list"
)

# Qwen2.5's tool rendering: the tools as JSON lines in the system turn (after the system message, or the
# template's default system text), an assistant's calls as <tool_call> blocks after its text, and tool answers
# gathered into one user turn as <tool_response> blocks. SYSTEM_DEFAULT is replaced by a string literal.
_TOOLS_BRANCH = """\
{%- if messages[0].role == 'system' %}
{%- set system = messages[0].content %}
{%- else %}
{%- set system = SYSTEM_DEFAULT %}
{%- endif %}
{%- if system or tools %}
{{- '<|im_start|>system\\n' + system }}
{%- if tools %}
{%- if system %}{{- '\\n\\n' }}{%- endif %}
{{- '# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n' }}
{{- 'You are provided with function signatures within <tools></tools> XML tags:\\n<tools>' }}
{%- for tool in tools %}
{{- '\\n' }}{{- tool | tojson }}
{%- endfor %}
{{- '\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments within ' }}
{{- '<tool_call></tool_call> XML tags:\\n<tool_call>\\n{"name": <function-name>, "arguments": <args-json-object>}' }}
{{- '\\n</tool_call>' }}
{%- endif %}
{{- '<|im_end|>\\n' }}
{%- endif %}
{%- for message in messages %}
{%- if message.role == 'system' and loop.first %}
{%- elif message.role == 'assistant' and message.tool_calls %}
{{- '<|im_start|>assistant' }}
{%- if message.content %}{{- '\\n' + message.content }}{%- endif %}
{%- for tool_call in message.tool_calls %}
{%- if tool_call.function is defined %}{%- set tool_call = tool_call.function %}{%- endif %}
{{- '\\n<tool_call>\\n{"name": ' + tool_call.name | tojson + ', "arguments": ' }}
{%- if tool_call.arguments is string %}{{- tool_call.arguments }}
{%- else %}{{- tool_call.arguments | tojson }}{%- endif %}
{{- '}\\n</tool_call>' }}
{%- endfor %}
{{- '<|im_end|>\\n' }}
{%- elif message.role == 'tool' %}
{%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}
{{- '\\n<tool_response>\\n' + message.content + '\\n</tool_response>' }}
{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}{{- '<|im_end|>\\n' }}{%- endif %}
{%- else %}
{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}
"""


def with_tool_calling(template: str) -> str:
    """`template` with tools rendered the Hermes way, or `template` itself where it cannot or need not be wrapped.

    Unchanged: a template that mentions `tools` (it renders them its own way), and one that does not render
    plain ChatML turns (`<|im_start|>ROLE\\nCONTENT<|im_end|>\\n`, and `<|im_start|>assistant\\n` as the generation
    prompt) from messages alone, without special tokens: Llama 3's or Gemma's, or a ChatML template that writes
    `bos_token`. A chat without tools, tool calls or tool messages renders exactly as with `template`.
    """
    if "tools" in template:
        return template
    system_default = _chatml_system_default(template)
    if system_default is None:
        return template
    tools_branch = _TOOLS_BRANCH.replace("SYSTEM_DEFAULT", json.dumps(system_default, ensure_ascii=False))
    # The newline after the first tag and the `+` on the `else` keep the original's text as it was under
    # transformers' trim_blocks and lstrip_blocks: its first line still starts a line, its last still ends the text.
    return f"{{%- if not ({_USES_TOOLS}) %}}\n{template}{{%+ else %}}\n{tools_branch}{{%- endif %}}"


def _chatml(*turns: tuple[str, str]) -> str:
    return "".join(f"{_START}{role}\n{content}{_END}\n" for role, content in turns)


def _chatml_system_default(template: str) -> str | None:
    """The system text `template` writes when the messages bring none ('' if it writes no system turn), or
    None if it does not render plain ChatML."""
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols], undefined=jinja2.StrictUndefined
    )
    turns = [("system", "Be brief."), ("user", "Hi there"), ("assistant", "Hello!")]
    try:
        compiled = env.from_string(template)

        def render(chat: list[tuple[str, str]], add_generation_prompt: bool) -> str:
            messages = [{"role": role, "content": content} for role, content in chat]
            return compiled.render(messages=messages, add_generation_prompt=add_generation_prompt)

        if render(turns, False) != _chatml(*turns):
            return None
        if render(turns[:2], True) != _chatml(*turns[:2]) + f"{_START}assistant\n":
            return None
        user_only = render(turns[1:2], False)
    except (jinja2.TemplateError, TypeError, ValueError, LookupError):
        return None
    user_turn = _chatml(turns[1])
    if user_only == user_turn:
        return ""
    head, tail = f"{_START}system\n", f"{_END}\n{user_turn}"
    if not (user_only.startswith(head) and user_only.endswith(tail)):
        return None
    system = user_only[len(head) : -len(tail)]
    return None if _START in system or _END in system else system

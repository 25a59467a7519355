"""Chat templates rendered the way transformers' `apply_chat_template` renders them.

The jinja environment copies transformers' (utils/chat_template_utils.py): a sandbox that cannot
mutate its inputs, trim_blocks and lstrip_blocks, loop controls, a `{% generation %}` tag, a
`tojson` that does not escape HTML, and the globals `raise_exception`, `strftime_now`, a
restricted `dict` and a `namespace` that refuses underscore names. The template sees `messages`,
`tools` (a list of tool definitions, or None), `documents` (None), `add_generation_prompt` and the
special-token strings (`bos_token`, `eos_token`, …), exactly as transformers passes them. Messages may carry
`tool_calls` (an assistant's) and `tool_call_id` (a tool's answer), which the template reads as it likes.
"""

from __future__ import annotations

import json
from datetime import datetime
from functools import lru_cache

import jinja2
import jinja2.ext
import jinja2.nodes
import jinja2.utils
from jinja2.sandbox import ImmutableSandboxedEnvironment

from muestra.runtime.errors import InvalidArgument

# Exceptions a template can raise while rendering; each is the caller's messages meeting the template.
_RENDER_ERRORS = (jinja2.TemplateError, TypeError, ValueError, LookupError, ArithmeticError)


class _GenerationTag(jinja2.ext.Extension):
    """`{% generation %}…{% endgeneration %}` marks assistant text for training masks; it renders its body."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_render_body"), [], [], body).set_lineno(lineno)

    def _render_body(self, caller):
        return caller()


def _raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def _tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(format):
    return datetime.now().strftime(format)


class _TemplateDict:
    """`dict(...)` for templates, without the attributes of the real type."""

    def __call__(self, *args, **kwargs):
        return dict(*args, **kwargs)

    def fromkeys(self, *args, **kwargs):
        return dict.fromkeys(*args, **kwargs)


class _TemplateNamespace(jinja2.utils.Namespace):
    """jinja's namespace, refusing underscore-prefixed attributes (no way into CPython internals)."""

    def __init__(*args, **kwargs):
        self, args = args[0], args[1:]
        attrs = dict(*args, **kwargs)
        for name in attrs:
            _TemplateNamespace._check_name(name)
        jinja2.utils.Namespace.__init__(self, attrs)

    def __setitem__(self, name, value):
        _TemplateNamespace._check_name(name)
        jinja2.utils.Namespace.__setitem__(self, name, value)

    @staticmethod
    def _check_name(name):
        if isinstance(name, str) and name.startswith("_"):
            raise jinja2.exceptions.SecurityError(f"chat templates cannot set underscore attributes ({name!r})")


@lru_cache(maxsize=1)
def _environment() -> ImmutableSandboxedEnvironment:
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[_GenerationTag, jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    env.globals["dict"] = _TemplateDict()
    env.globals["namespace"] = _TemplateNamespace
    return env


class ChatTemplate:
    """One model's compiled chat template."""

    def __init__(self, source: str) -> None:
        self.source = source
        # A syntax error surfaces here, at start-up, as jinja2.TemplateSyntaxError.
        self.template = _environment().from_string(source)

    def render(
        self,
        messages: list[dict],
        add_generation_prompt: bool,
        special_tokens: dict[str, str],
        tools: list | None = None,
    ) -> str:
        """The prompt text; a template that rejects the messages raises InvalidArgument naming `messages`."""
        try:
            return self.template.render(
                **special_tokens,
                messages=messages,
                tools=tools,
                documents=None,
                add_generation_prompt=add_generation_prompt,
            )
        except _RENDER_ERRORS as exc:
            raise InvalidArgument("messages", f"the chat template rejected them: {exc}") from None

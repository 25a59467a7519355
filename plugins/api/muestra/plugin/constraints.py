"""The output-constraint interface.

A constraint kind turns a request's parameters into a Grammar: a JSON Schema, a regular
expression or a Lark grammar. The gateway compiles it once per request with its grammar engine
(llguidance), keeps one matcher per completion, and at every step allows only the tokens that
keep the text inside the grammar. Plugin authors write no per-token code:

    class Choice(Constraint):
        name = "choice"
        description = "The text is exactly one of the given strings."
        parameters = {"choices": StringList(REQUIRED, "The allowed strings.", min_items=1)}

        def grammar(self, params):
            return Grammar.lark("start: " + " | ".join(json.dumps(c) for c in params["choices"]))
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from typing import Any, ClassVar, Literal

from muestra.plugin.params import Param, check_registrable, parameter_schema, validate_params

GrammarKind = Literal["json_schema", "regex", "lark"]


@dataclasses.dataclass(frozen=True)
class Grammar:
    """The language a completion must belong to, in one of the forms the grammar engine compiles."""

    kind: GrammarKind
    # JSON Schema as JSON text, a regular expression (the whole text matches it), or a Lark grammar
    # in llguidance's dialect (`start` is the top rule; `%json {...}` embeds a JSON Schema).
    source: str

    @classmethod
    def json_schema(cls, schema: Mapping[str, Any]) -> Grammar:
        return cls("json_schema", json.dumps(schema))

    @classmethod
    def regex(cls, pattern: str) -> Grammar:
        return cls("regex", pattern)

    @classmethod
    def lark(cls, grammar: str) -> Grammar:
        return cls("lark", grammar)


class Constraint:
    """A kind of constraint: named, documented, with declared parameters, compiled to a Grammar."""

    name: ClassVar[str] = ""
    description: ClassVar[str] = ""  # one line, shown by ListConstraints and `muestra plugins`
    parameters: ClassVar[dict[str, Param]] = {}

    @property
    def parameter_schema(self) -> dict:
        """JSON Schema of the params object."""
        return parameter_schema(self.parameters)

    def validate(self, params: Mapping[str, Any] | None) -> dict:
        """Checked params with defaults filled in; raises SamplerParamError naming the field."""
        return validate_params(self.name, self.parameters, params)

    def grammar(self, params: dict) -> Grammar:
        """The grammar for these (validated) params; raise ValueError with a message for a bad one."""
        raise NotImplementedError


def check_constraint(constraint: object) -> None:
    """Raise TypeError or ValueError if `constraint` cannot be registered (the registry's own check)."""
    check_registrable(constraint, lambda value: isinstance(value, Constraint), "Constraint")

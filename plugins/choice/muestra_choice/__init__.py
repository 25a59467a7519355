"""The "choice" constraint: the text is exactly one of the given strings.

Each string becomes a quoted literal of a Lark grammar, `start: "a" | "b" | ...`; JSON's string
escapes are Lark's, so quotes, backslashes and newlines in a choice need no special handling.
"""

from __future__ import annotations

import json

from muestra.plugin import REQUIRED, Constraint, Grammar, StringList, hookimpl


class Choice(Constraint):
    name = "choice"
    description = "The text is exactly one of the given strings."
    parameters = {"choices": StringList(REQUIRED, "The strings the text may be.", min_items=1, max_items=1024)}

    def grammar(self, params) -> Grammar:
        choices = params["choices"]
        if any(choice == "" for choice in choices):
            raise ValueError("a choice is empty")
        return Grammar.lark("start: " + " | ".join(json.dumps(choice) for choice in dict.fromkeys(choices)))


@hookimpl
def register_constraints(register):
    register(Choice())

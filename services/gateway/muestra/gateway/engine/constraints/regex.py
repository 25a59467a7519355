"""Text that a regular expression matches as a whole (vLLM's guided_regex)."""

from muestra.plugin import REQUIRED, Constraint, Grammar, String


class Regex(Constraint):
    name = "regex"
    description = "The whole text matches a regular expression."
    parameters = {"pattern": String(REQUIRED, "The regular expression (Rust regex syntax, no lookaround).")}

    def grammar(self, params):
        return Grammar.regex(params["pattern"])

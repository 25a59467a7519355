"""Text in a context-free language given as a Lark grammar (vLLM's guided_grammar)."""

from muestra.plugin import REQUIRED, Constraint, Grammar, String


class LarkGrammar(Constraint):
    name = "grammar"
    description = "The text is in the language of a Lark grammar (start rule `start`)."
    parameters = {"lark": String(REQUIRED, "The grammar, in llguidance's Lark dialect.")}

    def grammar(self, params):
        return Grammar.lark(params["lark"])

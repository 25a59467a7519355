"""Any JSON object: OpenAI's response_format {"type": "json_object"}."""

from muestra.plugin import Constraint, Grammar


class JsonObject(Constraint):
    name = "json_object"
    description = "The text is one JSON object."
    parameters = {}

    def grammar(self, params):
        return Grammar.json_schema({"type": "object"})

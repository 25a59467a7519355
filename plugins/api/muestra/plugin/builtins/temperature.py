"""Temperature: divide the scores by t (t < 1 sharpens, t > 1 flattens); transformers' TemperatureLogitsWarper."""

from muestra.plugin import Float, LogitsProcessor, column


class Temperature(LogitsProcessor):
    name = "temperature"
    description = "Divide the scores by the temperature (below 1 sharpens, above 1 flattens)."
    runs_in_lm = True
    # A floor rather than > 0: dividing by a tiny t overflows float32. Use 'greedy' for argmax.
    parameters = {"temperature": Float(1.0, "Divisor of the scores.", ge=0.001, le=100.0)}
    argmax_invariant = True

    def process(self, logits, params, rows):
        logits /= column(params, "temperature")
        return logits

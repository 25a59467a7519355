"""Logit bias, OpenAI's parameter: add a fixed bias to chosen tokens' scores.

The single-token case of transformers' SequenceBiasLogitsProcessor.
"""

from collections.abc import Mapping

import numpy as np

from muestra.plugin import REQUIRED, LogitsProcessor, Param, SamplerParamError

MAX_BIASED_TOKENS = 1024


def _parse_bias(value) -> dict[int, float]:
    if not isinstance(value, Mapping):
        raise ValueError(f'must be an object mapping token ids to biases, e.g. {{"50256": -100}}, got {value!r}')
    if len(value) > MAX_BIASED_TOKENS:
        raise ValueError(f"at most {MAX_BIASED_TOKENS} tokens, got {len(value)}")
    bias = {}
    for key, amount in value.items():
        if not str(key).isdigit():
            raise ValueError(f"keys must be token ids (non-negative integers), got {key!r}")
        if isinstance(amount, bool) or not isinstance(amount, (int, float)) or not -100 <= amount <= 100:
            raise ValueError(f"bias of token {key} must be a number in [-100, 100], got {amount!r}")
        bias[int(key)] = float(amount)
    return bias


class LogitBias(LogitsProcessor):
    name = "logit_bias"
    description = "Add a bias in [-100, 100] to the scores of the given token ids (OpenAI's logit_bias)."
    runs_in_lm = True
    parameters = {
        "logit_bias": Param(
            REQUIRED,
            'Token id (as a string) -> bias, e.g. {"50256": -100} to ban a token.',
            {
                "type": "object",
                "propertyNames": {"pattern": "^[0-9]+$"},
                "additionalProperties": {"type": "number", "minimum": -100, "maximum": 100},
                "maxProperties": MAX_BIASED_TOKENS,
            },
            _parse_bias,
        )
    }

    def validate(self, params, model):
        normalized = super().validate(params, model)
        too_large = [token for token in normalized["logit_bias"] if token >= model.vocab_size]
        if too_large:
            raise SamplerParamError(
                self.name,
                "logit_bias",
                f"token ids must be below the vocabulary size {model.vocab_size}, got {too_large[0]}",
            )
        return normalized

    def process(self, logits, params, rows):
        for row, p in enumerate(params):
            tokens = np.fromiter(p["logit_bias"].keys(), dtype=np.int64)
            logits[row, tokens] += np.fromiter(p["logit_bias"].values(), dtype=np.float32)
        return logits

"""Mirostat v2 for muestra: sample while steering the surprise of each token towards tau.

Per row: drop tokens whose surprise -log2(p) exceeds mu (the most likely one always stays),
sample from the renormalised rest, then mu -= eta * (surprise of the sampled token - tau).
mu starts at 2 * tau and lives in the row's state, so each completion keeps its own.
The same steps as llama.cpp's llama_sampler_mirostat_v2.
"""

from __future__ import annotations

import numpy as np

from muestra.plugin import Float, TokenSelector, column, hookimpl, softmax


class MirostatV2(TokenSelector):
    name = "mirostat"
    description = "Mirostat v2: sample while keeping each token's surprise near tau (per-row state mu)."
    runs_in_lm = True
    parameters = {
        "tau": Float(5.0, "Target surprise, in bits; lower is more focused.", gt=0.0, le=30.0),
        "eta": Float(0.1, "Learning rate of mu.", gt=0.0, le=1.0),
    }

    def select(self, logits, params, rows) -> np.ndarray:
        tau, eta = column(params, "tau", np.float64), column(params, "eta", np.float64)
        states = [row.state.setdefault(self.name, {"mu": 2.0 * p["tau"]}) for row, p in zip(rows, params, strict=True)]
        mu = np.array([[state["mu"]] for state in states])

        probs = softmax(logits).astype(np.float64)
        with np.errstate(divide="ignore"):
            surprise = -np.log2(probs)
        keep = surprise <= mu
        keep[np.arange(len(rows)), np.argmax(probs, axis=-1)] = True
        kept = np.where(keep, probs, 0.0)
        kept /= kept.sum(axis=-1, keepdims=True)

        # Inverse-CDF draw with each row's own generator.
        draws = np.array([[row.rng.random()] for row in rows])
        tokens = np.minimum(np.sum(np.cumsum(kept, axis=-1) <= draws, axis=-1), logits.shape[-1] - 1)

        observed = -np.log2(kept[np.arange(len(rows)), tokens])
        for state, new_mu in zip(states, (mu - eta * (observed[:, None] - tau))[:, 0], strict=True):
            state["mu"] = float(new_mu)
        return tokens.astype(np.int64)


@hookimpl
def register_samplers(register):
    register(MirostatV2())

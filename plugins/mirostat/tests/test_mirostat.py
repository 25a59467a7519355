"""Mirostat v2: validation, truncation, the mu update, convergence to tau, reproducibility."""

import math

import muestra_mirostat
import numpy as np
import pytest

from muestra.plugin import ModelInfo, RowContext, SamplerParamError, check_sampler

MODEL = ModelInfo(vocab_size=100)
SAMPLER = muestra_mirostat.MirostatV2()


def zipf_logits(vocab: int = 100, rows: int = 1) -> np.ndarray:
    """Zipf-like scores: p(rank r) proportional to 1 / r."""
    return np.repeat(-np.log(np.arange(1, vocab + 1, dtype=np.float32))[None, :], rows, axis=0)


def new_row(seed: int) -> RowContext:
    return RowContext([1, 2, 3], np.random.default_rng(seed))


def test_registers_one_valid_sampler_through_the_hook():
    registered = []
    muestra_mirostat.register_samplers(register=registered.append)
    assert [s.name for s in registered] == ["mirostat"]
    check_sampler(registered[0])


def test_defaults_and_bad_values():
    assert SAMPLER.validate({}, MODEL) == {"tau": 5.0, "eta": 0.1}
    with pytest.raises(SamplerParamError) as caught:
        SAMPLER.validate({"tau": -1.0}, MODEL)
    assert (caught.value.sampler, caught.value.field) == ("mirostat", "tau")
    with pytest.raises(SamplerParamError, match="eta"):
        SAMPLER.validate({"eta": math.nan}, MODEL)


def test_first_step_truncates_at_mu_and_updates_mu_by_the_error():
    params = SAMPLER.validate({"tau": 2.0, "eta": 0.5}, MODEL)
    row = new_row(0)
    logits = zipf_logits()
    probs = np.exp(logits[0]) / np.exp(logits[0]).sum()
    allowed = -np.log2(probs) <= 4.0  # mu starts at 2 * tau
    token = int(SAMPLER.select(logits.copy(), [params], [row])[0])
    assert allowed[token]
    renormalised = probs[token] / probs[allowed].sum()
    expected_mu = 4.0 - 0.5 * (-math.log2(renormalised) - 2.0)
    assert row.state["mirostat"]["mu"] == pytest.approx(expected_mu)


def mean_surprises(tau: float, steps: int = 3000) -> tuple[float, float]:
    """Mean surprise of the sampled tokens under the truncated distribution (what mirostat
    steers) and under the full one, after mu has settled."""
    params = SAMPLER.validate({"tau": tau, "eta": 0.1}, MODEL)
    row = new_row(1)
    logits = zipf_logits()
    probs = np.exp(logits[0]) / np.exp(logits[0]).sum()
    truncated, full = [], []
    for _ in range(steps):
        mu = row.state.get("mirostat", {"mu": 2 * tau})["mu"]
        allowed = (-np.log2(probs) <= mu) | (probs == probs.max())
        token = int(SAMPLER.select(logits.copy(), [params], [row])[0])
        truncated.append(-math.log2(probs[token] / probs[allowed].sum()))
        full.append(-math.log2(probs[token]))
    return float(np.mean(truncated[500:])), float(np.mean(full[500:]))


def test_surprise_converges_to_tau_and_lower_tau_is_more_focused():
    results = {tau: mean_surprises(tau) for tau in (2.0, 3.0, 5.0)}
    for tau, (truncated, _) in results.items():
        assert truncated == pytest.approx(tau, abs=0.1)
    full = [results[tau][1] for tau in (2.0, 3.0, 5.0)]
    assert full == sorted(full) and full[0] < 3.5


def test_rows_keep_their_own_mu_and_seeded_draws_repeat():
    params = [SAMPLER.validate({"tau": t}, MODEL) for t in (1.0, 6.0)]

    def run(seed_a, seed_b):
        rows = [new_row(seed_a), new_row(seed_b)]
        tokens = [SAMPLER.select(zipf_logits(rows=2), params, rows).tolist() for _ in range(50)]
        return tokens, [row.state["mirostat"]["mu"] for row in rows]

    tokens, mus = run(7, 8)
    assert run(7, 8) == (tokens, mus)
    assert mus[0] != mus[1]
    assert run(9, 8)[0] != tokens

"""Beam search: the bookkeeping of transformers' `_beam_search` (generation/utils.py), one request at a time.

Each step takes the processed log-probs of the running beams and says which beams continue
(source rows, repeats allowed: the lm service's Filter) with which next tokens. Arithmetic
is float32 and step for step the same as transformers, including its -1e9 masking, so the
finished hypotheses and their scores match `generate(num_beams=..., do_sample=False)`.
"""

from __future__ import annotations

import numpy as np

from muestra.plugin import Float, Hypothesis, Int, Param, SearchStep, SearchStrategy

MASK = np.float32(-1.0e9)


def _parse_early_stopping(value) -> bool | str:
    if isinstance(value, bool) or value == "never":
        return value
    raise ValueError(f'must be true, false or "never", got {value!r}')


def _top(values: np.ndarray, k: int) -> np.ndarray:
    """Indices of the k largest values, largest first (ties: lower index first)."""
    return np.argsort(-values, kind="stable")[:k]


class BeamSearch:
    """One request's running beams and finished hypotheses."""

    def __init__(
        self,
        num_beams: int,
        length_penalty: float = 1.0,
        early_stopping: bool | str = False,
        eos_token_ids: tuple[int, ...] = (),
        max_new_tokens: int = 20,
    ) -> None:
        self.num_beams = num_beams
        self.length_penalty = length_penalty
        self.early_stopping = early_stopping
        self.eos_token_ids = np.asarray(eos_token_ids, dtype=np.int64)
        self.max_new_tokens = max_new_tokens
        # Candidates kept per step: enough that num_beams survive even if the best ones all end.
        self.beams_to_keep = max(2, 1 + len(eos_token_ids)) * num_beams
        self.length = 0  # tokens generated so far by every running beam
        self.running_tokens = np.zeros((num_beams, max_new_tokens), dtype=np.int64)
        # Only beam 0 is live at first, so the first step does not pick the same token num_beams times.
        self.running_scores = np.full(num_beams, MASK, dtype=np.float32)
        self.running_scores[0] = 0.0
        self.finished_tokens = np.zeros((num_beams, max_new_tokens), dtype=np.int64)
        self.finished_lengths = np.zeros(num_beams, dtype=np.int64)
        self.finished_scores = np.full(num_beams, MASK, dtype=np.float32)
        self.is_finished = np.zeros(num_beams, dtype=bool)
        self.improvement_possible = True
        self.done = False

    def step(self, log_probs: np.ndarray) -> SearchStep:
        """Advance by one token; `log_probs` is [num_beams, vocab] (or [1, vocab] at the first step)."""
        if self.done:
            raise RuntimeError("beam search already finished")
        log_probs = np.asarray(log_probs, dtype=np.float32)
        if self.length == 0 and log_probs.shape[0] == 1:
            log_probs = np.repeat(log_probs, self.num_beams, axis=0)  # all beams hold the prompt
        if log_probs.shape[0] != self.num_beams:
            raise ValueError(f"expected {self.num_beams} rows of log-probs, got {log_probs.shape[0]}")
        vocab = log_probs.shape[1]
        n, t = self.num_beams, self.length

        # c. The best beams_to_keep continuations over all beams.
        accumulated = (log_probs + self.running_scores[:, None]).reshape(-1)
        top = _top(accumulated, self.beams_to_keep)
        top_scores = accumulated[top]
        top_beams, top_tokens = top // vocab, top % vocab
        candidates = self.running_tokens[top_beams, : t + 1]
        candidates[:, t] = top_tokens

        # d. Which continuations end here: an EOS token, or max_new_tokens reached.
        ends = np.isin(top_tokens, self.eos_token_ids) | (t + 1 >= self.max_new_tokens)

        # e. The best num_beams continuations that did not end keep running.
        running_scores = top_scores + ends.astype(np.float32) * MASK
        keep = _top(running_scores, n)
        self.running_tokens[:, : t + 1] = candidates[keep]
        self.running_scores = running_scores[keep]
        source_rows = top_beams[keep]

        # f. Ended continuations among the top num_beams compete for the finished slots.
        just_finished = ends & (np.arange(self.beams_to_keep) < n)
        scores = top_scores / np.float32((t + 1) ** self.length_penalty)
        scores += np.float32(self.is_finished.all() and self.early_stopping is True) * MASK
        scores += np.float32(not self.improvement_possible) * MASK
        scores += (~just_finished).astype(np.float32) * MASK
        merged_scores = np.concatenate([self.finished_scores, scores])
        merged_tokens = np.zeros((n + self.beams_to_keep, self.max_new_tokens), dtype=np.int64)
        merged_tokens[:n] = self.finished_tokens
        merged_tokens[n:, : t + 1] = candidates
        merged_lengths = np.concatenate([self.finished_lengths, np.full(self.beams_to_keep, t + 1)])
        merged_finished = np.concatenate([self.is_finished, just_finished])
        best = _top(merged_scores, n)
        self.finished_scores = merged_scores[best]
        self.finished_tokens = merged_tokens[best]
        self.finished_lengths = merged_lengths[best]
        self.is_finished = merged_finished[best]

        # g. Stop when no running beam can beat the worst finished one (a heuristic unless
        # early_stopping is "never"), when every slot is full with early_stopping=True, or at the end.
        self.length = t + 1
        if self.early_stopping == "never" and self.length_penalty > 0.0:
            best_length = self.max_new_tokens
        else:
            best_length = self.length
        best_possible = self.running_scores[0] / np.float32(best_length**self.length_penalty)
        worst_finished = np.where(self.is_finished, self.finished_scores.min(), MASK)
        self.improvement_possible = self.improvement_possible and bool(np.any(best_possible > worst_finished))
        all_full = bool(self.is_finished.all()) and self.early_stopping is True
        self.done = not self.improvement_possible or all_full or bool(ends.all())
        return SearchStep(source_rows.tolist(), self.running_tokens[:, t].tolist(), self.done)

    def results(self) -> list[Hypothesis]:
        """Finished hypotheses, best first, with their length-penalised scores."""
        return [
            Hypothesis(self.finished_tokens[i, : self.finished_lengths[i]].tolist(), float(self.finished_scores[i]))
            for i in range(self.num_beams)
            if self.is_finished[i]
        ]


class BeamSearchStrategy(SearchStrategy):
    name = "beam_search"
    description = "Keep the num_beams most likely continuations at each step; return the best finished ones."
    parameters = {
        "num_beams": Int(4, "Beams kept at each step (for one, use greedy).", ge=2, le=32),
        "length_penalty": Float(
            1.0, "Finished scores are divided by length**length_penalty (> 0 favours longer).", ge=-10.0, le=10.0
        ),
        "early_stopping": Param(
            False,
            'true: stop when num_beams hypotheses are finished; false: heuristic; "never": canonical.',
            {"oneOf": [{"type": "boolean"}, {"const": "never"}]},
            _parse_early_stopping,
        ),
    }

    def new_search(self, params, model, prompt_length, max_new_tokens) -> BeamSearch:
        return BeamSearch(
            params["num_beams"], params["length_penalty"], params["early_stopping"], model.eos_token_ids, max_new_tokens
        )

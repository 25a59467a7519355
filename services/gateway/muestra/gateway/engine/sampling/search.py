"""Requests under a search strategy (beam search): the chain's processors, then the search, over a group of rows."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from muestra.gateway.engine.sampling.chain import Chain
from muestra.plugin import Hypothesis, ModelInfo, RowContext, SearchStep, log_softmax


class SearchRequest:
    """One request's running rows under beam search.

    Each step: log_softmax of the rows' logits, the chain's processors (as transformers
    applies them to log-probs in beam search), then the search. The caller then keeps rows
    `source_rows` (the lm service's Filter, repeats allowed) and decodes `next_tokens`.
    The first step takes the single prefilled row.
    """

    def __init__(
        self, chain: Chain, prompt_ids: Sequence[int], model: ModelInfo, max_new_tokens: int, seed: int = 0
    ) -> None:
        if not chain.is_search:
            raise ValueError(f"{chain.last.sampler.name} is not a search strategy")
        self.chain = chain
        self.search = chain.last.sampler.new_search(chain.last.params, model, len(prompt_ids), max_new_tokens)
        self.contexts = [RowContext(prompt_ids, np.random.default_rng(seed))]

    @property
    def done(self) -> bool:
        return self.search.done

    def step(self, logits: np.ndarray) -> SearchStep:
        """Advance by one token given the raw logits of the running rows, [rows, vocab]."""
        scores = log_softmax(np.asarray(logits, dtype=np.float32))
        for step in self.chain.processors:
            scores = step.sampler.process(scores, [step.params] * len(self.contexts), self.contexts)
        result = self.search.step(scores)
        contexts = []
        for source, token in zip(result.source_rows, result.next_tokens, strict=True):
            context = self.contexts[source].fork()
            context.append(token)
            contexts.append(context)
        self.contexts = contexts
        return result

    def results(self) -> list[Hypothesis]:
        """Finished hypotheses, best first."""
        return self.search.results()


def run_search(
    step: Callable[[list[list[int]]], np.ndarray],
    chain: Chain,
    prompt_ids: Sequence[int],
    model: ModelInfo,
    max_new_tokens: int,
) -> list[Hypothesis]:
    """Run a whole search given step(rows' token ids, prompt included) -> logits [rows, vocab].

    The loop the gateway runs against the lm service, with `step` standing in for it (tests
    drive it with a transformers model in PyTorch).
    """
    request = SearchRequest(chain, prompt_ids, model, max_new_tokens)
    sequences = [list(prompt_ids)]
    while True:
        result = request.step(np.asarray(step(sequences), dtype=np.float32))
        if result.done:
            return request.results()
        sequences = [
            sequences[source] + [token] for source, token in zip(result.source_rows, result.next_tokens, strict=True)
        ]

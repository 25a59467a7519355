"""The token sampler interface.

A request's sampler chain is an ordered list of samplers, each with its own parameters:

    LogitsProcessor ... LogitsProcessor  then one  TokenSelector | SearchStrategy

Every call works on a batch: float32 logits [rows, vocab], one params dict per row (as the
sampler's `validate` returned it) and one RowContext per row. Rows of one batch may have
different parameters; vectorise over rows with numpy rather than looping over them.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar, Protocol

import numpy as np

from muestra.plugin.params import Param, check_registrable, parameter_schema, validate_params


@dataclasses.dataclass(frozen=True)
class ModelInfo:
    """What a sampler may need to know about the model when it validates parameters."""

    vocab_size: int
    eos_token_ids: tuple[int, ...] = ()
    context_length: int = 0


class RowContext:
    """One row's history and private state: prompt ids, generated ids, random generator, sampler state."""

    def __init__(self, prompt_ids: Sequence[int], rng: np.random.Generator, output_ids: Sequence[int] = ()) -> None:
        self.prompt_ids = np.asarray(prompt_ids, dtype=np.int64)
        self.rng = rng
        # Per-row state of stateful samplers (e.g. mirostat's mu), keyed by sampler name.
        self.state: dict[str, Any] = {}
        self._output = np.zeros(max(16, 2 * len(output_ids)), dtype=np.int64)
        self._length = len(output_ids)
        self._output[: self._length] = output_ids

    @property
    def output_ids(self) -> np.ndarray:
        """The ids generated so far (a read-only view)."""
        view = self._output[: self._length]
        view.flags.writeable = False
        return view

    def all_ids(self) -> np.ndarray:
        """Prompt ids followed by the generated ids (what transformers calls input_ids)."""
        return np.concatenate([self.prompt_ids, self._output[: self._length]])

    def append(self, token_id: int) -> None:
        if self._length == len(self._output):
            self._output = np.concatenate([self._output, np.zeros_like(self._output)])
        self._output[self._length] = token_id
        self._length += 1

    def snapshot(self) -> tuple[dict, dict]:
        """What a step may change besides the ids: the generator's position and the sampler state."""
        return self.rng.bit_generator.state, copy.deepcopy(self.state) if self.state else {}

    def restore(self, snapshot: tuple[dict, dict]) -> None:
        """Put back what `snapshot` took (a step that failed and is retried)."""
        self.rng.bit_generator.state, self.state = snapshot

    def fork(self, rng: np.random.Generator | None = None) -> RowContext:
        """An independent copy (n > 1, beam search); it shares the generator unless given one."""
        other = RowContext(self.prompt_ids, self.rng if rng is None else rng, self.output_ids)
        other.state = copy.deepcopy(self.state)
        return other


class Sampler:
    """What every sampler declares. Subclass LogitsProcessor, TokenSelector or SearchStrategy."""

    name: ClassVar[str] = ""
    description: ClassVar[str] = ""  # one line, shown by ListSamplers and `muestra plugins`
    parameters: ClassVar[dict[str, Param]] = {}
    # True only if the sampler never changes which token has the highest score (for
    # selectors: it always picks that token). A chain of such samplers needs only the argmax.
    argmax_invariant: ClassVar[bool] = False
    # True if the lm service may run this sampler itself, several tokens in a row without asking the gateway
    # (a sampled burst): it reads only its scores, its params and each row's RowContext, keeps every per-row
    # state in RowContext.state as JSON values (numbers, strings, lists, dicts), and draws only from the
    # row's rng. The lm loads the same plugin from the same entry point; a chain with a sampler that does
    # not declare it, or that the lm lacks, is run by the gateway, a round trip per token.
    runs_in_lm: ClassVar[bool] = False

    @property
    def parameter_schema(self) -> dict:
        """JSON Schema of the params object."""
        return parameter_schema(self.parameters)

    def validate(self, params: Mapping[str, Any] | None, model: ModelInfo) -> dict:
        """Checked params with defaults filled in; raises SamplerParamError naming the field."""
        return validate_params(self.name, self.parameters, params)


class LogitsProcessor(Sampler):
    """Transforms scores row by row (temperature, top-k, penalties, ...)."""

    def process(self, logits: np.ndarray, params: Sequence[dict], rows: Sequence[RowContext]) -> np.ndarray:
        """The processed float32 [rows, vocab] scores; may modify `logits` in place and return it.

        Removed tokens get -inf. Every row must keep at least one finite score.
        """
        raise NotImplementedError


class TokenSelector(Sampler):
    """Picks one token per row from the processed scores (greedy, multinomial sampling, mirostat)."""

    def select(self, logits: np.ndarray, params: Sequence[dict], rows: Sequence[RowContext]) -> np.ndarray:
        """int64 [rows] token ids. Draw randomness only from each row's `rng`."""
        raise NotImplementedError


@dataclasses.dataclass(frozen=True)
class SearchStep:
    """One step of a search: running row i continues from input row source_rows[i] with next_tokens[i]."""

    source_rows: list[int]
    next_tokens: list[int]
    done: bool


@dataclasses.dataclass(frozen=True)
class Hypothesis:
    """A finished sequence of a search: generated ids (prompt excluded) and its score."""

    token_ids: list[int]
    score: float


class Search(Protocol):
    """The state of one request's search over several rows."""

    done: bool

    def step(self, log_probs: np.ndarray) -> SearchStep:
        """Advance by one token given processed log-probs [running rows, vocab]."""

    def results(self) -> list[Hypothesis]:
        """Finished hypotheses, best first."""


class SearchStrategy(Sampler):
    """Chooses tokens for a group of rows of one request together (beam search)."""

    def new_search(self, params: dict, model: ModelInfo, prompt_length: int, max_new_tokens: int) -> Search:
        raise NotImplementedError


SAMPLER_KINDS = (LogitsProcessor, TokenSelector, SearchStrategy)


def kind_of(sampler: Sampler) -> str:
    """ "processor", "selector" or "search"."""
    if isinstance(sampler, LogitsProcessor):
        return "processor"
    if isinstance(sampler, TokenSelector):
        return "selector"
    if isinstance(sampler, SearchStrategy):
        return "search"
    raise TypeError(f"{sampler!r} is not a LogitsProcessor, TokenSelector or SearchStrategy")


def check_sampler(sampler: object) -> None:
    """Raise TypeError or ValueError if `sampler` cannot be registered (the registry's own check)."""
    kinds = "LogitsProcessor, TokenSelector or SearchStrategy"
    check_registrable(sampler, lambda value: isinstance(value, SAMPLER_KINDS), kinds)


def pick_tokens(
    samplers: Sequence[Sampler], params: Sequence[Sequence[dict]], scores: np.ndarray, rows: Sequence[RowContext]
) -> tuple[np.ndarray, np.ndarray]:
    """Run one chain over rows that share its samplers: its processors in order, then its selector (the last).

    params[position][row] are each row's params for the sampler at that position. `scores` (float32
    [rows, vocab], the caller's own copy) ends as the processed scores the selector drew from. Returns the
    picked ids, int64 [rows]; raises RuntimeError when a sampler breaks the interface's rules. The gateway
    and the lm service both pick through this, so a row's token is the same whichever runs its chain.
    """
    *processors, selector = samplers
    shape = scores.shape
    for position, sampler in enumerate(processors):
        scores = sampler.process(scores, params[position], rows)
        if not isinstance(scores, np.ndarray) or scores.shape != shape:
            raise RuntimeError(f"{sampler.name} returned scores of the wrong shape")
    # Every row's maximum finite means no NaN (the maximum would be NaN) and a token left in every row: one
    # pass instead of two. Otherwise the whole check decides (a row may hold +inf beside finite scores).
    if not np.isfinite(scores.max(axis=-1)).all() and (
        np.isnan(scores).any() or not np.isfinite(scores).any(axis=-1).all()
    ):
        raise RuntimeError("the processed scores are NaN or remove every token")
    tokens = np.asarray(selector.select(scores, params[-1], rows), dtype=np.int64).reshape(-1)
    if tokens.shape != (len(rows),) or ((tokens < 0) | (tokens >= shape[-1])).any():
        raise RuntimeError(f"{selector.name} picked no token of the vocabulary")
    if not np.isfinite(scores[np.arange(len(rows)), tokens]).all():
        raise RuntimeError(f"{selector.name} picked a token that the processors removed")
    return tokens, scores

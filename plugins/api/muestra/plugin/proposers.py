"""The draft-proposer interface (speculative decoding).

A proposer guesses the next few tokens of a row cheaply. The lm scores the row's next token and every
draft in one forward, and the gateway runs the row's own sampler chain on those positions in order, with
the row's random generator: a draft is kept only while the chain picks exactly it, and the first
mismatch is replaced by the chain's own token. A proposer therefore changes how fast a text comes,
never which text: a wrong guess costs time only.

    class Repeat(DraftProposer):
        name = "repeat_last"
        description = "Proposes the last token again."
        parameters = {"max_draft_tokens": Int(4, "Most tokens per draft.", ge=1, le=16)}

        def propose(self, rows):
            return [[int(row.ids[-1])] * row.max_tokens for row in rows]

The gateway decides how many tokens each row may get (`DraftRow.max_tokens`, at most the request's
max_draft_tokens): it lowers that for rows whose drafts are seldom accepted, and stops asking where
speculation does not pay.

`propose` may be a coroutine (`async def`): the gateway awaits it, so a proposer may call another
service (the built-in "draft_model" proposer runs a smaller model on an lm). Its time counts in the step
it drafts for, so the adaptive policy weighs it. A proposer that raises, or whose coroutine fails, gives
no drafts for that step; the rows go on one token at a time.

A proposer that drafts with a served model learns the gateway's models from `attach`, once at start-up,
and refuses a request whose model it cannot draft for in `check_target`, before admission.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import numpy as np

from muestra.plugin.params import Bool, Int, Param, check_registrable, parameter_schema, validate_params

# Every proposer's params carry this one; the gateway's limit per row (the lm's max_draft_tokens) caps it.
MAX_DRAFT_TOKENS = Int(16, "Most draft tokens the lm verifies per step for one completion.", ge=1, le=16)
# A proposer may declare this one too; the gateway reads it.
ADAPTIVE = Bool(
    True,
    "Draft 8 tokens, more while all are accepted (up to max_draft_tokens), and pause where drafts are not worth "
    "their cost; false: draft max_draft_tokens at every step (measurements, tests).",
)


@dataclasses.dataclass
class DraftRow:
    """One completion asking for a draft."""

    # Prompt ids followed by the ids generated so far (the last one is the token the lm scores next).
    ids: np.ndarray
    # How many draft tokens this step may verify (at least 1); a proposer may return fewer, or none.
    max_tokens: int
    # The proposer's params, as its `validate` returned them.
    params: dict
    # The proposer's private per-row state (kept between steps).
    state: dict[str, Any] = dataclasses.field(default_factory=dict)
    # The step loop asking (one per lm replica of the target model): the rows of one call share it, and the
    # same group asks again before its next step. A proposer that keeps state per loop (a draft model's
    # batch) keys it by this.
    group: object = None


class DraftProposer:
    """A kind of draft: named, documented, with declared parameters."""

    name: ClassVar[str] = ""
    description: ClassVar[str] = ""  # one line, shown by `muestra plugins`
    parameters: ClassVar[dict[str, Param]] = {"max_draft_tokens": MAX_DRAFT_TOKENS}

    @property
    def parameter_schema(self) -> dict:
        return parameter_schema(self.parameters)

    def validate(self, params: Mapping[str, Any] | None) -> dict:
        """Checked params with defaults filled in; raises SamplerParamError naming the field."""
        return validate_params(self.name, self.parameters, params)

    def propose(self, rows: Sequence[DraftRow]) -> list[Sequence[int]]:
        """Per row, up to row.max_tokens draft ids (may be empty). Called between two decode steps, on the
        gateway's event loop: a plain function must keep to microseconds per row; one that waits on I/O is
        a coroutine (`async def propose`)."""
        raise NotImplementedError

    def quiet(self, row: DraftRow) -> int | None:
        """Asked after `propose` gave `row` no draft: the fewest tokens the row must take before this proposer
        could draft for it, if it can tell (None: at any step). A greedy row's next tokens may then come from
        the lm in one burst of that many steps, without drafts; None leaves the burst as long as it would be
        without speculation. A bound too high only delays drafts; it never changes the text."""
        return None

    def idle(self, group: object) -> None:
        """The step loop `group`, which asked for drafts before, has no row asking now (its rows finished or
        paused): a proposer may free what it holds for that loop. It may ask again later."""

    def attach(self, models: Any, lm_timeout_s: float) -> None:
        """Called once at the gateway's start, before any request: its served models, and how long it waits on
        an lm call. `models.text` maps each served text model's name to a model with `name`, `vocab_size`,
        `tokenizer_vocab_size`, `context_length`, `eos_token_ids`, `special_token_ids` and `replicas` (each
        with an `address`). A proposer that drafts with a served model keeps them; the default ignores them."""

    def check_target(self, params: dict, model: Any) -> None:
        """Called before admission with a request's params (as `validate` returned them) and the text model it
        samples (as in `attach`): raise if this proposer cannot draft for that model, as `validate` does for a
        bad value (SamplerParamError naming the param). A request that asked for this proposer gets
        INVALID_ARGUMENT; one that has it as the gateway's default goes without drafts. The default accepts
        every model."""


def check_proposer(proposer: object) -> None:
    """Raise TypeError or ValueError if `proposer` cannot be registered (the registry's own check)."""
    check_registrable(proposer, lambda value: isinstance(value, DraftProposer), "DraftProposer", reserved=("off",))
    if "max_draft_tokens" not in proposer.parameters:
        raise ValueError(f"{proposer.name}: parameters must declare max_draft_tokens (muestra.plugin.MAX_DRAFT_TOKENS)")

"""The one module muestra plugin authors import.

A plugin is a module with functions marked `@hookimpl`, published under the entry-point
group `muestra`:

    [project.entry-points.muestra]
    mirostat = "muestra_mirostat"

    from muestra.plugin import TokenSelector, Float, hookimpl

    class Mirostat(TokenSelector):
        name = "mirostat"
        ...

    @hookimpl
    def register_samplers(register):
        register(Mirostat())

docs/plugins.md is the tutorial.
"""

from muestra.plugin.constraints import Constraint, Grammar, check_constraint
from muestra.plugin.hookspecs import hookimpl, hookspec
from muestra.plugin.numeric import (
    column,
    group_rows,
    kth_largest,
    log_softmax,
    mass_prefix_mask,
    nucleus_threshold,
    softmax,
)
from muestra.plugin.params import (
    REQUIRED,
    Bool,
    Float,
    Int,
    Object,
    Param,
    SamplerParamError,
    String,
    StringList,
)
from muestra.plugin.proposers import ADAPTIVE, MAX_DRAFT_TOKENS, DraftProposer, DraftRow, check_proposer
from muestra.plugin.samplers import (
    Hypothesis,
    LogitsProcessor,
    ModelInfo,
    RowContext,
    Sampler,
    Search,
    SearchStep,
    SearchStrategy,
    TokenSelector,
    check_sampler,
    kind_of,
    pick_tokens,
)

PROJECT_NAME = "muestra"
ENTRY_POINT_GROUP = "muestra"

__all__ = [
    "ADAPTIVE",
    "ENTRY_POINT_GROUP",
    "MAX_DRAFT_TOKENS",
    "PROJECT_NAME",
    "REQUIRED",
    "Bool",
    "Constraint",
    "DraftProposer",
    "DraftRow",
    "Float",
    "Grammar",
    "Hypothesis",
    "Int",
    "LogitsProcessor",
    "ModelInfo",
    "Object",
    "Param",
    "RowContext",
    "Sampler",
    "SamplerParamError",
    "Search",
    "SearchStep",
    "SearchStrategy",
    "String",
    "StringList",
    "TokenSelector",
    "check_constraint",
    "check_proposer",
    "check_sampler",
    "column",
    "group_rows",
    "hookimpl",
    "hookspec",
    "kind_of",
    "kth_largest",
    "log_softmax",
    "mass_prefix_mask",
    "nucleus_threshold",
    "pick_tokens",
    "softmax",
]

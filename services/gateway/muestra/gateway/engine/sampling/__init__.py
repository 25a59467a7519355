"""Sampling in the gateway: the registry of samplers, chain validation, and running chains over a batch.

    registry = SamplerRegistry.load()                          # at start-up: pluggy, entry points
    chain = prepare_chain(registry, request.samplers, generation_config, model)  # before admission
    rows = new_rows(chain, prompt_ids, seed, n, logprobs, top_logprobs)
    kinds = [row.output_kind for row in rows]                  # lm_pb2.ARGMAX or lm_pb2.LOGITS
    result = sample_next_tokens(rows, logits, logits_row, argmax)   # every decode step

Beam search requests use SearchRequest instead of rows (see search.py).
"""

from muestra.gateway.engine.sampling.chain import (
    MAX_CHAIN_LENGTH,
    Chain,
    ChainStep,
    default_chain,
    default_specs,
    prepare_chain,
    spec_to_dict,
    validate_chain,
)
from muestra.gateway.engine.sampling.registry import PluginSummary, RegisteredSampler, SamplerRegistry
from muestra.gateway.engine.sampling.runner import (
    MAX_TOP_LOGPROBS,
    SamplingRow,
    StepResult,
    new_rows,
    request_generators,
    sample_next_tokens,
)
from muestra.gateway.engine.sampling.search import SearchRequest, run_search
from muestra.plugin import ModelInfo

__all__ = [
    "MAX_CHAIN_LENGTH",
    "MAX_TOP_LOGPROBS",
    "Chain",
    "ChainStep",
    "ModelInfo",
    "PluginSummary",
    "RegisteredSampler",
    "SamplerRegistry",
    "SamplingRow",
    "SearchRequest",
    "StepResult",
    "default_chain",
    "default_specs",
    "new_rows",
    "prepare_chain",
    "request_generators",
    "run_search",
    "sample_next_tokens",
    "spec_to_dict",
    "validate_chain",
]

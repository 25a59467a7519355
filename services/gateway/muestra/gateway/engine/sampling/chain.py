"""Sampler chains: a request's ordered {name, params} list, validated before admission.

A chain is zero or more LogitsProcessors followed by exactly one TokenSelector or
SearchStrategy; without a final selector, `sample` (multinomial sampling) is implied.
Without any chain, the model's generation_config.json gives one, in transformers' order.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
from collections.abc import Mapping, Sequence
from typing import Any

from google.protobuf import json_format

from muestra.gateway.engine.sampling.registry import SamplerRegistry
from muestra.plugin import LogitsProcessor, ModelInfo, Sampler, SamplerParamError, SearchStrategy
from muestra.runtime.errors import FailedPrecondition, InvalidArgument

log = logging.getLogger("muestra.samplers")
MAX_CHAIN_LENGTH = 32
DEFAULT_SELECTOR = "sample"


@dataclasses.dataclass(frozen=True)
class ChainStep:
    sampler: Sampler
    params: dict
    # The params as the request gave them (what an lm that runs the chain validates itself), and the
    # (name, distribution, version) of the plugin that registered the sampler.
    given: dict = dataclasses.field(default_factory=dict)
    source: tuple[str, str, str] = ("", "", "")


@dataclasses.dataclass(frozen=True)
class Chain:
    """Validated processors, then the selector or search that picks the tokens."""

    processors: tuple[ChainStep, ...]
    last: ChainStep

    @property
    def steps(self) -> tuple[ChainStep, ...]:
        return (*self.processors, self.last)

    @property
    def is_search(self) -> bool:
        return isinstance(self.last.sampler, SearchStrategy)

    @property
    def argmax_only(self) -> bool:
        """Whether the chosen token is always the argmax of the raw logits."""
        return all(step.sampler.argmax_invariant for step in self.steps)

    @property
    def shape(self) -> tuple[int, ...]:
        """Identity of the samplers in order: rows with equal shapes are processed together."""
        return tuple(id(step.sampler) for step in self.steps)

    @functools.cached_property
    def lm_json(self) -> str | None:
        """The chain as an lm runs it (RowSampler.chain_json), or None when no lm could: a search, a sampler
        that does not declare runs_in_lm, or params that JSON cannot carry."""
        if self.is_search or not all(step.sampler.runs_in_lm for step in self.steps):
            return None
        try:
            return json.dumps([{"name": step.sampler.name, "params": step.given} for step in self.steps])
        except (TypeError, ValueError):
            return None

    @property
    def sources(self) -> frozenset[tuple[str, str, str]]:
        return frozenset(step.source for step in self.steps)

    def describe(self) -> list[dict[str, Any]]:
        """The chain as {name, params} dicts, defaults filled in (for logs and echoes)."""
        return [{"name": step.sampler.name, "params": step.params} for step in self.steps]


def spec_to_dict(spec: Any) -> dict[str, Any]:
    """A SamplerSpec message (params: google.protobuf.Struct) or a mapping, as {name, params}."""
    if isinstance(spec, Mapping):
        return {"name": spec.get("name", ""), "params": spec.get("params") or {}}
    return {"name": spec.name, "params": json_format.MessageToDict(spec.params) if spec.HasField("params") else {}}


def validate_chain(registry: SamplerRegistry, specs: Sequence[Any], model: ModelInfo, field: str = "samplers") -> Chain:
    """A Chain from SamplerSpecs or {name, params} mappings; InvalidArgument names the bad field."""
    if len(specs) > MAX_CHAIN_LENGTH:
        raise InvalidArgument(field, f"at most {MAX_CHAIN_LENGTH} samplers, got {len(specs)}")
    steps = []
    for i, raw in enumerate(specs):
        spec = spec_to_dict(raw)
        name = spec["name"]
        if name not in registry:
            raise InvalidArgument(
                f"{field}[{i}].name", f"unknown sampler {name!r}; registered: {', '.join(registry.names())}"
            )
        sampler = registry.get(name)
        if steps and not isinstance(steps[-1].sampler, LogitsProcessor):
            raise InvalidArgument(
                f"{field}[{i}]", f"{name!r} follows {steps[-1].sampler.name!r}, which picks the token and must be last"
            )
        try:
            params = sampler.validate(spec["params"], model)
        except SamplerParamError as exc:
            raise InvalidArgument(f"{field}[{i}].params.{exc.field}", f"{exc.message} (sampler {name!r})") from None
        steps.append(ChainStep(sampler, params, spec["params"], registry.source(name)))
    if not steps or isinstance(steps[-1].sampler, LogitsProcessor):
        if DEFAULT_SELECTOR not in registry:
            raise InvalidArgument(
                field, f"the chain needs a final selector (the default {DEFAULT_SELECTOR!r} is disabled)"
            )
        selector = registry.get(DEFAULT_SELECTOR)
        steps.append(ChainStep(selector, selector.validate({}, model), {}, registry.source(DEFAULT_SELECTOR)))
    return Chain(tuple(steps[:-1]), steps[-1])


# transformers' GenerationConfig defaults for the fields that pick processors.
_HF_DEFAULTS = {
    "do_sample": False,
    "num_beams": 1,
    "temperature": 1.0,
    "top_k": 50,
    "top_p": 1.0,
    "min_p": None,
    "typical_p": 1.0,
    "repetition_penalty": 1.0,
    "length_penalty": 1.0,
    "early_stopping": False,
    "sequence_bias": None,
}


def default_specs(generation_config: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The chain transformers' generate() would use for this generation_config.json.

    Order as in GenerationMixin._get_logits_processor: sequence bias, repetition penalty,
    then (only when do_sample) temperature, top_k, top_p, min_p, typical_p; then the
    selector: beam_search when num_beams > 1, sample when do_sample, else greedy.
    """
    config = dict(_HF_DEFAULTS)
    config.update({key: value for key, value in generation_config.items() if value is not None})
    specs: list[dict[str, Any]] = []
    bias = {}
    for tokens, amount in config["sequence_bias"] or []:
        if len(tokens) == 1:
            bias[str(tokens[0])] = amount
        else:
            log.warning("generation_config sequence_bias for %s ignored: only single tokens are supported", tokens)
    if bias:
        specs.append({"name": "logit_bias", "params": {"logit_bias": bias}})
    if config["repetition_penalty"] != 1.0:
        specs.append({"name": "repetition_penalty", "params": {"repetition_penalty": config["repetition_penalty"]}})
    if config["num_beams"] > 1:
        if config["do_sample"]:
            log.warning("generation_config asks for beam sampling; using deterministic beam search")
        keys = ("num_beams", "length_penalty", "early_stopping")
        specs.append({"name": "beam_search", "params": {key: config[key] for key in keys}})
        return specs
    if not config["do_sample"]:
        specs.append({"name": "greedy", "params": {}})
        return specs
    if config["temperature"] != 1.0:
        specs.append({"name": "temperature", "params": {"temperature": config["temperature"]}})
    if config["top_k"]:
        specs.append({"name": "top_k", "params": {"top_k": config["top_k"]}})
    if config["top_p"] < 1.0:
        specs.append({"name": "top_p", "params": {"top_p": config["top_p"]}})
    if config["min_p"] is not None:
        specs.append({"name": "min_p", "params": {"min_p": config["min_p"]}})
    if config["typical_p"] < 1.0:
        specs.append({"name": "typical_p", "params": {"typical_p": config["typical_p"]}})
    specs.append({"name": "sample", "params": {}})
    return specs


def default_chain(registry: SamplerRegistry, generation_config: Mapping[str, Any], model: ModelInfo) -> Chain:
    """The model's default chain; FailedPrecondition if its generation_config.json is unusable."""
    try:
        return validate_chain(registry, default_specs(generation_config), model)
    except InvalidArgument as exc:
        setting = exc.field.rsplit(".", 1)[-1]  # samplers[i].params.temperature -> temperature
        message = str(exc).split(": ", 1)[-1]
        raise FailedPrecondition(f"the model's generation_config.json: {setting} {message}") from None


def prepare_chain(
    registry: SamplerRegistry, specs: Sequence[Any], generation_config: Mapping[str, Any], model: ModelInfo
) -> Chain:
    """The request's chain if it gave one, else the model's default chain."""
    if specs:
        return validate_chain(registry, specs, model)
    return default_chain(registry, generation_config, model)

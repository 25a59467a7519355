"""The built-in samplers, one per module. Each is an ordinary plugin of its own, registered through
the same `register_samplers` hook as third-party ones and named after its sampler, so
MUESTRA_DISABLE_PLUGINS=typical_p disables the built-in typical_p.
"""

from collections.abc import Mapping
from typing import Any

from muestra.plugin import Sampler, check_sampler
from muestra.plugin.builtins.beam_search import BeamSearchStrategy
from muestra.plugin.builtins.frequency_penalty import FrequencyPenalty
from muestra.plugin.builtins.greedy import Greedy
from muestra.plugin.builtins.logit_bias import LogitBias
from muestra.plugin.builtins.min_p import MinP
from muestra.plugin.builtins.presence_penalty import PresencePenalty
from muestra.plugin.builtins.repetition_penalty import RepetitionPenalty
from muestra.plugin.builtins.sample import Sample
from muestra.plugin.builtins.temperature import Temperature
from muestra.plugin.builtins.top_k import TopK
from muestra.plugin.builtins.top_p import TopP
from muestra.plugin.builtins.typical_p import TypicalP
from muestra.plugin.manager import BuiltinPlugin, Plugins, Registered, Registration

# Plugin name -> plugin, in registration order (what SamplerRegistry.load takes as builtin_modules).
BUILTIN_SAMPLER_MODULES = {
    sampler.name: BuiltinPlugin(__name__, samplers=(sampler,))
    for sampler in (
        Greedy(),
        Sample(),
        BeamSearchStrategy(),
        LogitBias(),
        RepetitionPenalty(),
        PresencePenalty(),
        FrequencyPenalty(),
        Temperature(),
        TopK(),
        TopP(),
        MinP(),
        TypicalP(),
    )
}


def accept_sampler(sampler: Sampler) -> Registration:
    """One register(sampler) call, checked (TypeError or ValueError for something that is not a sampler)."""
    check_sampler(sampler)
    return Registration(sampler.name, sampler)


def load_samplers(
    env: Mapping[str, str] | None = None, builtin_modules: Mapping[str, Any] = BUILTIN_SAMPLER_MODULES
) -> tuple[Plugins, list[Registered]]:
    """The plugins (built-ins, then every `muestra` entry point, minus MUESTRA_DISABLE_PLUGINS) and the samplers
    they registered: what the gateway serves, and what the lm service runs in sampled bursts."""
    plugins = Plugins.load(builtin_modules, env)
    return plugins, plugins.call_register_hook("register_samplers", "sampler", accept_sampler)

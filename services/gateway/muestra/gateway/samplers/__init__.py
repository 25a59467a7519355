"""The built-in samplers, one per module. Each is an ordinary plugin of its own, registered through
the same `register_samplers` hook as third-party ones and named after its sampler, so
MUESTRA_DISABLE_PLUGINS=typical_p disables the built-in typical_p.
"""

from muestra.gateway.samplers.beam_search import BeamSearchStrategy
from muestra.gateway.samplers.frequency_penalty import FrequencyPenalty
from muestra.gateway.samplers.greedy import Greedy
from muestra.gateway.samplers.logit_bias import LogitBias
from muestra.gateway.samplers.min_p import MinP
from muestra.gateway.samplers.presence_penalty import PresencePenalty
from muestra.gateway.samplers.repetition_penalty import RepetitionPenalty
from muestra.gateway.samplers.sample import Sample
from muestra.gateway.samplers.temperature import Temperature
from muestra.gateway.samplers.top_k import TopK
from muestra.gateway.samplers.top_p import TopP
from muestra.gateway.samplers.typical_p import TypicalP
from muestra.plugin.manager import BuiltinPlugin

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

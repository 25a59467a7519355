"""The built-in samplers. Each module is an ordinary plugin, registered through the same
`register_samplers` hook as third-party ones; its plugin name is its module name, so
MUESTRA_DISABLE_PLUGINS=typical_p disables the built-in typical_p.
"""

BUILTIN_SAMPLER_MODULES = {
    name: f"muestra.gateway.samplers.{name}"
    for name in (
        "greedy",
        "sample",
        "beam_search",
        "logit_bias",
        "repetition_penalty",
        "presence_penalty",
        "frequency_penalty",
        "temperature",
        "top_k",
        "top_p",
        "min_p",
        "typical_p",
    )
}

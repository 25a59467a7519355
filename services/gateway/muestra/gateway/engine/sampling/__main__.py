"""`python -m muestra.gateway.engine.sampling`: the sampler plugins this environment would load, without a gateway.

The same view as the gateway's ListPlugins and ListSamplers (and `muestra plugins`), honouring
MUESTRA_DISABLE_PLUGINS.
"""

from __future__ import annotations

import logging

from muestra.gateway.engine.sampling.registry import SamplerRegistry


def main() -> None:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    registry = SamplerRegistry.load()
    print(f"{'plugin':<20} {'distribution':<20} {'version':<10} samplers")
    for plugin in registry.plugins():
        samplers = "(disabled)" if plugin.disabled else ", ".join(plugin.samplers)
        print(f"{plugin.name:<20} {plugin.distribution:<20} {plugin.version:<10} {samplers}")
    print()
    print(f"{'sampler':<20} {'kind':<10} {'argmax-invariant':<17} description")
    for entry in registry.list():
        invariant = "yes" if entry.sampler.argmax_invariant else "no"
        print(f"{entry.name:<20} {entry.kind:<10} {invariant:<17} {entry.sampler.description}")


if __name__ == "__main__":
    main()

"""Hook specifications. Hooks run once, at start-up, to register things."""

import pluggy

hookspec = pluggy.HookspecMarker("muestra")
hookimpl = pluggy.HookimplMarker("muestra")


@hookspec
def register_samplers(register):
    """Register token samplers: call register(sampler) with a LogitsProcessor, TokenSelector or SearchStrategy."""


@hookspec
def register_schedulers(register):
    """Register diffusion schedulers: call register(name, factory, aliases=()) for each."""


@hookspec
def register_constraints(register):
    """Register output-constraint kinds: call register(constraint) with a Constraint."""


@hookspec
def register_proposers(register):
    """Register draft proposers for speculative decoding: call register(proposer) with a DraftProposer."""

"""Draft proposers for speculative decoding, registered through the `register_proposers` hook.

    registry = ProposerRegistry.load()             # at start-up: pluggy, entry points
    choice = registry.choose(request.speculation)  # before admission: INVALID_ARGUMENT names the field

The built-in "ngram" proposer is an ordinary plugin, registered as third-party ones are;
MUESTRA_DISABLE_PLUGINS names it by its name.
"""

from muestra.gateway.proposers.ngram import NgramProposer
from muestra.plugin.manager import BuiltinPlugin

# Plugin name -> plugin, in registration order (what ProposerRegistry.load takes as builtin_modules).
BUILTIN_PROPOSER_MODULES = {
    proposer.name: BuiltinPlugin(__name__, proposers=(proposer,)) for proposer in (NgramProposer(),)
}

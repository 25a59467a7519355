"""Draft proposers for speculative decoding, registered through the `register_proposers` hook.

    registry = ProposerRegistry.load()             # at start-up: pluggy, entry points
    choice = registry.choose(request.speculation)  # before admission: INVALID_ARGUMENT names the field

The built-in "ngram" and "draft_model" proposers are ordinary plugins, registered as third-party ones are;
MUESTRA_DISABLE_PLUGINS names them by their names. "draft_model" also needs the gateway's served models
(the engine calls its `attach` at start-up).
"""

from muestra.gateway.engine.proposers.draft_model import DraftModelProposer
from muestra.gateway.engine.proposers.ngram import NgramProposer
from muestra.plugin.manager import BuiltinPlugin

# Plugin name -> plugin, in registration order (what ProposerRegistry.load takes as builtin_modules).
BUILTIN_PROPOSER_MODULES = {
    proposer.name: BuiltinPlugin(__name__, proposers=(proposer,))
    for proposer in (NgramProposer(), DraftModelProposer())
}

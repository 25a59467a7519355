"""The engine's clients of the other services (tokenizer, diffusion; the lm's is generation/lm_client.py), all
mapping a failed call to the request's error the same way (errors.py)."""

from muestra.gateway.engine.clients.diffusion import DiffusionClient
from muestra.gateway.engine.clients.errors import call_failed
from muestra.gateway.engine.clients.tokenizer import TokenizerClient

__all__ = ["DiffusionClient", "TokenizerClient", "call_failed"]

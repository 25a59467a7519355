"""The engine's clients of the other services: the lm (lm.py, over the BatchSteps stream of step_stream.py), the
tokenizer (tokenizer.py) and diffusion (diffusion.py), with the served models they reach (backends.py); every one
names a failed call the same way and maps it to the request's error (errors.py)."""

from muestra.gateway.engine.clients.diffusion import DiffusionClient
from muestra.gateway.engine.clients.errors import call_failed
from muestra.gateway.engine.clients.tokenizer import TokenizerClient

__all__ = ["DiffusionClient", "TokenizerClient", "call_failed"]

"""Python client for the muestra gateway (gRPC).

from muestra.client import Client
with Client("127.0.0.1:50051") as client:
    for delta in client.generate("El cielo es", max_tokens=40, temperature=0.7, seed=1):
        print(delta.text, end="", flush=True)
"""

from muestra.client.aio import AsyncClient, AsyncGeneration
from muestra.client.errors import (
    AuthenticationError,
    DeadlineExceededError,
    InvalidArgumentError,
    MuestraError,
    NotFoundError,
    ResourceExhaustedError,
    UnavailableError,
)
from muestra.client.images import GeneratedImage, Progress
from muestra.client.sync import Client, Generation
from muestra.client.types import Completion, Delta, sampler_chain

__all__ = [
    "AsyncClient",
    "AsyncGeneration",
    "AuthenticationError",
    "Client",
    "Completion",
    "DeadlineExceededError",
    "Delta",
    "GeneratedImage",
    "Generation",
    "InvalidArgumentError",
    "MuestraError",
    "NotFoundError",
    "Progress",
    "ResourceExhaustedError",
    "UnavailableError",
    "sampler_chain",
]

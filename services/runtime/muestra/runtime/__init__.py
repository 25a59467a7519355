"""The service runtime shared by every muestra service."""

from muestra.runtime.config import ServiceConfig, load_config
from muestra.runtime.errors import (
    DeadlineExceeded,
    FailedPrecondition,
    InvalidArgument,
    MuestraError,
    NotFound,
    ResourceExhausted,
    Unauthenticated,
    Unavailable,
)
from muestra.runtime.server import ServiceSpec, run_service

__all__ = [
    "DeadlineExceeded",
    "FailedPrecondition",
    "InvalidArgument",
    "MuestraError",
    "NotFound",
    "ResourceExhausted",
    "ServiceConfig",
    "ServiceSpec",
    "Unauthenticated",
    "Unavailable",
    "load_config",
    "run_service",
]

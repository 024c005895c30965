"""Backends: the one seam between pymq's client and Spark code and a broker (see :mod:`.base`)."""

from .base import (
    Backend,
    BackendConfig,
    PullBatch,
    QueueBounds,
    SendBackOutcome,
    SendRequest,
    backend_config,
    cached_backend,
    open_backend,
)

__all__ = [
    "Backend",
    "BackendConfig",
    "PullBatch",
    "QueueBounds",
    "SendBackOutcome",
    "SendRequest",
    "backend_config",
    "cached_backend",
    "open_backend",
]

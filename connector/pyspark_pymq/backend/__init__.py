"""Backends: the one seam between pymq's client and Spark code and a broker (see :mod:`.base`)."""

# The client package is imported first: its classes import backend.base, and backend.base
# imports the client's value objects, so the cycle resolves only in this order.
from .. import client as _client  # noqa: F401  # isort: skip
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

"""The pymq client: Producer, PullConsumer, Admin and their value objects.

Each name is imported on first use: a process that needs only some of them (Spark's
streaming source runner reads offsets, it never produces or administers) does not pay
for the others' imports when it starts.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..errors import PymqError
    from .admin import Admin, GroupConfig, TopicConfig
    from .consumer import PullConsumer, SendBackColumns, SendBackResult
    from .message import (
        Message,
        MessageExt,
        MessageQueue,
        PullResult,
        PullStatus,
        SendResult,
        SendStatus,
    )
    from .producer import Producer
    from .transaction import LocalTransactionState, TransactionProducer, TransactionSendResult

__all__ = [
    "Admin",
    "GroupConfig",
    "LocalTransactionState",
    "Message",
    "MessageExt",
    "MessageQueue",
    "Producer",
    "PullConsumer",
    "PullResult",
    "PullStatus",
    "PymqError",
    "SendBackColumns",
    "SendBackResult",
    "SendResult",
    "SendStatus",
    "TopicConfig",
    "TransactionProducer",
    "TransactionSendResult",
]

_HOMES = {
    "..errors": ("PymqError",),
    ".admin": ("Admin", "GroupConfig", "TopicConfig"),
    ".consumer": ("PullConsumer", "SendBackColumns", "SendBackResult"),
    ".message": ("Message", "MessageExt", "MessageQueue", "PullResult", "PullStatus", "SendResult",
                 "SendStatus"),
    ".producer": ("Producer",),
    ".transaction": ("LocalTransactionState", "TransactionProducer", "TransactionSendResult"),
}
_HOME = {name: module for module, names in _HOMES.items() for name in names}


def __getattr__(name: str) -> Any:
    module = _HOME.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value  # later look-ups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(__all__)

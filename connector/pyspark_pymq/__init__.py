"""pymq for PySpark: ``spark.readStream.format("pymq")`` and a RocketMQ-style client.

Spark imports this module while it looks up data sources, so importing it must
stay cheap and must never raise: everything is loaded lazily on first use.

Public API::

    from pyspark_pymq import Producer, PullConsumer, Admin, Message, MessageQueue
"""

from __future__ import annotations

import contextlib
from typing import Any

with contextlib.suppress(ImportError):  # before anything loads grpc: see pymq_proto
    import pymq_proto  # noqa: F401

__all__ = [
    "Admin",
    "DefaultSource",
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

__version__ = "0.1.0"

_CLIENT_NAMES = frozenset(__all__) - {"DefaultSource"}


def __getattr__(name: str) -> Any:
    # Spark's data source look-up uses hasattr(module, "DefaultSource"): any
    # failure must surface as AttributeError so one broken import cannot
    # disable every other pyspark_* data source in the session.
    try:
        if name == "DefaultSource":
            from .spark.data_source import PymqDataSource

            return PymqDataSource
        if name in _CLIENT_NAMES:
            from . import client

            return getattr(client, name)
    except Exception as err:
        raise AttributeError(f"pyspark_pymq.{name} could not be loaded: {err!r}") from err
    raise AttributeError(f"module 'pyspark_pymq' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(__all__)

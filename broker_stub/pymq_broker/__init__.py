"""The pymq broker: RocketMQ's store and reliability rules behind a gRPC service.

Layers, as in RocketMQ: ``store`` (commit log, consume queues, index, flush,
schedule service; no gRPC) -> ``manager`` (topics, consumer offsets,
subscription groups) -> ``processor`` (send, pull, send back, offsets, admin)
-> ``remoting`` (the thin gRPC layer) -> ``controller`` (wires them).

Run it as a process (``pymq-broker``) or in-process::

    from pymq_broker import EmbeddedBroker
    with EmbeddedBroker() as broker:
        print(broker.endpoint)
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pymq_proto  # noqa: F401  (first: it sets gRPC's fork default before grpc loads)

__all__ = ["BrokerConfig", "BrokerController", "EmbeddedBroker", "MessageStoreConfig"]

if TYPE_CHECKING:
    from .broker_config import BrokerConfig
    from .controller import BrokerController
    from .embedded import EmbeddedBroker
    from .store.config import MessageStoreConfig


def __getattr__(name: str) -> Any:
    if name == "EmbeddedBroker":
        from .embedded import EmbeddedBroker

        return EmbeddedBroker
    if name == "BrokerController":
        from .controller import BrokerController

        return BrokerController
    if name == "BrokerConfig":
        from .broker_config import BrokerConfig

        return BrokerConfig
    if name == "MessageStoreConfig":
        from .store.config import MessageStoreConfig

        return MessageStoreConfig
    raise AttributeError(f"module 'pymq_broker' has no attribute {name!r}")

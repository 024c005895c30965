"""The pymq client: Producer, PullConsumer, Admin and their value objects."""

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

"""The pymq client: Producer, PullConsumer, Admin and their value objects."""

from ..errors import PymqError
from .admin import Admin, TopicConfig
from .consumer import PullConsumer
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

__all__ = [
    "Admin",
    "Message",
    "MessageExt",
    "MessageQueue",
    "Producer",
    "PullConsumer",
    "PullResult",
    "PullStatus",
    "PymqError",
    "SendResult",
    "SendStatus",
    "TopicConfig",
]

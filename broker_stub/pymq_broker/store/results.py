"""Outcomes of store calls, with RocketMQ's status names."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field


class PutMessageStatus(enum.Enum):
    PUT_OK = "PUT_OK"
    FLUSH_DISK_TIMEOUT = "FLUSH_DISK_TIMEOUT"
    MESSAGE_ILLEGAL = "MESSAGE_ILLEGAL"
    PROPERTIES_SIZE_EXCEEDED = "PROPERTIES_SIZE_EXCEEDED"
    SERVICE_NOT_AVAILABLE = "SERVICE_NOT_AVAILABLE"
    UNKNOWN_ERROR = "UNKNOWN_ERROR"


class GetMessageStatus(enum.Enum):
    FOUND = "FOUND"
    NO_MATCHED_MESSAGE = "NO_MATCHED_MESSAGE"
    OFFSET_OVERFLOW_BADLY = "OFFSET_OVERFLOW_BADLY"
    OFFSET_OVERFLOW_ONE = "OFFSET_OVERFLOW_ONE"
    OFFSET_TOO_SMALL = "OFFSET_TOO_SMALL"
    NO_MATCHED_LOGIC_QUEUE = "NO_MATCHED_LOGIC_QUEUE"
    NO_MESSAGE_IN_QUEUE = "NO_MESSAGE_IN_QUEUE"


@dataclass(slots=True)
class PutMessageResult:
    status: PutMessageStatus
    topic: str = ""
    queue_id: int = 0
    queue_offset: int = 0
    physical_offsets: list[int] = field(default_factory=list)
    end_offset: int = 0  # what SYNC_FLUSH waits to see durable
    store_timestamp: int = 0
    remark: str = ""

    @property
    def ok(self) -> bool:
        return self.status == PutMessageStatus.PUT_OK


class PutMessageError(Exception):
    """A put the store refused for now (SERVICE_NOT_AVAILABLE: a full disk) where the caller must
    not move on past it: delayed and timer messages wait in their queues until it is written.
    ``written``: how many of the caller's messages were written before it."""

    def __init__(self, result: PutMessageResult, what: str, written: int = 0) -> None:
        super().__init__(f"{what}: {result.status.value}: {result.remark}")
        self.result = result
        self.written = written


@dataclass(slots=True)
class GetMessageResult:
    status: GetMessageStatus
    next_begin_offset: int
    min_offset: int
    max_offset: int
    records: bytes = b""
    message_count: int = 0
    sizes: bytes = b""  # each record's size, little-endian int32 (the consume queue's entries)

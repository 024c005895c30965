"""One error root for pymq, carrying the broker's RocketMQ ResponseCode.

Every failure that crosses the client raises a :class:`PymqError` subclass;
``error.code`` is the broker's ``ResponseCode`` name (``"TOPIC_NOT_EXIST"``,
``"MESSAGE_ILLEGAL"``...) and ``error.remark`` its explanation.
"""

from __future__ import annotations

__all__ = [
    "BrokerUnavailableError",
    "IllegalArgumentError",
    "MessageIllegalError",
    "NoPermissionError",
    "OffsetIllegalError",
    "PymqError",
    "RequestTimeoutError",
    "SubscriptionParseError",
    "SystemBusyError",
    "TopicExistError",
    "TopicNotExistError",
    "error_for_code",
]


class PymqError(Exception):
    """Root of pymq's errors. ``code`` is RocketMQ's ResponseCode name."""

    code: str = "SYSTEM_ERROR"

    def __init__(self, remark: str, *, code: str | None = None) -> None:
        super().__init__(remark)
        self.remark = remark
        if code is not None:
            self.code = code

    def __str__(self) -> str:
        return f"[{self.code}] {self.remark}"


class TopicNotExistError(PymqError):
    code = "TOPIC_NOT_EXIST"


class TopicExistError(PymqError):
    code = "TOPIC_EXIST_ALREADY"


class MessageIllegalError(PymqError):
    code = "MESSAGE_ILLEGAL"


class NoPermissionError(PymqError):
    code = "NO_PERMISSION"


class SubscriptionParseError(PymqError):
    code = "SUBSCRIPTION_PARSE_FAILED"


class SystemBusyError(PymqError):
    code = "SYSTEM_BUSY"


class IllegalArgumentError(PymqError):
    code = "ILLEGAL_ARGUMENT"


class OffsetIllegalError(PymqError):
    """An offset outside a queue's [min, max] range (e.g. expired by retention)."""

    code = "PULL_OFFSET_MOVED"


class BrokerUnavailableError(PymqError):
    """The broker could not be reached (connection refused, shut down, unreachable)."""

    code = "SERVICE_NOT_AVAILABLE"


class RequestTimeoutError(PymqError):
    """The broker did not answer within the request's timeout."""

    code = "REQUEST_TIMEOUT"


_BY_CODE: dict[str, type[PymqError]] = {
    cls.code: cls
    for cls in (
        TopicNotExistError,
        TopicExistError,
        MessageIllegalError,
        NoPermissionError,
        SubscriptionParseError,
        SystemBusyError,
        IllegalArgumentError,
        OffsetIllegalError,
        BrokerUnavailableError,
        RequestTimeoutError,
    )
}


def error_for_code(code: str, remark: str) -> PymqError:
    """The typed error for a broker ResponseCode name."""
    cls = _BY_CODE.get(code, PymqError)
    return cls(remark, code=code)

"""One error root for pymq, carrying the broker's RocketMQ ResponseCode and whether to retry.

Every failure that crosses the client raises a :class:`PymqError` subclass;
``error.code`` is the broker's ``ResponseCode`` name (``"TOPIC_NOT_EXIST"``,
``"MESSAGE_ILLEGAL"``...) and ``error.remark`` its explanation.

``error.retriable`` (a class attribute, as kafka-python's ``KafkaError.retriable``)
says whether the same request may succeed if it is sent again, to the same
broker later or to another one: the producer retries a send only then, and
route look-ups keep their last route only then. Retriable, as RocketMQ's
producer retries them:

* :class:`BrokerUnavailableError` (``SERVICE_NOT_AVAILABLE``): the broker is
  down, unreachable or shutting down.
* :class:`RequestTimeoutError` (``REQUEST_TIMEOUT``): no answer in time
  (RocketMQ's RemotingTimeoutException); the request may still have been
  applied, so a retried send can store a message twice.
* :class:`SystemBusyError` (``SYSTEM_BUSY``, and RocketMQ's ``FLOW_CONTROL`` /
  ``POLLING_FULL``): the broker sheds load; a later or other broker may take it.

Not retriable: the request's own fault, which a retry would meet again
(``MESSAGE_ILLEGAL``, ``ILLEGAL_ARGUMENT``, ``SUBSCRIPTION_PARSE_FAILED``,
``PULL_OFFSET_MOVED``, ``TOPIC_EXIST_ALREADY``), and, unlike RocketMQ's
producer, ``TOPIC_NOT_EXIST`` and ``NO_PERMISSION``: RocketMQ retries those
broker answers because its name-server routes can be stale for one broker of
many, while pymq raises them for the topic's own state (no such topic, no
writable queue, a reserved name, an ACL refusal), and retrying would only
hide the refusal (a oneway send would drop it). The root ``PymqError``
(``SYSTEM_ERROR`` and codes without a class of their own) is not retriable
either: it is also what a misuse of the client raises ("the producer is
closed").
"""

from __future__ import annotations

from typing import ClassVar

__all__ = [
    "AccessDeniedError",
    "AuthenticationError",
    "BrokerNotReadableError",
    "BrokerUnavailableError",
    "IllegalArgumentError",
    "MessageIllegalError",
    "NoPermissionError",
    "OffsetIllegalError",
    "PymqError",
    "RequestTimeoutError",
    "SubscriptionParseError",
    "SystemBusyError",
    "TlsRequiredError",
    "TopicExistError",
    "TopicNotExistError",
    "error_for_code",
]

# what a BrokerUnavailableError of the embedded broker tells to check (the source adds the option's name)
UNREACHABLE_HINT = "Check that pymq-broker runs there and the endpoint is right"
# the same for Apache RocketMQ: one address (the remoting client), the cluster (name servers, the source)
CONNECT_HINT = "Check the address and that the broker or name server runs there"
NAMESRV_HINT = "Check that the name servers and their brokers run and namesrvAddr is right"

# the code of a pull or commit whose consumer group the broker does not have (RocketMQ's brokers with
# autoCreateSubscriptionGroup=false); the source turns it into how to create the group
GROUP_NOT_EXIST = "SUBSCRIPTION_GROUP_NOT_EXIST"


class PymqError(Exception):
    """Root of pymq's errors. ``code`` is RocketMQ's ResponseCode name.

    ``retriable`` is True on the classes whose failures another try may mend
    (see the module docstring); it is a property of the class, kept when an
    error is re-raised as ``type(err)(message, code=err.code)``.
    """

    code: str = "SYSTEM_ERROR"
    retriable: ClassVar[bool] = False

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


class AccessDeniedError(NoPermissionError):
    """An ACL of the broker refuses this user the action on the resource (RocketMQ 5's FORBIDDEN).

    The message names the user, the resource and the action; a Super user grants it
    (``Admin.create_acl``, ``pymq-admin acl create``).
    """

    code = "FORBIDDEN"


class AuthenticationError(PymqError):
    """The broker does not accept the request's signature (RocketMQ 5's UNAUTHORIZED): no
    credentials, an unknown or disabled user, a wrong secret key, or a date-time outside
    the broker's clock-skew window."""

    code = "UNAUTHORIZED"


class TlsRequiredError(PymqError):
    """The client and the broker disagree on TLS (a plaintext client and a TLS broker, or
    a certificate the other side does not trust): no retry mends it."""

    code = "SERVICE_NOT_AVAILABLE"


class SubscriptionParseError(PymqError):
    code = "SUBSCRIPTION_PARSE_FAILED"


class SystemBusyError(PymqError):
    """The broker is overloaded (SYSTEM_BUSY, or RocketMQ's FLOW_CONTROL / POLLING_FULL)."""

    code = "SYSTEM_BUSY"
    retriable = True


class IllegalArgumentError(PymqError):
    code = "ILLEGAL_ARGUMENT"


class OffsetIllegalError(PymqError):
    """An offset outside a queue's [min, max] range (e.g. expired by retention)."""

    code = "PULL_OFFSET_MOVED"


class BrokerUnavailableError(PymqError):
    """The broker could not be reached (connection refused, shut down, unreachable)."""

    code = "SERVICE_NOT_AVAILABLE"
    retriable = True


class BrokerNotReadableError(BrokerUnavailableError):
    """The broker answers but serves no reads now: a RocketMQ broker whose master is down and whose
    slave refuses every pull (slaveReadEnable=false). Its queues are read on once it serves again."""


class RequestTimeoutError(PymqError):
    """The broker did not answer within the request's timeout."""

    code = "REQUEST_TIMEOUT"
    retriable = True


_BY_CODE: dict[str, type[PymqError]] = {
    cls.code: cls
    for cls in (
        AccessDeniedError,
        AuthenticationError,
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
    """The typed error for a broker ResponseCode name (its class says whether it is retriable)."""
    cls = _BY_CODE.get(code, PymqError)
    return cls(remark, code=code)

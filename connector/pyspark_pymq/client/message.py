"""Typed value objects of the client API: what you send and what you receive."""

from __future__ import annotations

import enum
import numbers
import operator
import os
import secrets
import threading
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pymq_proto.record import MessageConst, encode_properties, offset_msg_id

__all__ = [
    "Message",
    "MessageExt",
    "MessageQueue",
    "PullResult",
    "PullStatus",
    "RowKeys",
    "SendBackColumns",
    "SendResult",
    "SendStatus",
    "SystemMessage",
]

MAX_DELAY_LEVEL_HINT = 18
SEND_MODES: tuple[str, ...] = ("sync", "async", "oneway")
DEFAULT_MAX_MESSAGE_SIZE = 4 * 1024 * 1024  # RocketMQ's maxMessageSize


@dataclass(frozen=True, order=True, slots=True)
class MessageQueue:
    """RocketMQ's MessageQueue: (topic, broker name, queue id)."""

    topic: str
    broker_name: str
    queue_id: int

    def __str__(self) -> str:
        return f"{self.topic}@{self.broker_name}#{self.queue_id}"


@dataclass(slots=True)
class Message:
    """A message to send.

    Args:
        topic: the topic name.
        body: the payload; ``str`` is encoded as UTF-8.
        tags: one tag (RocketMQ's TAGS), used by tag subscriptions ``"A || B"``.
        keys: business keys (RocketMQ's KEYS), indexed for look-ups by key.
        properties: user properties (strings).
        delay_level: 0 to send now, N to deliver after the broker's delay level N
            (default levels: 1s 5s 10s 30s 1m 2m 3m ... 2h).
        deliver_time_ms: deliver at this time (milliseconds since the epoch), to the
            millisecond: RocketMQ 5's timer (``Message.setDeliverTimeMs``, property
            TIMER_DELIVER_MS), on the embedded broker and on Apache RocketMQ 5. Not with
            ``delay_level``; a batch's messages cannot have one.
        sharding_key: messages with the same key go to the same queue, in order.

    Example::

        Message("orders", b'{"id": 7}', tags="created", keys=["order-7"], sharding_key="7")
    """

    topic: str
    body: bytes
    tags: str | None = None
    keys: tuple[str, ...] = ()
    properties: dict[str, str] = field(default_factory=dict)
    delay_level: int = 0
    sharding_key: str | None = None
    flag: int = 0
    deliver_time_ms: int | None = None

    def __init__(
        self,
        topic: str,
        body: bytes | bytearray | memoryview | str,
        tags: str | None = None,
        keys: Iterable[str] | str = (),
        properties: Mapping[str, str] | None = None,
        delay_level: int = 0,
        sharding_key: str | None = None,
        flag: int = 0,
        deliver_time_ms: int | None = None,
    ) -> None:
        if not isinstance(topic, str) or not topic:
            raise ValueError(f"Message topic must be a non-empty string, got {topic!r}")
        if isinstance(body, str):
            body = body.encode()
        elif isinstance(body, (bytearray, memoryview)):
            body = bytes(body)
        elif not isinstance(body, bytes):
            raise TypeError(f"Message body must be bytes or str, got {type(body).__name__}")
        if tags is not None and not isinstance(tags, str):
            raise TypeError(f"Message tags must be a string, got {type(tags).__name__}")
        if isinstance(keys, str):
            keys = (keys,)
        keys = tuple(keys)
        for k in keys:
            if not isinstance(k, str) or not k or " " in k:
                raise ValueError(f"Message key {k!r} must be a non-empty string without spaces")
        if sharding_key is not None and not isinstance(sharding_key, str):
            raise TypeError(f"Message sharding_key must be a string, got {type(sharding_key).__name__}")
        # tags, keys and the sharding key are stored as properties: a separator in one would
        # end it early and make the rest a property of its own (TRAN_MSG, DELAY ...)
        for what, text in (("tags", tags), ("sharding_key", sharding_key), *(("key", k) for k in keys)):
            if text is not None and ("\x01" in text or "\x02" in text):
                shown = text if len(text) <= 60 else text[:57] + "..."
                raise ValueError(f"Message {what} {shown!r} contains a reserved \\x01/\\x02 "
                                 "(RocketMQ's property separators)")
        if not isinstance(delay_level, int) or delay_level < 0:
            raise ValueError(f"Message delay_level must be an int >= 0, got {delay_level!r}")
        check_int("Message flag", flag, -INT32_MAX - 1, INT32_MAX)  # RocketMQ's int flag
        if deliver_time_ms is not None:
            check_int("Message deliver_time_ms (milliseconds since the epoch)", deliver_time_ms, 0)
            if delay_level:
                raise ValueError("a Message has delay_level or deliver_time_ms, not both: got "
                                 f"delay_level={delay_level}, deliver_time_ms={deliver_time_ms}")
        props = dict(properties or {})
        for name, value in props.items():
            if not isinstance(name, str) or not isinstance(value, str):
                raise TypeError(
                    f"Message properties must map str to str, got {name!r}: {value!r}"
                )
            if "\x01" in name or "\x02" in name or "\x01" in value or "\x02" in value:
                raise ValueError(f"Message property {name!r} contains a reserved \\x01/\\x02")
        self.topic = topic
        self.body = body
        self.tags = tags
        self.keys = keys
        self.properties = props
        self.delay_level = delay_level
        self.sharding_key = sharding_key
        self.flag = flag
        self.deliver_time_ms = deliver_time_ms


class SystemMessage(Message):
    """A :class:`Message` whose ``properties`` may name system properties (RocketMQ's MessageAccessor).

    For the client's own sends that must set them: a transaction's half message
    (``TRAN_MSG``, ``PGROUP``), a dead letter sent again (``ORIGIN_MESSAGE_ID``).
    :meth:`Producer.send` refuses those names on a plain Message.
    """

    __slots__ = ()


# Which Message field (or which API) sets a reserved property, for the error that refuses it
_USE_INSTEAD = {
    MessageConst.PROPERTY_TAGS: "Message(tags=...)",
    MessageConst.PROPERTY_KEYS: "Message(keys=[...])",
    MessageConst.PROPERTY_DELAY_TIME_LEVEL: "Message(delay_level=...)",
    MessageConst.PROPERTY_TIMER_DELIVER_MS: "Message(deliver_time_ms=...)",
    "TIMER_DELAY_SEC": "Message(deliver_time_ms=...)",
    "TIMER_DELAY_MS": "Message(deliver_time_ms=...)",
    MessageConst.PROPERTY_SHARDING_KEY: "Message(sharding_key=...)",
    MessageConst.PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX: "nothing: the producer sets it (SendResult.msg_id)",
    MessageConst.PROPERTY_TRANSACTION_PREPARED: "TransactionProducer.send_message_in_transaction",
    MessageConst.PROPERTY_PRODUCER_GROUP: "Producer(producer_group=...)",
    MessageConst.PROPERTY_MAX_RECONSUME_TIMES: "the consumer's max_reconsume_times (send back)",
}


INT32_MAX = 2**31 - 1
INT64_MAX = 2**63 - 1


def check_int(name: str, value: object, low: int, high: int = INT64_MAX) -> int:
    """``value`` if it is an int in ``low..high`` (the wire's field: int32 or int64), else a
    ValueError naming ``name``, the value and the range (a bool is not an int here)."""
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        past_int64 = isinstance(value, int) and value > high
        bound = f">= {low}" if high == INT64_MAX and not past_int64 else f"in {low}..{high}"
        raise ValueError(f"{name} must be an int {bound}, got {value!r}")
    return value


def check_timeout_ms(value: object) -> float:
    """A client's ``timeout_ms``: any real number of milliseconds in 1..2147483647 (an int, a
    float, numpy's); a ValueError naming it and the range else."""
    ms = float(value) if isinstance(value, numbers.Real) and not isinstance(value, bool) else -1.0
    if not 1 <= ms <= INT32_MAX:  # NaN too
        raise ValueError(f"timeout_ms must be a number of milliseconds in 1..{INT32_MAX}, got {value!r}")
    return ms


def reserved_property_problem(name: str) -> str | None:
    """Why ``name`` cannot be a user property (RocketMQ's STRING_HASH_SET), or None."""
    if name not in MessageConst.STRING_HASH_SET:
        return None
    use = _USE_INSTEAD.get(name, "nothing: the broker sets it")
    return (f"property name {name!r} is reserved for RocketMQ's system properties; use {use}, "
            "or another name")


def check_user_properties(msg: Message) -> None:
    """ValueError naming the first reserved property of ``msg`` (none for a :class:`SystemMessage`)."""
    if msg.properties and not isinstance(msg, SystemMessage):
        for name in msg.properties:
            problem = reserved_property_problem(name)
            if problem is not None:
                raise ValueError(f"Message for topic {msg.topic!r}: {problem}")


# A msgId is pid (8 hex digits) + 16 random bits of this process (4) + the time in µs (12)
# + a counter (8). The pid alone does not tell processes apart: in separate PID namespaces
# (containers, Kubernetes executor pods) every one is pid 1; RocketMQ starts its msgIds with
# the client's IP. The random bits, and the counter's random start, are drawn again in a
# forked child (a Spark Python worker), whose pid may also be the same as another pod's.
_uniq_lock = threading.Lock()
_uniq_counter = 0
_uniq_pid = -1
_uniq_head = ""


def _reseed_uniq() -> None:
    """Draw this process's random bits and counter start (at import and after a fork)."""
    global _uniq_lock, _uniq_counter, _uniq_pid, _uniq_head
    _uniq_lock = threading.Lock()  # a fork may have copied it held by another thread
    _uniq_counter = secrets.randbits(31)  # 2**31 msgIds before the 32-bit counter wraps
    _uniq_pid = os.getpid()
    _uniq_head = f"{_uniq_pid & 0xFFFFFFFF:08X}{secrets.randbits(16):04X}"


_reseed_uniq()
if hasattr(os, "register_at_fork"):  # not on Windows
    os.register_at_fork(after_in_child=_reseed_uniq)


def _uniq_prefix() -> str:
    """The msgIds' first 12 hex digits: the pid of this process and its random bits."""
    if _uniq_pid != os.getpid():  # forked without the fork hook (a C extension's fork)
        _reseed_uniq()
    return _uniq_head


def new_uniq_key() -> str:
    """A msgId (UNIQ_KEY): unique per send, 32 hex digits like RocketMQ's.

    The pid and random bits of this process, the time in µs, a counter (see above).
    """
    global _uniq_counter
    with _uniq_lock:
        _uniq_counter += 1
        n = _uniq_counter
    return f"{_uniq_prefix()}{time.time_ns() // 1000 & 0xFFFFFFFFFFFF:012X}{n & 0xFFFFFFFF:08X}"


def new_uniq_keys(n: int) -> Sequence[str]:
    """``n`` msgIds as :func:`new_uniq_key` makes them, with one lock and one clock read.

    A :class:`RowKeys` (the counter as the row, 8 hex digits): no string is made
    until one is read; a list when the 32-bit counter wraps within the ``n``.
    """
    global _uniq_counter
    with _uniq_lock:
        first = _uniq_counter + 1
        _uniq_counter += n
    head = f"{_uniq_prefix()}{time.time_ns() // 1000 & 0xFFFFFFFFFFFF:012X}"
    start = first & 0xFFFFFFFF
    if start + n - 1 <= 0xFFFFFFFF:
        return RowKeys(head, start, start + n, digits=8)
    return [f"{head}{c & 0xFFFFFFFF:08X}" for c in range(first, first + n)]


class RowKeys(Sequence[str]):
    """The UNIQ_KEYs ``prefix`` + row index as ``digits`` hex digits, of rows ``start`` to ``stop - 1``.

    Made when read: a bulk writer (the Spark sink) keys every row this way, and
    building 10,000 strings per batch only to hand them back in
    :attr:`SendResult.msg_ids` cost more than a tenth of the writer's time.
    Compares equal to the tuple of its keys.
    """

    __slots__ = ("digits", "prefix", "start", "stop")

    def __init__(self, prefix: str, start: int, stop: int, digits: int = 16) -> None:
        self.prefix, self.start, self.stop, self.digits = prefix, start, max(start, stop), digits

    def __len__(self) -> int:
        return self.stop - self.start

    def __getitem__(self, index: int | slice) -> Any:
        if isinstance(index, slice):
            a, b, step = index.indices(len(self))
            if step != 1:
                return tuple(self)[index]
            return RowKeys(self.prefix, self.start + a, self.start + b, self.digits)
        try:
            i = operator.index(index)
        except TypeError:
            raise TypeError(
                f"row key indices must be integers or slices, not {type(index).__name__} {index!r}"
            ) from None
        i = i + len(self) if i < 0 else i
        if not 0 <= i < len(self):
            raise IndexError(f"row key {index} is out of range for {len(self)} keys")
        return f"{self.prefix}{self.start + i:0{self.digits}X}"

    def __iter__(self) -> Iterator[str]:
        prefix, digits = self.prefix, self.digits
        return (f"{prefix}{row:0{digits}X}" for row in range(self.start, self.stop))

    def __eq__(self, other: object) -> bool:
        if isinstance(other, RowKeys | tuple):
            return tuple(self) == tuple(other)
        return NotImplemented

    def __hash__(self) -> int:
        return hash(tuple(self))

    def __repr__(self) -> str:
        digits = "" if self.digits == 16 else f", digits={self.digits}"
        return f"RowKeys({self.prefix!r}, {self.start}, {self.stop}{digits})"


def frozen_msg_ids(keys: Sequence[str]) -> Sequence[str]:
    """The msgIds a :class:`SendResult` keeps: RowKeys stay keys made when read (a bulk
    writer's batch of 10,000 would otherwise build 10,000 strings, 3 ms), others a tuple."""
    return keys[:] if isinstance(keys, RowKeys) else tuple(keys)


def encode_message_properties(msg: Message, uniq_key: str) -> bytes:
    """The stored properties of ``msg``: the user's plus RocketMQ's system ones."""
    # UNIQ_KEY first: the layout of a pre-encoded batch (the broker finds it there)
    props = {MessageConst.PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX: uniq_key}
    props.update(msg.properties)
    if msg.tags:
        props[MessageConst.PROPERTY_TAGS] = msg.tags
    if msg.keys:
        props[MessageConst.PROPERTY_KEYS] = MessageConst.KEY_SEPARATOR.join(msg.keys)
    if msg.delay_level:
        props[MessageConst.PROPERTY_DELAY_TIME_LEVEL] = str(msg.delay_level)
    if msg.deliver_time_ms is not None:
        props[MessageConst.PROPERTY_TIMER_DELIVER_MS] = str(msg.deliver_time_ms)
    if msg.sharding_key is not None:
        props[MessageConst.PROPERTY_SHARDING_KEY] = msg.sharding_key
    props[MessageConst.PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX] = uniq_key
    return encode_properties(props)


@dataclass(slots=True)
class MessageExt:
    """A received message, with where and when the broker stored it.

    ``topic`` is the topic it was read from; for a retried message
    (read from ``%RETRY%<group>``) ``retry_topic`` holds the original one
    (RocketMQ's RETRY_TOPIC property) and ``reconsume_times`` counts deliveries.
    """

    topic: str
    queue_id: int
    broker_name: str
    queue_offset: int
    msg_id: str
    offset_msg_id: str
    commit_log_offset: int
    body: bytes
    tags: str | None
    keys: tuple[str, ...]
    properties: dict[str, str]
    born_timestamp: int
    store_timestamp: int
    reconsume_times: int
    store_size: int = 0
    flag: int = 0

    @property
    def retry_topic(self) -> str | None:
        """The original topic of a retried message (RETRY_TOPIC), else None."""
        return self.properties.get(MessageConst.PROPERTY_RETRY_TOPIC)

    @property
    def user_properties(self) -> dict[str, str]:
        """Properties without RocketMQ's system ones (STRING_HASH_SET) and pymq's."""
        return {
            k: v for k, v in self.properties.items() if k not in MessageConst.NOT_USER_PROPERTIES
        }


class SendStatus(enum.Enum):
    SEND_OK = "SEND_OK"
    FLUSH_DISK_TIMEOUT = "FLUSH_DISK_TIMEOUT"
    FLUSH_SLAVE_TIMEOUT = "FLUSH_SLAVE_TIMEOUT"
    SLAVE_NOT_AVAILABLE = "SLAVE_NOT_AVAILABLE"


@dataclass(frozen=True, slots=True)
class SendResult:
    """The broker's answer to a send. For a batch, ids are per message, in order.

    ``msg_id`` / ``offset_msg_id`` are RocketMQ's: for a batch, the ids of all
    its messages joined by commas (computed when asked for).
    """

    status: SendStatus
    message_queue: MessageQueue
    queue_offset: int
    msg_ids: Sequence[str]  # a tuple, or RowKeys for rows keyed by a bulk writer
    commit_log_offsets: tuple[int, ...]
    store_host: bytes

    @property
    def queue_id(self) -> int:
        return self.message_queue.queue_id

    @property
    def msg_id(self) -> str:
        return ",".join(self.msg_ids)

    @property
    def offset_msg_ids(self) -> tuple[str, ...]:
        return tuple(offset_msg_id(self.store_host, phy) for phy in self.commit_log_offsets)

    @property
    def offset_msg_id(self) -> str:
        return ",".join(self.offset_msg_ids)


class PullStatus(enum.Enum):
    FOUND = "FOUND"
    NO_NEW_MSG = "NO_NEW_MSG"
    NO_MATCHED_MSG = "NO_MATCHED_MSG"
    OFFSET_ILLEGAL = "OFFSET_ILLEGAL"


@dataclass(frozen=True, slots=True)
class PullResult:
    """A pull's answer: messages from ``offset`` on, and where to continue."""

    status: PullStatus
    messages: list[MessageExt]
    next_begin_offset: int
    min_offset: int
    max_offset: int


_SEPARATORS = str.maketrans({"\x01": "\ufffd", "\x02": "\ufffd"})


def check_property_name(name: object) -> None:
    """ValueError/TypeError unless ``name`` can be an extra property of a message sent back."""
    if not isinstance(name, str):
        raise TypeError(f"a reason's property names must be str, got {name!r}")
    if not name or "\x01" in name or "\x02" in name or name in MessageConst.SEND_BACK_PROPERTIES:
        raise ValueError(
            f"property name {name!r} cannot be a reason: names must be non-empty, without \\x01 or "
            f"\\x02, and not one the send back sets ({', '.join(sorted(MessageConst.SEND_BACK_PROPERTIES))})"
        )


def clean_property_value(value: str) -> str:
    """``value`` with the property separators \\x01 and \\x02 replaced (U+FFFD): free text is kept."""
    return value.translate(_SEPARATORS) if "\x01" in value or "\x02" in value else value


@dataclass(frozen=True, slots=True)
class SendBackColumns:
    """Messages of one broker to send back, as columns: item i is the i-th value of each.

    What :meth:`PullConsumer.send_back_batch` builds from MessageExt, and what the
    Spark sink builds from a batch's Arrow columns without a MessageExt per row.

    Attributes:
        broker_name: the broker that stores the messages.
        commit_log_offsets: each consumed message's ``commit_log_offset``.
        delay_levels: one per message (0: level 3 + reconsume times; < 0: the DLQ).
        origin_msg_ids, origin_topics: each message's ``msg_id`` and original topic,
            or empty (the broker takes them from the stored message).
        properties: set on every message (e.g. the query and batch that failed).
        property_columns: a property name to one value per message, e.g. each
            failure reason; "" leaves that message without it.
        reconsume_times: each message's reconsume times, or empty (a backend whose
            broker does not say where a message went infers %DLQ% from them).
    """

    broker_name: str
    commit_log_offsets: Sequence[int]
    delay_levels: Sequence[int]
    origin_msg_ids: Sequence[str] = ()
    origin_topics: Sequence[str] = ()
    properties: Mapping[str, str] = field(default_factory=dict)
    property_columns: Mapping[str, Sequence[str]] = field(default_factory=dict)
    reconsume_times: Sequence[int] = ()

    def check(self) -> None:
        """ValueError naming the column whose length or property names are wrong."""
        n = len(self.commit_log_offsets)
        lengths = {"delay_levels": len(self.delay_levels), "origin_msg_ids": len(self.origin_msg_ids) or n,
                   "origin_topics": len(self.origin_topics) or n,
                   "reconsume_times": len(self.reconsume_times) or n,
                   **{f"property_columns[{k!r}]": len(v) for k, v in self.property_columns.items()}}
        for name, count in lengths.items():
            if count != n:
                raise ValueError(
                    f"{name} has {count} values for {n} commit_log_offsets; give one per message"
                )
        for name in [*self.properties, *self.property_columns]:
            check_property_name(name)

    def extra_properties(self, i: int) -> dict[str, str]:
        """Item ``i``'s extra properties: the shared ones and its non-empty column values."""
        own = {k: v[i] for k, v in self.property_columns.items() if v[i]}
        return {**self.properties, **own}

    def take(self, items: Sequence[int]) -> SendBackColumns:
        """The items ``items`` alone, in that order (what is left to send back after an error)."""

        def pick(values: Sequence[Any]) -> list[Any]:
            return [values[i] for i in items] if values else []

        return SendBackColumns(
            self.broker_name, pick(self.commit_log_offsets), pick(self.delay_levels),
            pick(self.origin_msg_ids), pick(self.origin_topics), self.properties,
            {k: pick(v) for k, v in self.property_columns.items()}, pick(self.reconsume_times),
        )

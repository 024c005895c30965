"""Options of the pymq source: parsed and validated once, into :class:`SourceOptions`.

Spark hands a data source its options as strings in a case-insensitive map.
Everything the readers need is checked here, before the query starts, and
frozen into a typed, picklable value that travels to the driver's source
runner and to every task. A bad option is a ``ValueError`` that names the
option, the value given, and what to set instead; nothing downstream has to
re-check a string.

Names follow Spark's Kafka source where the idea is the same
(``startingOffsets``, ``endingOffsets``, ``startingTimestamp``,
``maxMessagesPerTrigger`` ~ ``maxOffsetsPerTrigger``, ``failOnDataLoss``,
``minPartitions``) and RocketMQ's where the idea is RocketMQ's
(``consumerGroup``, ``messageModel``, ``subscription``, ``consumeFromWhere``,
``pullBatchSize``).
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum

from ..backend.base import BackendConfig, check_subscription, parse_backend_options
from .source_offset import QueueKey, parse_offsets_json

__all__ = [
    "DEFAULT_READER_GROUP",
    "OPTION_NAMES",
    "ConsumeFromWhere",
    "MessageModel",
    "SourceOptions",
    "StartKind",
    "StartingPosition",
    "parse_source_options",
]

#: Group name used for pulls when the user gave none (batch reads, BROADCASTING).
#: Nothing is ever committed under it.
DEFAULT_READER_GROUP = "PYMQ_SPARK_READER"
RETRY_GROUP_TOPIC_PREFIX = "%RETRY%"
DLQ_GROUP_TOPIC_PREFIX = "%DLQ%"

_TOPIC_RE = re.compile(r"^[%|a-zA-Z0-9_-]{1,127}$")
MAX_PULL_BATCH_SIZE = 100_000  # the broker answers at most this many messages per pull

DEFAULT_PULL_BATCH_SIZE = 32_768
# Measured on loopback: pulls answering ~1 MiB move 2-3x more bytes per second than
# 4 MiB ones (gRPC and allocation costs grow faster than linearly past ~2 MiB).
DEFAULT_PULL_MAX_BYTES = 1 << 20
MAX_PULL_MAX_BYTES = 64 << 20
DEFAULT_POLL_TIMEOUT_MS = 60_000
DEFAULT_CONNECT_TIMEOUT_MS = 10_000


class MessageModel(str, Enum):
    """RocketMQ's MessageModel."""

    CLUSTERING = "CLUSTERING"
    BROADCASTING = "BROADCASTING"


class ConsumeFromWhere(str, Enum):
    """Where a group starts on a queue where it has no progress (RocketMQ's names)."""

    CONSUME_FROM_LAST_OFFSET = "CONSUME_FROM_LAST_OFFSET"
    CONSUME_FROM_FIRST_OFFSET = "CONSUME_FROM_FIRST_OFFSET"
    CONSUME_FROM_TIMESTAMP = "CONSUME_FROM_TIMESTAMP"


class StartKind(str, Enum):
    GROUP = "group"
    EARLIEST = "earliest"
    LATEST = "latest"
    TIMESTAMP = "timestamp"
    OFFSETS = "offsets"
    LAST_N = "lastMessagesPerQueue"


@dataclass(frozen=True)
class StartingPosition:
    """Where reading starts, per queue.

    ``offsets`` (kind OFFSETS) maps ``(topic, broker name, queue id)`` to an
    offset, ``-2`` meaning earliest and ``-1`` latest; a broker name of ``""``
    matches the queue id on any broker. ``count`` is N for LAST_N.
    """

    kind: StartKind
    timestamp_ms: int | None = None
    offsets: Mapping[QueueKey, int] = field(default_factory=dict)
    count: int = 0


@dataclass(frozen=True)
class EndingPosition:
    """Where a batch read ends (exclusive): latest, a timestamp, or offsets per queue."""

    kind: StartKind  # LATEST, TIMESTAMP or OFFSETS
    timestamp_ms: int | None = None
    offsets: Mapping[QueueKey, int] = field(default_factory=dict)


@dataclass(frozen=True)
class SourceOptions:
    """The validated options of one query (see :class:`PymqDataSource` for the manual)."""

    backend: BackendConfig
    topics: tuple[str, ...]
    stream: bool
    consumer_group: str | None
    message_model: MessageModel
    subscription: str
    subscription_type: str
    starting: StartingPosition
    consume_from_where: ConsumeFromWhere
    consume_timestamp_ms: int | None
    ending: EndingPosition
    max_messages_per_trigger: int | None
    fail_on_data_loss: bool
    pull_batch_size: int
    pull_max_bytes: int
    include_retry: bool
    poll_timeout_ms: int
    connect_timeout_ms: int
    min_partitions: int | None
    max_messages_per_partition: int | None

    @property
    def endpoint(self) -> str:
        """The broker's endpoint or RocketMQ's name servers (for messages)."""
        return self.backend.address

    @property
    def pull_group(self) -> str:
        """The group that pulls carry (the user's, or a fixed reader group)."""
        return self.consumer_group or DEFAULT_READER_GROUP

    @property
    def retry_topic(self) -> str | None:
        """``%RETRY%<group>`` when retries are read along, else None."""
        if self.include_retry and self.consumer_group:
            return RETRY_GROUP_TOPIC_PREFIX + self.consumer_group
        return None

    @property
    def commits_progress(self) -> bool:
        """Whether Spark's commits are written to the broker as the group's progress."""
        return (
            self.stream
            and self.message_model is MessageModel.CLUSTERING
            and self.consumer_group is not None
        )

    def all_topics(self) -> tuple[str, ...]:
        """The user's topics, then the retry topic if it is read along."""
        retry = self.retry_topic
        if retry is None or retry in self.topics:
            return self.topics
        return (*self.topics, retry)


# name as documented -> applies to ("stream", "batch")
_STREAM, _BATCH = "stream", "batch"
_OPTIONS: dict[str, tuple[str, ...]] = {
    "endpoint": (_STREAM, _BATCH),
    "namesrvAddr": (_STREAM, _BATCH),
    "accessKey": (_STREAM, _BATCH),
    "secretKey": (_STREAM, _BATCH),
    "topic": (_STREAM, _BATCH),
    "consumerGroup": (_STREAM, _BATCH),
    "messageModel": (_STREAM, _BATCH),
    "subscription": (_STREAM, _BATCH),
    "subscriptionType": (_STREAM, _BATCH),
    "startingOffsets": (_STREAM, _BATCH),
    "startingTimestamp": (_STREAM, _BATCH),
    "consumeFromWhere": (_STREAM, _BATCH),
    "consumeTimestamp": (_STREAM, _BATCH),
    "endingOffsets": (_BATCH,),
    "endingTimestamp": (_BATCH,),
    "lastMessagesPerQueue": (_BATCH,),
    "maxMessagesPerTrigger": (_STREAM,),
    "failOnDataLoss": (_STREAM, _BATCH),
    "pullBatchSize": (_STREAM, _BATCH),
    "pullMaxBytes": (_STREAM, _BATCH),
    "includeRetry": (_STREAM, _BATCH),
    "pollTimeoutMs": (_STREAM, _BATCH),
    "connectTimeoutMs": (_STREAM, _BATCH),
    "minPartitions": (_STREAM, _BATCH),
    "maxMessagesPerPartition": (_STREAM, _BATCH),
}
OPTION_NAMES: tuple[str, ...] = tuple(_OPTIONS)
_CANONICAL = {name.lower(): name for name in _OPTIONS}


def _bad(name: str, value: object, allowed: str) -> ValueError:
    return ValueError(f"pymq option {name}={value!r} is not valid: {allowed}")


def unknown_option(
    key: object, known: tuple[str, ...], *, prefix: str = "pymq option",
    problem: str = "is unknown", known_label: str = "Known options",
) -> ValueError:
    """The error for an option name we do not know, with the closest known one as a hint."""
    hint = difflib.get_close_matches(str(key), known, n=1, cutoff=0.6)
    did_you_mean = f" Did you mean {hint[0]!r}?" if hint else ""
    return ValueError(f"{prefix} {key!r} {problem}.{did_you_mean} {known_label}: {', '.join(known)}.")


def parse_int_option(
    name: str, value: str | None, *, minimum: int, maximum: int | None = None
) -> int | None:
    """An integer option within [minimum, maximum]; None when unset (source and sink alike)."""
    if value is None or value == "":
        return None
    try:
        number = int(value)
    except ValueError:
        number = None
    if number is None or number < minimum or (maximum is not None and number > maximum):
        upper = f" and <= {maximum}" if maximum is not None else ""
        raise _bad(name, value, f"use an integer >= {minimum}{upper}")
    return number


class _Options:
    """The user's options by canonical name, remembering which were given."""

    def __init__(self, raw: Mapping[str, str], stream: bool | None) -> None:
        self.values: dict[str, str] = {}
        kind = None if stream is None else _STREAM if stream else _BATCH
        for key, value in raw.items():
            name = _CANONICAL.get(str(key).lower())
            if name is None:
                raise unknown_option(key, OPTION_NAMES)
            if kind is not None and kind not in _OPTIONS[name]:
                other = "batch reads (spark.read)" if stream else "streams (spark.readStream)"
                raise ValueError(
                    f"pymq option {name}={value!r} cannot apply to a "
                    f"{'stream' if stream else 'batch read'}: it is for {other} only. "
                    "Remove it."
                )
            self.values[name] = "" if value is None else str(value).strip()

    def given(self, name: str) -> bool:
        return name in self.values

    def get(self, name: str) -> str | None:
        return self.values.get(name)

    def text(self, name: str, default: str) -> str:
        value = self.values.get(name)
        return default if value is None or value == "" else value

    def boolean(self, name: str, default: bool) -> bool:
        value = self.values.get(name)
        if value is None or value == "":
            return default
        low = value.lower()
        if low in ("true", "false"):
            return low == "true"
        raise _bad(name, value, "use 'true' or 'false'")

    def integer(self, name: str, *, minimum: int, maximum: int | None = None) -> int | None:
        return parse_int_option(name, self.values.get(name), minimum=minimum, maximum=maximum)

    def enum(self, name: str, enum_cls: type[Enum], default: Enum, aliases: dict[str, str]) -> str:
        value = self.values.get(name)
        if value is None or value == "":
            return str(default.value)
        key = value.upper()
        key = aliases.get(key, key)
        allowed = [str(e.value) for e in enum_cls]
        if key not in allowed:
            raise _bad(name, value, f"use one of {', '.join(allowed)}")
        return key


def _parse_topics(value: str | None) -> tuple[str, ...]:
    if value is None or not value.strip():
        raise ValueError(
            "pymq option topic is required: set .option('topic', 'orders') "
            "(one topic, or a comma-separated list such as 'orders,payments')"
        )
    topics: list[str] = []
    for part in value.split(","):
        name = part.strip()
        if not name:
            raise _bad("topic", value, "a comma-separated list of topic names without empty items")
        if not _TOPIC_RE.match(name):
            raise _bad(
                "topic",
                value,
                f"topic {name!r} must be 1-127 letters, digits, '%', '|', '_' or '-'",
            )
        if name not in topics:
            topics.append(name)
    return tuple(topics)


def _parse_group(value: str | None) -> str | None:
    if value is None or value == "":
        return None
    if not _TOPIC_RE.match(value) or "%" in value:
        raise _bad(
            "consumerGroup", value, "use 1-127 letters, digits, '|', '_' or '-' (no '%')"
        )
    return value


def _parse_starting_offsets(value: str, *, stream: bool) -> StartingPosition:
    low = value.lower()
    if low == "group":
        return StartingPosition(StartKind.GROUP)
    if low == "earliest":
        return StartingPosition(StartKind.EARLIEST)
    if low == "latest":
        if not stream:
            raise _bad(
                "startingOffsets",
                value,
                "a batch read starting at 'latest' reads nothing: use 'earliest', 'group', "
                "a JSON object, startingTimestamp or lastMessagesPerQueue",
            )
        return StartingPosition(StartKind.LATEST)
    if value.startswith("{"):
        offsets = parse_offsets_json(value, "startingOffsets", allow_earliest=True)
        return StartingPosition(StartKind.OFFSETS, offsets=offsets)
    raise _bad(
        "startingOffsets",
        value,
        "use 'group', 'earliest', 'latest' or a JSON object such as "
        '{"orders": {"broker-a:0": 42, "broker-a:1": -2}} (-2 earliest, -1 latest)',
    )


def _parse_timestamp(opts: _Options, name: str) -> int | None:
    value = opts.integer(name, minimum=0)
    return value


def parse_source_options(raw: Mapping[str, str], *, stream: bool | None) -> SourceOptions:
    """Validate the user's options for a stream (``stream=True``) or a batch read.

    ``stream=None`` checks what does not depend on the kind of read (names,
    values, combinations): ``DataSource.schema()`` runs it at ``load()``, before
    Spark says whether the read is a stream, so most mistakes fail right there.
    """
    opts = _Options(raw, stream)

    backend = parse_backend_options(opts.get, "pymq option")

    topics = _parse_topics(opts.get("topic"))
    group = _parse_group(opts.get("consumerGroup"))
    model = MessageModel(
        opts.enum("messageModel", MessageModel, MessageModel.CLUSTERING, {})
    )
    clustering = model is MessageModel.CLUSTERING

    if stream is True and clustering and group is None:
        raise ValueError(
            "pymq option consumerGroup is required for a stream in CLUSTERING mode: its "
            "progress is kept on the broker under that group. Set "
            ".option('consumerGroup', 'my-app'), or messageModel=BROADCASTING to keep "
            "progress in Spark's checkpoint only"
        )

    subscription = opts.text("subscription", "*")
    if any(c in subscription for c in "\x01\x02\n"):
        raise _bad("subscription", subscription, "a tag expression such as '*' or 'TagA || TagB'")
    subscription_type = opts.text("subscriptionType", "TAG").upper()
    if subscription_type not in ("TAG", "SQL92"):
        raise _bad("subscriptionType", opts.get("subscriptionType"), "use TAG (default) or SQL92")
    try:
        check_subscription(backend, subscription, subscription_type)
    except ValueError as err:
        raise _bad("subscription", subscription, str(err)) from None

    consume_from_where = ConsumeFromWhere(
        opts.enum(
            "consumeFromWhere",
            ConsumeFromWhere,
            ConsumeFromWhere.CONSUME_FROM_LAST_OFFSET,
            {
                "LAST": "CONSUME_FROM_LAST_OFFSET",
                "LAST_OFFSET": "CONSUME_FROM_LAST_OFFSET",
                "FIRST": "CONSUME_FROM_FIRST_OFFSET",
                "FIRST_OFFSET": "CONSUME_FROM_FIRST_OFFSET",
                "TIMESTAMP": "CONSUME_FROM_TIMESTAMP",
            },
        )
    )
    consume_timestamp = _parse_timestamp(opts, "consumeTimestamp")
    if consume_from_where is ConsumeFromWhere.CONSUME_FROM_TIMESTAMP and consume_timestamp is None:
        raise ValueError(
            "pymq option consumeFromWhere=CONSUME_FROM_TIMESTAMP needs consumeTimestamp "
            "(milliseconds since the epoch) to say from when"
        )
    if consume_timestamp is not None and consume_from_where is not (
        ConsumeFromWhere.CONSUME_FROM_TIMESTAMP
    ):
        raise ValueError(
            f"pymq option consumeTimestamp={consume_timestamp} cannot apply: it is used only "
            "with consumeFromWhere=CONSUME_FROM_TIMESTAMP"
        )

    # -- where to start ------------------------------------------------------
    starting_ts = _parse_timestamp(opts, "startingTimestamp")
    last_n = opts.integer("lastMessagesPerQueue", minimum=1)
    given_start = [
        n for n in ("startingOffsets", "startingTimestamp", "lastMessagesPerQueue") if opts.given(n)
    ]
    if len(given_start) > 1:
        raise ValueError(
            f"pymq options {' and '.join(given_start)} cannot be used together: each says "
            "where reading starts. Keep one of them"
        )
    if starting_ts is not None:
        starting = StartingPosition(StartKind.TIMESTAMP, timestamp_ms=starting_ts)
    elif last_n is not None:
        starting = StartingPosition(StartKind.LAST_N, count=last_n)
    elif opts.get("startingOffsets"):
        starting = _parse_starting_offsets(
            opts.text("startingOffsets", ""), stream=stream is not False
        )
    elif stream is not True:  # a batch read (or, at load(), not known yet)
        starting = StartingPosition(StartKind.EARLIEST)
    elif clustering:
        starting = StartingPosition(StartKind.GROUP)
    else:
        starting = {
            ConsumeFromWhere.CONSUME_FROM_LAST_OFFSET: StartingPosition(StartKind.LATEST),
            ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET: StartingPosition(StartKind.EARLIEST),
            ConsumeFromWhere.CONSUME_FROM_TIMESTAMP: StartingPosition(
                StartKind.TIMESTAMP, timestamp_ms=consume_timestamp
            ),
        }[consume_from_where]

    consume_from_where_applies = starting.kind is StartKind.GROUP or (
        not given_start and (stream is None or (stream and not clustering))
    )
    if opts.given("consumeFromWhere") and not consume_from_where_applies:
        raise ValueError(
            f"pymq option consumeFromWhere={opts.get('consumeFromWhere')!r} cannot apply here: "
            "it says where a group starts on queues where it has no progress "
            "(startingOffsets=group) or where a BROADCASTING stream starts. Remove it"
        )
    if starting.kind is StartKind.GROUP:
        if not clustering:
            raise _bad(
                "startingOffsets",
                "group",
                "in BROADCASTING mode the broker keeps no progress for the group: use "
                "'earliest', 'latest', a JSON object or startingTimestamp",
            )
        if group is None:
            raise ValueError(
                "pymq option startingOffsets=group needs consumerGroup: set the group "
                "whose progress on the broker to start from"
            )
    if starting.kind is StartKind.OFFSETS:
        unknown = sorted({key[0] for key in starting.offsets} - set(topics))
        if unknown:
            raise _bad(
                "startingOffsets",
                opts.get("startingOffsets"),
                f"it names topics {unknown} that are not in topic={','.join(topics)!r}",
            )

    # -- where a batch read ends ----------------------------------------------
    ending_ts = _parse_timestamp(opts, "endingTimestamp")
    if opts.given("endingOffsets") and ending_ts is not None:
        raise ValueError(
            "pymq options endingOffsets and endingTimestamp cannot be used together: "
            "keep one of them"
        )
    ending = EndingPosition(StartKind.LATEST)
    if ending_ts is not None:
        ending = EndingPosition(StartKind.TIMESTAMP, timestamp_ms=ending_ts)
        if starting.kind is StartKind.TIMESTAMP and (starting.timestamp_ms or 0) > ending_ts:
            raise _bad(
                "endingTimestamp", ending_ts, f"it is before startingTimestamp={starting_ts}"
            )
    elif opts.get("endingOffsets"):
        value = opts.text("endingOffsets", "latest")
        if value.lower() == "latest":
            ending = EndingPosition(StartKind.LATEST)
        elif value.startswith("{"):
            offsets = parse_offsets_json(value, "endingOffsets", allow_earliest=False)
            unknown = sorted({key[0] for key in offsets} - set(topics))
            if unknown:
                raise _bad(
                    "endingOffsets", value, f"it names topics {unknown} that are not in topic="
                    f"{','.join(topics)!r}"
                )
            ending = EndingPosition(StartKind.OFFSETS, offsets=offsets)
        else:
            raise _bad(
                "endingOffsets",
                value,
                "use 'latest' or a JSON object such as "
                '{"orders": {"broker-a:0": 100}} (-1 latest)',
            )

    # -- retries ----------------------------------------------------------------
    retry_default = stream is True and clustering and group is not None
    include_retry = opts.boolean("includeRetry", retry_default)
    if include_retry and not clustering:
        raise _bad(
            "includeRetry",
            opts.get("includeRetry"),
            "BROADCASTING consumers get no retries (RocketMQ does not retry broadcast "
            "messages): remove it or set messageModel=CLUSTERING",
        )
    if include_retry and group is None:
        raise ValueError(
            "pymq option includeRetry=true needs consumerGroup: retries live in "
            "%RETRY%<consumerGroup>"
        )

    max_per_trigger = opts.integer("maxMessagesPerTrigger", minimum=1)
    pull_batch_size = opts.integer("pullBatchSize", minimum=1, maximum=MAX_PULL_BATCH_SIZE)
    pull_max_bytes = opts.integer("pullMaxBytes", minimum=1, maximum=MAX_PULL_MAX_BYTES)
    poll_timeout = opts.integer("pollTimeoutMs", minimum=1)
    connect_timeout = opts.integer("connectTimeoutMs", minimum=1)
    min_partitions = opts.integer("minPartitions", minimum=1)
    max_per_partition = opts.integer("maxMessagesPerPartition", minimum=1)

    return SourceOptions(
        backend=backend,
        topics=topics,
        stream=bool(stream),
        consumer_group=group,
        message_model=model,
        subscription=subscription,
        subscription_type=subscription_type,
        starting=starting,
        consume_from_where=consume_from_where,
        consume_timestamp_ms=consume_timestamp,
        ending=ending,
        max_messages_per_trigger=max_per_trigger,
        fail_on_data_loss=opts.boolean("failOnDataLoss", True),
        pull_batch_size=pull_batch_size or DEFAULT_PULL_BATCH_SIZE,
        pull_max_bytes=pull_max_bytes or DEFAULT_PULL_MAX_BYTES,
        include_retry=include_retry,
        poll_timeout_ms=poll_timeout or DEFAULT_POLL_TIMEOUT_MS,
        connect_timeout_ms=connect_timeout or DEFAULT_CONNECT_TIMEOUT_MS,
        min_partitions=min_partitions,
        max_messages_per_partition=max_per_partition,
    )


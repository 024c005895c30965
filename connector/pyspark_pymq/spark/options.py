"""Options of the pymq source: parsed and validated once, into :class:`SourceOptions`.

Spark hands a data source its options as strings in a case-insensitive map.
Everything the readers need is checked here, before the query starts, and
frozen into a typed, picklable value that travels to the driver's source
runner and to every task. A bad option is a ``ValueError`` that names the
option, the value given, and what to set instead; nothing downstream has to
re-check a string.

Which options exist, their types, bounds, defaults and scopes come from
:data:`~pyspark_pymq.spark.option_registry.SOURCE_OPTIONS`, which the docs are
rendered from too; this module adds what relates one option to another.

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

from pymq_proto.topics import get_retry_topic, is_retry_topic, is_system_topic

from ..backend.base import BackendConfig, check_subscription, parse_backend_options
from ..client.message import MessageQueue
from .option_registry import (
    DEFAULT_CONNECT_TIMEOUT_MS,
    DEFAULT_POLL_TIMEOUT_MS,
    DEFAULT_PULL_BATCH_SIZE,
    DEFAULT_PULL_MAX_BYTES,
    DEFAULT_READER_GROUP,
    MAX_PULL_BATCH_SIZE,
    MAX_PULL_MAX_BYTES,
    SOURCE_OPTIONS,
    OptionRegistry,
    browse_group,
)
from .source_offset import (
    QueueKey,
    assign_text,
    epoch_ms_problem,
    parse_assign_json,
    parse_offsets_json,
    parse_timestamps_json,
)

__all__ = [
    "DEFAULT_CONNECT_TIMEOUT_MS",
    "DEFAULT_POLL_TIMEOUT_MS",
    "DEFAULT_PULL_BATCH_SIZE",
    "DEFAULT_PULL_MAX_BYTES",
    "DEFAULT_READER_GROUP",
    "MAX_PULL_BATCH_SIZE",
    "MAX_PULL_MAX_BYTES",
    "OPTION_NAMES",
    "ConsumeFromWhere",
    "EndingPosition",
    "MessageModel",
    "SourceOptions",
    "StartKind",
    "StartingPosition",
    "TimestampStrategy",
    "parse_source_options",
]


_TOPIC_RE = re.compile(r"^[%|a-zA-Z0-9_-]{1,127}$")

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
    TIMESTAMPS = "timestampsPerQueue"  # startingOffsetsByTimestamp / endingOffsetsByTimestamp
    OFFSETS = "offsets"
    LAST_N = "lastMessagesPerQueue"


class TimestampStrategy(str, Enum):
    """startingOffsetsByTimestampStrategy: where a queue starts that has no message stored at or
    after its starting time (Spark's Kafka source's names)."""

    ERROR = "error"  # the query fails, naming the queue and the time
    LATEST = "latest"  # the queue starts at its end


@dataclass(frozen=True)
class StartingPosition:
    """Where reading starts, per queue.

    ``offsets`` (kind OFFSETS) maps ``(topic, broker name, queue id)`` to an
    offset, ``-2`` meaning earliest and ``-1`` latest; a broker name of ``""``
    matches the queue id on any broker. ``timestamps`` (kind TIMESTAMPS) maps
    queues the same way to a time in ms. ``count`` is N for LAST_N.
    ``strategy`` says what a queue without a message at or after its time does
    (kinds TIMESTAMP and TIMESTAMPS).
    """

    kind: StartKind
    timestamp_ms: int | None = None
    offsets: Mapping[QueueKey, int] = field(default_factory=dict)
    count: int = 0
    timestamps: Mapping[QueueKey, int] = field(default_factory=dict)
    strategy: TimestampStrategy = TimestampStrategy.LATEST

    @property
    def option(self) -> str:
        """The option that set this start (for messages)."""
        return {
            StartKind.TIMESTAMP: "startingTimestamp",
            StartKind.TIMESTAMPS: "startingOffsetsByTimestamp",
            StartKind.LAST_N: "lastMessagesPerQueue",
        }.get(self.kind, "startingOffsets")


@dataclass(frozen=True)
class EndingPosition:
    """Where a batch read ends (exclusive): latest, a timestamp, offsets or timestamps per queue."""

    kind: StartKind  # LATEST, TIMESTAMP, TIMESTAMPS or OFFSETS
    timestamp_ms: int | None = None
    offsets: Mapping[QueueKey, int] = field(default_factory=dict)
    timestamps: Mapping[QueueKey, int] = field(default_factory=dict)


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
    min_messages_per_trigger: int | None = None
    max_trigger_delay_ms: int = 15 * 60_000
    # the columns a user's .schema(...) keeps, in its order; None: all (see spark.schema)
    columns: tuple[str, ...] | None = None
    # subscribePattern: ``topics`` are then the matching topics the offset reader found last
    # (none until it looked; OffsetReader replaces them at each look)
    topic_pattern: str | None = None
    # assign: the queues read, of ``topics`` (broker name "": that queue id on any broker); None:
    # every queue of the topics
    assigned: frozenset[QueueKey] | None = None

    @property
    def topic_option(self) -> str:
        """How the user named the topics, for messages: ``topic='a,b'``, ``subscribePattern='a.*'``
        or ``assign='{...}'``."""
        if self.topic_pattern is not None:
            return f"subscribePattern={self.topic_pattern!r}"
        if self.assigned is not None:
            return f"assign={assign_text(self.assigned)!r}"
        return f"topic={','.join(self.topics)!r}"

    def assigns(self, mq: MessageQueue) -> bool:
        """Whether ``mq`` is one of the queues ``assign`` names (every queue without it)."""
        if self.assigned is None:
            return True
        return (mq.topic, mq.broker_name, mq.queue_id) in self.assigned or (
            (mq.topic, "", mq.queue_id) in self.assigned)

    def matches(self, topic: str) -> bool:
        """Whether ``topic`` is one of the query's: named in ``topic``, or matched by
        ``subscribePattern`` (a whole-name match, as Java's ``matches()``; never a system topic)."""
        if self.topic_pattern is None:
            return topic in self.topics
        return not is_system_topic(topic) and re.fullmatch(self.topic_pattern, topic) is not None

    @property
    def endpoint(self) -> str:
        """The broker's endpoint or RocketMQ's name servers (for messages)."""
        return self.backend.address

    @property
    def pull_group(self) -> str:
        """The group that pulls carry (the user's, or a fixed reader group)."""
        return self.consumer_group or browse_group(self.backend.kind)

    @property
    def retry_topic(self) -> str | None:
        """``%RETRY%<group>`` when retries are read along, else None."""
        if self.include_retry and self.consumer_group:
            return get_retry_topic(self.consumer_group)
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


OPTION_NAMES: tuple[str, ...] = SOURCE_OPTIONS.names


def _bad(name: str, value: object, allowed: str, prefix: str = "pymq option") -> ValueError:
    return ValueError(f"{prefix} {name}={value!r} is not valid: {allowed}")


# Spark's Kafka source and sink options (lower-cased, as Spark hands them over) -> (pymq's option, or ""
# where there is none, and what to know): a Kafka user's names would otherwise get a close but wrong
# spelling (``subscribe`` -> ``subscription``, which is the tag filter)
_SASL = ("", "authentication is options accessKey and secretKey (RocketMQ's ACL users)")
_KAFKA_OPTIONS: dict[str, tuple[str, str]] = {
    "subscribe": ("topic", "a comma-separated list; every queue of each topic is read"),
    "kafka.bootstrap.servers": ("endpoint", "the pymq broker's host:port, or namesrvAddr for an Apache "
                                            "RocketMQ cluster"),
    "kafka.group.id": ("consumerGroup", ""),
    "groupidprefix": ("consumerGroup", ""),
    "maxoffsetspertrigger": ("maxMessagesPerTrigger", ""),
    "minoffsetspertrigger": ("minMessagesPerTrigger", "with maxTriggerDelay, as in Kafka"),
    "includeheaders": ("", "every message's properties (RocketMQ's headers) are in the properties "
                           "column already"),
    "kafka.max.poll.records": ("pullBatchSize", ""),
    "kafkaconsumer.polltimeoutms": ("pollTimeoutMs", ""),
    "kafka.security.protocol": ("", "TLS is options tls=true and tlsCaFile (PEM); authentication is "
                                    "accessKey and secretKey"),
    "kafka.ssl.truststore.location": ("tlsCaFile", "a PEM file of the CA that signed the broker's "
                                                   "certificate"),
    "kafka.sasl.mechanism": _SASL,
    "kafka.sasl.jaas.config": _SASL,
    "kafka.acks": ("sendMode", "sync: every batch acknowledged before the next"),
    "kafka.partitioner.class": ("", "give a sharding_key column (same key, same queue) or a queue_id "
                                    "column"),
}


def _kafka_hint(key: str, known: tuple[str, ...]) -> str:
    """What Spark's Kafka option ``key`` is called here, when it is one of them."""
    low = key.lower()
    target, what = _KAFKA_OPTIONS.get(low, (None, ""))
    if target is None:
        if not low.startswith(("kafka.", "kafkaconsumer.", "fetchoffset.")):
            return ""
        return (" It is a setting of Spark's Kafka connector: pymq passes no Kafka client settings "
                "through; the options below are all there is.")
    if target and target not in known:
        return ""
    if not target:
        return f" It is an option of Spark's Kafka connector: {what}."
    return (f" It is an option of Spark's Kafka connector: use {target!r} here"
            f"{f' ({what})' if what else ''}.")


def unknown_option(
    key: object, known: tuple[str, ...], *, prefix: str = "pymq option",
    problem: str = "is unknown", known_label: str = "Known options",
) -> ValueError:
    """The error for an option name we do not know, with what Spark's Kafka connector's name is
    called here or else the closest known one as a hint."""
    hint = _kafka_hint(str(key), known)
    if not hint:  # Spark hands the names over lower-cased: compare them so
        by_lower = {name.lower(): name for name in known}
        close = difflib.get_close_matches(str(key).lower(), list(by_lower), n=1, cutoff=0.6)
        hint = f" Did you mean {by_lower[close[0]]!r}?" if close else ""
    return ValueError(f"{prefix} {key!r} {problem}.{hint} {known_label}: {', '.join(known)}.")


def parse_int_option(
    name: str, value: str | None, *, minimum: int, maximum: int | None = None,
    prefix: str = "pymq option",
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
        raise _bad(name, value, f"use an integer >= {minimum}{upper}", prefix)
    return number


class OptionValues:
    """The user's options by canonical name, checked against ``registry``.

    Names are matched case-insensitively (Spark lower-cases them); an unknown one
    fails with the closest known name, and one whose scope excludes the query
    (``stream``: True, False, or None when not known yet) fails naming where it
    applies. Values are stripped strings; the typed getters take bounds,
    choices and defaults from the registry.
    """

    def __init__(self, registry: OptionRegistry, raw: Mapping[str, str], stream: bool | None) -> None:
        self.registry = registry
        self.values: dict[str, str] = {}
        kind = None if stream is None else "stream" if stream else "batch"
        for key, value in raw.items():
            spec = registry.lookup(key)
            if spec is None:
                raise unknown_option(key, registry.names, prefix=registry.prefix,
                                     problem=registry.unknown, known_label=registry.known_label)
            if kind is not None and spec.scope not in ("both", kind):
                this, _ = registry.stream_words if stream else registry.batch_words
                _, other = registry.batch_words if stream else registry.stream_words
                raise ValueError(
                    f"{registry.prefix} {spec.name}={value!r} cannot apply to {this}: it is for "
                    f"{other} only. Remove it."
                )
            self.values[spec.name] = "" if value is None else str(value).strip()

    def bad(self, name: str, value: object, allowed: str) -> ValueError:
        return _bad(name, value, allowed, self.registry.prefix)

    def given(self, name: str) -> bool:
        return name in self.values

    def get(self, name: str) -> str | None:
        return self.values.get(name)

    def text(self, name: str, default: str | None = None) -> str:
        """The value, or ``default`` (else the registry's) when unset or empty."""
        value = self.values.get(name)
        if value is None or value == "":
            fallback = self.registry[name].default if default is None else default
            return "" if fallback is None else str(fallback)
        return value

    def boolean(self, name: str, default: bool | None = None) -> bool:
        value = self.values.get(name)
        if value is None or value == "":
            return bool(self.registry[name].default if default is None else default)
        low = value.lower()
        if low in ("true", "false"):
            return low == "true"
        raise self.bad(name, value, "use 'true' or 'false'")

    def integer(self, name: str) -> int | None:
        """The value within the registry's bounds; None when unset."""
        spec = self.registry[name]
        assert spec.type == "integer" and spec.minimum is not None, spec
        return parse_int_option(name, self.values.get(name), minimum=spec.minimum,
                                maximum=spec.maximum, prefix=self.registry.prefix)

    def epoch_ms(self, name: str) -> int | None:
        """:meth:`integer`, a time in milliseconds since the epoch: seconds are refused, naming both."""
        value = self.integer(name)
        problem = None if value is None else epoch_ms_problem(value)
        if problem:
            raise self.bad(name, value, problem)
        return value

    def integer_or_default(self, name: str) -> int:
        value = self.integer(name)
        if value is not None:
            return value
        default = self.registry[name].default
        assert isinstance(default, int), name
        return default

    def choice(self, name: str) -> str:
        """One of the registry's choices (any case, aliases resolved), or its default when unset."""
        spec = self.registry[name]
        value = self.values.get(name)
        if value is None or value == "":
            return str(spec.default)
        choice = spec.choice(value)
        if choice is None:
            raise self.bad(name, value, f"use one of {', '.join(spec.choices)}")
        return choice


def _parse_topics(value: str | None, prefix: str = "pymq option") -> tuple[str, ...]:
    if value is None or not value.strip():
        raise ValueError(
            f"{prefix} topic is required: set .option('topic', 'orders') "
            "(one topic, or a comma-separated list such as 'orders,payments')"
        )
    topics: list[str] = []
    for part in value.split(","):
        name = part.strip()
        if not name:
            raise _bad("topic", value, "a comma-separated list of topic names without empty items", prefix)
        if not _TOPIC_RE.match(name):
            raise _bad(
                "topic",
                value,
                f"topic {name!r} must be 1-127 letters, digits, '%', '|', '_' or '-'",
                prefix,
            )
        if name not in topics:
            topics.append(name)
    return tuple(topics)


def _parse_group(value: str | None, prefix: str = "pymq option") -> str | None:
    if value is None or value == "":
        return None
    if not _TOPIC_RE.match(value) or "%" in value:
        raise _bad(
            "consumerGroup", value, "use 1-127 letters, digits, '|', '_' or '-' (no '%')", prefix
        )
    return value


# -- what: topics, group, message model, subscription --------------------------------------------


@dataclass(frozen=True)
class _What:
    topics: tuple[str, ...]  # () with a pattern
    pattern: str | None
    assigned: frozenset[QueueKey] | None
    group: str | None
    model: MessageModel
    subscription: str
    subscription_type: str

    @property
    def clustering(self) -> bool:
        return self.model is MessageModel.CLUSTERING


def _parse_pattern(opts: OptionValues) -> str | None:
    """subscribePattern, checked to compile; exactly one of it and topic."""
    pattern = opts.get("subscribePattern")
    if pattern is None:
        return None
    if (opts.get("topic") or "").strip():
        raise ValueError(
            f"pymq options topic={opts.get('topic')!r} and subscribePattern={pattern!r} cannot be used "
            "together: each says which topics are read. Keep one of them"
        )
    if not pattern:
        raise opts.bad("subscribePattern", pattern, "use a regular expression that topic names match "
                       "whole, such as 'orders-.*', or set topic instead")
    try:
        re.compile(pattern)
    except re.error as err:
        raise opts.bad("subscribePattern", pattern, f"it is no regular expression ({err}): use one that "
                       "topic names match whole, such as 'orders-.*'") from None
    return pattern


def _parse_assign(opts: OptionValues) -> frozenset[QueueKey] | None:
    """assign: the queues read; instead of topic and subscribePattern."""
    text = opts.get("assign")
    if text is None:
        return None
    other = next((name for name in ("topic", "subscribePattern") if (opts.get(name) or "").strip()), None)
    if other is not None:
        raise ValueError(
            f"pymq options assign={text!r} and {other}={opts.get(other)!r} cannot be used together: "
            "each says what is read. Keep one of them"
        )
    assigned = parse_assign_json(text)
    for topic in sorted({key[0] for key in assigned}):
        if not _TOPIC_RE.match(topic):
            raise opts.bad("assign", text, f"topic {topic!r} must be 1-127 letters, digits, '%', '|', "
                           "'_' or '-'")
    return assigned


def _parse_what(opts: OptionValues, backend: BackendConfig, stream: bool | None) -> _What:
    pattern = _parse_pattern(opts)
    assigned = _parse_assign(opts)
    if pattern is None and assigned is None and not (opts.get("topic") or "").strip():
        raise ValueError(
            "pymq option topic is required: set .option('topic', 'orders') (one topic, or a "
            "comma-separated list such as 'orders,payments'), subscribePattern='orders-.*' for "
            "the topics whose names match, or assign for some queues of them"
        )
    group = _parse_group(opts.get("consumerGroup"))
    model = MessageModel(opts.choice("messageModel"))
    if assigned is not None:
        # %RETRY%<consumerGroup>'s queues named there are read along (includeRetry), those only
        retry = get_retry_topic(group) if group and model is MessageModel.CLUSTERING else None
        topics = tuple(sorted({key[0] for key in assigned} - {retry}))
    else:
        topics = () if pattern is not None else _parse_topics(opts.get("topic"))
    if stream is True and model is MessageModel.CLUSTERING and group is None:
        raise ValueError(
            "pymq option consumerGroup is required for a stream in CLUSTERING mode: its "
            "progress is kept on the broker under that group. Set "
            ".option('consumerGroup', 'my-app'), or messageModel=BROADCASTING to keep "
            "progress in Spark's checkpoint only"
        )
    subscription = opts.text("subscription")
    if any(c in subscription for c in "\x01\x02\n"):
        raise opts.bad("subscription", subscription, "a tag expression such as '*' or 'TagA || TagB'")
    subscription_type = opts.choice("subscriptionType")
    try:
        check_subscription(backend, subscription, subscription_type)
    except ValueError as err:
        raise opts.bad("subscription", subscription, str(err)) from None
    return _What(topics, pattern, assigned, group, model, subscription, subscription_type)


# -- where reading starts ------------------------------------------------------------------------


def _parse_consume_from_where(opts: OptionValues) -> tuple[ConsumeFromWhere, int | None]:
    """consumeFromWhere and its consumeTimestamp: where a group without progress starts."""
    where = ConsumeFromWhere(opts.choice("consumeFromWhere"))
    timestamp = opts.epoch_ms("consumeTimestamp")
    if where is ConsumeFromWhere.CONSUME_FROM_TIMESTAMP and timestamp is None:
        raise ValueError(
            "pymq option consumeFromWhere=CONSUME_FROM_TIMESTAMP needs consumeTimestamp "
            "(milliseconds since the epoch) to say from when"
        )
    if timestamp is not None and where is not ConsumeFromWhere.CONSUME_FROM_TIMESTAMP:
        raise ValueError(
            f"pymq option consumeTimestamp={timestamp} cannot apply: it is used only "
            "with consumeFromWhere=CONSUME_FROM_TIMESTAMP"
        )
    return where, timestamp


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
        latest = next(((topic, broker, qid) for (topic, broker, qid), offset in offsets.items()
                       if offset == -1), None)
        if latest is not None and not stream:  # as Spark's Kafka source: that queue would read nothing
            topic, broker, qid = latest
            raise _bad(
                "startingOffsets", value,
                f"a batch read cannot start queue {f'{broker}:{qid}' if broker else qid} of {topic!r} at "
                "-1 (latest): it would read nothing there. Give an offset, -2 (earliest), or leave the "
                "queue out (it starts at earliest)",
            )
        return StartingPosition(StartKind.OFFSETS, offsets=offsets)
    raise _bad(
        "startingOffsets",
        value,
        "use 'group', 'earliest', 'latest' or a JSON object such as "
        '{"orders": {"broker-a:0": 42, "broker-a:1": -2}} (-2 earliest, -1 latest)',
    )


_START_OPTIONS = (
    "startingOffsets", "startingTimestamp", "startingOffsetsByTimestamp", "lastMessagesPerQueue",
)
_END_OPTIONS = ("endingOffsets", "endingTimestamp", "endingOffsetsByTimestamp")


def _parse_timestamp_strategy(opts: OptionValues) -> TimestampStrategy:
    """startingOffsetsByTimestampStrategy. Unset, it is Kafka's default ``error`` for
    startingOffsetsByTimestamp (new, so nobody relies on another answer) and ``latest`` for
    startingTimestamp, which has always started such a queue at its end: a stream started
    at a time yet to come, or a batch window on queues that were quiet then, read nothing
    there rather than fail."""
    name = "startingOffsetsByTimestampStrategy"
    by_queue = opts.given("startingOffsetsByTimestamp")
    if opts.given(name) and not (by_queue or opts.given("startingTimestamp")):
        raise opts.bad(name, opts.get(name), "it says where a queue starts that has no message at or "
                       "after the starting time: set startingOffsetsByTimestamp or startingTimestamp "
                       "too, or remove it")
    if not opts.get(name):
        return TimestampStrategy.ERROR if by_queue else TimestampStrategy.LATEST
    return TimestampStrategy(opts.choice(name))


def _starting_position(
    opts: OptionValues, what: _What, stream: bool | None,
    consume_from_where: ConsumeFromWhere, consume_timestamp: int | None,
) -> StartingPosition:
    """The one start the user gave, else the default of this kind of read."""
    starting_ts = opts.epoch_ms("startingTimestamp")
    last_n = opts.integer("lastMessagesPerQueue")
    given = [name for name in _START_OPTIONS if opts.given(name)]
    if len(given) > 1:
        raise ValueError(
            f"pymq options {' and '.join(given)} cannot be used together: each says "
            "where reading starts. Keep one of them"
        )
    strategy = _parse_timestamp_strategy(opts)
    if starting_ts is not None:
        return StartingPosition(StartKind.TIMESTAMP, timestamp_ms=starting_ts, strategy=strategy)
    if opts.given("startingOffsetsByTimestamp"):
        timestamps = parse_timestamps_json(opts.text("startingOffsetsByTimestamp", ""),
                                           "startingOffsetsByTimestamp")
        return StartingPosition(StartKind.TIMESTAMPS, timestamps=timestamps, strategy=strategy)
    if last_n is not None:
        return StartingPosition(StartKind.LAST_N, count=last_n)
    if opts.get("startingOffsets"):
        return _parse_starting_offsets(opts.text("startingOffsets", ""), stream=stream is not False)
    if stream is not True:  # a batch read (or, at load(), not known yet)
        return StartingPosition(StartKind.EARLIEST)
    if what.clustering:
        return StartingPosition(StartKind.GROUP)
    return {
        ConsumeFromWhere.CONSUME_FROM_LAST_OFFSET: StartingPosition(StartKind.LATEST),
        ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET: StartingPosition(StartKind.EARLIEST),
        ConsumeFromWhere.CONSUME_FROM_TIMESTAMP: StartingPosition(
            StartKind.TIMESTAMP, timestamp_ms=consume_timestamp
        ),
    }[consume_from_where]


def _check_starting(opts: OptionValues, starting: StartingPosition, what: _What, stream: bool | None) -> None:
    """What the start needs of the other options (consumeFromWhere, group)."""
    given_start = any(opts.given(name) for name in _START_OPTIONS)
    consume_from_where_applies = starting.kind is StartKind.GROUP or (
        not given_start and (stream is None or (stream and not what.clustering))
    )
    if opts.given("consumeFromWhere") and not consume_from_where_applies:
        raise ValueError(
            f"pymq option consumeFromWhere={opts.get('consumeFromWhere')!r} cannot apply here: "
            "it says where a group starts on queues where it has no progress "
            "(startingOffsets=group) or where a BROADCASTING stream starts. Remove it"
        )
    if starting.kind is StartKind.GROUP:
        if not what.clustering:
            raise _bad(
                "startingOffsets",
                "group",
                "in BROADCASTING mode the broker keeps no progress for the group: use "
                "'earliest', 'latest', a JSON object or startingTimestamp",
            )
        if what.group is None:
            raise ValueError(
                "pymq option startingOffsets=group needs consumerGroup: set the group "
                "whose progress on the broker to start from"
            )


def _check_offset_topics(opts: OptionValues, options: SourceOptions) -> None:
    """A startingOffsets / endingOffsets JSON (or its ByTimestamp sibling) names only topics the
    query reads: its topics, and ``%RETRY%<consumerGroup>`` when it reads it along (the checkpoint
    keeps its offsets too)."""
    readable = options.all_topics()
    retry = options.retry_topic
    for name, offsets in (("startingOffsets", options.starting.offsets),
                          ("startingOffsetsByTimestamp", options.starting.timestamps),
                          ("endingOffsets", options.ending.offsets),
                          ("endingOffsetsByTimestamp", options.ending.timestamps)):
        unknown = sorted(topic for topic in {key[0] for key in offsets}
                         if topic != retry and not options.matches(topic))
        if not unknown and options.assigned is not None:
            # a queue assign does not name is never read: its start or end would be ignored
            other = sorted(key for key in offsets if not any(_same_queue(key, a) for a in options.assigned))
            if other:
                topic, broker, qid = other[0]
                raise opts.bad(name, opts.get(name), f"it names queue {f'{broker}:{qid}' if broker else qid} "
                               f"of {topic!r}, which {options.topic_option} does not: name only "
                               "assigned queues")
        if not unknown:
            continue
        if options.topic_pattern is not None:
            raise opts.bad(name, opts.get(name), f"it names topics {unknown} that {options.topic_option} "
                           f"does not match{f', nor {retry!r} read along' if retry else ''}")
        hint = ""
        if any(is_retry_topic(topic) for topic in unknown):
            hint = (" (with assign, name %RETRY%<consumerGroup>'s queues there to read them)"
                    if options.assigned is not None
                    else " (a query reads %RETRY%<consumerGroup> along with includeRetry=true)")
        raise opts.bad(
            name, opts.get(name),
            f"it names topics {unknown} that the query does not read: it can name "
            f"{', '.join(repr(topic) for topic in readable)}{hint}",
        )


# -- where a batch read ends -----------------------------------------------------------------------


def _check_start_before_end(starts: Mapping[QueueKey, int], ends: Mapping[QueueKey, int]) -> None:
    """A queue given a start after its end in the two JSONs: a mistake, not an empty range (Spark's
    Kafka batch read fails on it too). A key without a broker name applies to every broker's queue."""
    for (topic, broker, qid), first in sorted(starts.items()):
        for (end_topic, end_broker, end_qid), last in sorted(ends.items()):
            same_broker = broker == end_broker or "" in (broker, end_broker)
            if (topic, qid) == (end_topic, end_qid) and same_broker and 0 <= last < first:
                queue = f"{broker or end_broker}:{qid}" if broker or end_broker else str(qid)
                raise ValueError(
                    f"pymq options: queue {queue} of {topic!r} starts at {first} (startingOffsets) after "
                    f"its end {last} (endingOffsets), so nothing lies between; give a start at or "
                    "before the end"
                )


def _same_queue(one: QueueKey, other: QueueKey) -> bool:
    """Whether two keys can name one queue: topic ``""`` is every queue, broker ``""`` any broker."""
    if "" in (one[0], other[0]):
        return True
    return one[0] == other[0] and one[2] == other[2] and (one[1] == other[1] or "" in (one[1], other[1]))


def _check_times(starting: StartingPosition, ending: EndingPosition) -> None:
    """A queue given a starting time after its ending time: a mistake, not an empty range. Either
    side may be one time for every queue or times per queue (a key without a broker name
    applies to every broker's queue)."""
    if ending.kind is StartKind.TIMESTAMP and starting.kind is StartKind.TIMESTAMP:
        if (starting.timestamp_ms or 0) > (ending.timestamp_ms or 0):
            raise _bad("endingTimestamp", ending.timestamp_ms,
                       f"it is before startingTimestamp={starting.timestamp_ms}")
        return
    if starting.kind is StartKind.TIMESTAMPS:
        starts = dict(starting.timestamps)
    elif starting.kind is StartKind.TIMESTAMP and starting.timestamp_ms is not None:
        starts = {("", "", -1): starting.timestamp_ms}  # every queue
    else:
        return
    if ending.kind is StartKind.TIMESTAMPS:
        ends = dict(ending.timestamps)
    elif ending.kind is StartKind.TIMESTAMP and ending.timestamp_ms is not None:
        ends = {("", "", -1): ending.timestamp_ms}
    else:
        return
    for start_key, first in sorted(starts.items()):
        for end_key, last in sorted(ends.items()):
            if last < first and _same_queue(start_key, end_key):
                topic, _, qid = end_key if end_key[0] else start_key
                broker = start_key[1] or end_key[1]
                queue = f"queue {f'{broker}:{qid}' if broker else qid} of {topic!r}"
                raise ValueError(
                    f"pymq options: {queue} starts at time {first} ({starting.option}) after its "
                    f"end at time {last} ({'endingOffsetsByTimestamp' if end_key[0] else 'endingTimestamp'})"
                    ", so nothing lies between; give a start at or before the end"
                )


def _parse_ending(opts: OptionValues, starting: StartingPosition) -> EndingPosition:
    ending_ts = opts.epoch_ms("endingTimestamp")
    given = [name for name in _END_OPTIONS if opts.given(name)]
    if len(given) > 1:
        raise ValueError(
            f"pymq options {' and '.join(given)} cannot be used together: each says "
            "where a batch read ends. Keep one of them"
        )
    if ending_ts is not None:
        ending = EndingPosition(StartKind.TIMESTAMP, timestamp_ms=ending_ts)
        _check_times(starting, ending)
        return ending
    if opts.given("endingOffsetsByTimestamp"):
        timestamps = parse_timestamps_json(opts.text("endingOffsetsByTimestamp", ""),
                                           "endingOffsetsByTimestamp")
        ending = EndingPosition(StartKind.TIMESTAMPS, timestamps=timestamps)
        _check_times(starting, ending)
        return ending
    if not opts.get("endingOffsets"):
        return EndingPosition(StartKind.LATEST)
    value = opts.text("endingOffsets")
    if value.lower() == "latest":
        return EndingPosition(StartKind.LATEST)
    if value.startswith("{"):
        offsets = parse_offsets_json(value, "endingOffsets", allow_earliest=False)
        if starting.kind is StartKind.OFFSETS:
            _check_start_before_end(starting.offsets, offsets)
        return EndingPosition(StartKind.OFFSETS, offsets=offsets)
    raise _bad(
        "endingOffsets",
        value,
        "use 'latest' or a JSON object such as "
        '{"orders": {"broker-a:0": 100}} (-1 latest)',
    )


# -- retries ---------------------------------------------------------------------------------------


def _parse_include_retry(opts: OptionValues, what: _What, stream: bool | None) -> bool:
    """includeRetry: defaults to true for streams in CLUSTERING with a group.

    At load() (``stream`` None) the default is a stream's: what a stream accepts (an offsets
    JSON naming %RETRY%<consumerGroup>) must not be refused before Spark says it is one.
    """
    if what.assigned is not None:
        # the named queues only: two queries that split a topic's queues would each read every queue
        # of the group's %RETRY% topic (RocketMQ's assign mode reads no retry topic either); its
        # queues named in assign are read along
        if opts.given("includeRetry"):
            raise _bad(
                "includeRetry", opts.get("includeRetry"),
                f"with assign a query reads the queues it names, and no others: name the queues of "
                f"{get_retry_topic(what.group or '<consumerGroup>')!r} in assign to read retries (in "
                "one of the queries that split a topic's queues), or remove includeRetry",
            )
        # _parse_what took the group's retry topic out of the topics when assign names it
        return any(key[0] not in what.topics for key in what.assigned)
    default = stream is not False and what.clustering and what.group is not None
    include_retry = opts.boolean("includeRetry", default)
    if include_retry and not what.clustering:
        raise _bad(
            "includeRetry",
            opts.get("includeRetry"),
            "BROADCASTING consumers get no retries (RocketMQ does not retry broadcast "
            "messages): remove it or set messageModel=CLUSTERING",
        )
    if include_retry and what.group is None:
        raise ValueError(
            "pymq option includeRetry=true needs consumerGroup: retries live in "
            "%RETRY%<consumerGroup>"
        )
    return include_retry


_DURATION = re.compile(r"(\d+)\s*(ms|s|sec|m|min|h|d)?", re.IGNORECASE)
_DURATION_MS = {"ms": 1, "s": 1000, "sec": 1000, "m": 60_000, "min": 60_000, "h": 3_600_000,
                "d": 86_400_000}


def _parse_min_per_trigger(opts: OptionValues) -> tuple[int | None, int]:
    """minMessagesPerTrigger and maxTriggerDelay (ms), as Spark's Kafka source's pair."""
    least = opts.integer("minMessagesPerTrigger")
    most = opts.integer("maxMessagesPerTrigger")
    if least is not None and most is not None and least > most:
        raise opts.bad("minMessagesPerTrigger", least,
                       f"it is above maxMessagesPerTrigger={most}: a batch could never hold it")
    text = opts.text("maxTriggerDelay")
    found = _DURATION.fullmatch(text)
    if found is None:
        raise opts.bad("maxTriggerDelay", text, "use a duration such as 30s, 15m or 1h "
                       "(units ms, s, m, h, d; a bare number is milliseconds)")
    delay_ms = int(found.group(1)) * _DURATION_MS[(found.group(2) or "ms").lower()]
    if opts.given("maxTriggerDelay") and least is None:
        raise opts.bad("maxTriggerDelay", text, "it bounds how long a batch waits for "
                       "minMessagesPerTrigger messages: set minMessagesPerTrigger too, or remove it")
    return least, delay_ms


# -- the whole ---------------------------------------------------------------------------------------


def parse_source_options(raw: Mapping[str, str], *, stream: bool | None) -> SourceOptions:
    """Validate the user's options for a stream (``stream=True``) or a batch read.

    ``stream=None`` checks what does not depend on the kind of read (names,
    values, combinations): ``DataSource.schema()`` runs it at ``load()``, before
    Spark says whether the read is a stream, so most mistakes fail right there.
    """
    opts = OptionValues(SOURCE_OPTIONS, raw, stream)
    backend = parse_backend_options(opts.get, SOURCE_OPTIONS.prefix)
    what = _parse_what(opts, backend, stream)
    consume_from_where, consume_timestamp = _parse_consume_from_where(opts)
    starting = _starting_position(opts, what, stream, consume_from_where, consume_timestamp)
    _check_starting(opts, starting, what, stream)
    ending = _parse_ending(opts, starting)
    include_retry = _parse_include_retry(opts, what, stream)
    min_per_trigger, max_trigger_delay_ms = _parse_min_per_trigger(opts)
    options = SourceOptions(
        backend=backend,
        topics=what.topics,
        topic_pattern=what.pattern,
        assigned=what.assigned,
        stream=bool(stream),
        consumer_group=what.group,
        message_model=what.model,
        subscription=what.subscription,
        subscription_type=what.subscription_type,
        starting=starting,
        consume_from_where=consume_from_where,
        consume_timestamp_ms=consume_timestamp,
        ending=ending,
        max_messages_per_trigger=opts.integer("maxMessagesPerTrigger"),
        min_messages_per_trigger=min_per_trigger,
        max_trigger_delay_ms=max_trigger_delay_ms,
        pull_batch_size=opts.integer_or_default("pullBatchSize"),
        pull_max_bytes=opts.integer_or_default("pullMaxBytes"),
        poll_timeout_ms=opts.integer_or_default("pollTimeoutMs"),
        connect_timeout_ms=opts.integer_or_default("connectTimeoutMs"),
        min_partitions=opts.integer("minPartitions"),
        max_messages_per_partition=opts.integer("maxMessagesPerPartition"),
        fail_on_data_loss=opts.boolean("failOnDataLoss"),
        include_retry=include_retry,
    )
    _check_offset_topics(opts, options)
    return options

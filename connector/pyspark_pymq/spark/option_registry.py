"""Every option of ``format("pymq")``, once: the one source of truth for parsers and docs.

Three registries, one per kind of query:

- :data:`SOURCE_OPTIONS`: ``spark.readStream`` / ``spark.read`` (parsed by
  :func:`pyspark_pymq.spark.options.parse_source_options`);
- :data:`SINK_OPTIONS`: ``df.writeStream`` / ``df.write`` (parsed by
  :func:`pyspark_pymq.spark.sink_options.parse_sink_options`);
- :data:`VIEW_OPTIONS`: ``spark.read.option("view", ...)``, the broker tables
  (parsed by :func:`pyspark_pymq.spark.views.parse_view_options`).

Each :class:`OptionSpec` says the option's name (as documented; Spark's
options are case-insensitive), its type and bounds, its default, whether it
applies to streams, batch queries or both, which broker it acts on, and what it
does. The parsers resolve names, scopes, bounds, choices and defaults here;
``python -m pyspark_pymq.spark.option_docs`` renders the option lists of
``PymqDataSource``'s docstring and README.md from here, and
``tests/test_option_docs.py`` fails when those differ from what it renders.

``doc`` text is Markdown-flavoured: `code` in single backticks, links as
``[text](#anchor)``; the renderers turn it into Markdown table cells or
reStructuredText. It describes what the option does; type, default, scope and
broker are columns of their own and are not repeated in it.

This module only holds data: it imports nothing of Spark.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Literal

from ..client.message import DEFAULT_MAX_MESSAGE_SIZE, SEND_MODES

__all__ = [
    "ACTIONS",
    "DEFAULT_CONNECT_TIMEOUT_MS",
    "DEFAULT_MAX_IN_FLIGHT",
    "DEFAULT_POLL_TIMEOUT_MS",
    "DEFAULT_PRODUCER_GROUP",
    "DEFAULT_PULL_BATCH_SIZE",
    "DEFAULT_PULL_MAX_BYTES",
    "DEFAULT_READER_GROUP",
    "DELIVERY_GUARANTEES",
    "JAVA_INT_MAX",
    "MAX_PULL_BATCH_SIZE",
    "MAX_PULL_MAX_BYTES",
    "REGISTRIES",
    "SINK_OPTIONS",
    "SOURCE_OPTIONS",
    "TOOLS_CONSUMER_GROUP",
    "VIEW_OPTIONS",
    "OptionRegistry",
    "OptionSpec",
    "browse_group",
]

OptionType = Literal["string", "integer", "boolean", "choice", "list", "json", "json_object"]
#: "json": a keyword (`latest`, ...) or a JSON object; "json_object": a JSON object only.
#: Which queries an option applies to: streams (readStream / writeStream), batch ones, or both.
Scope = Literal["both", "stream", "batch"]
#: Which broker the option acts on: the embedded pymq broker (endpoint), Apache RocketMQ, or both.
BackendScope = Literal["both", "pymq", "rocketmq"]

#: Group name used for pulls when the user gave none (batch reads, BROADCASTING).
#: Nothing is ever committed under it.
DEFAULT_READER_GROUP = "PYMQ_SPARK_READER"
#: RocketMQ's ``MixAll.TOOLS_CONSUMER_GROUP``: every broker creates it at start
#: (``SubscriptionGroupManager.init``) and RocketMQ's own tools pull as it. A production cluster
#: (``autoCreateSubscriptionGroup=false``) refuses pulls of any group not created for it.
TOOLS_CONSUMER_GROUP = "TOOLS_CONSUMER"

MAX_PULL_BATCH_SIZE = 100_000  # the broker answers at most this many messages per pull
DEFAULT_PULL_BATCH_SIZE = 32_768
# Measured on loopback: pulls answering ~1 MiB move 2-3x more bytes per second than
# 4 MiB ones (gRPC and allocation costs grow faster than linearly past ~2 MiB).
DEFAULT_PULL_MAX_BYTES = 1 << 20
MAX_PULL_MAX_BYTES = 64 << 20
DEFAULT_POLL_TIMEOUT_MS = 60_000
DEFAULT_CONNECT_TIMEOUT_MS = 10_000

ACTIONS = ("send", "reconsumeLater")
DELIVERY_GUARANTEES = ("at-least-once", "exactly-once")
DEFAULT_PRODUCER_GROUP = "PYMQ_SPARK_SINK"
# Each request of the sink is a batch of up to maxBatchBytes (4 MiB), not one message: a
# few in flight keep the broker busy, while 64 (the client's default) held ~200 MB per task
# and were ~30% slower (BENCHMARKS.md), with the last requests near sendMsgTimeoutMs.
DEFAULT_MAX_IN_FLIGHT = 4
# maxMessageSize's ceiling: a row's body is one Arrow value and one gRPC message, and the broker's
# commit-log segment (256 MiB) holds at least two of them
MAX_MESSAGE_SIZE_LIMIT = 128 * 1024 * 1024
# RocketMQ's send back carries maxReconsumeTimes and the delay level as Java ints (int32 on the wire)
JAVA_INT_MAX = 2**31 - 1


def browse_group(backend: str, pymq_group: str = DEFAULT_READER_GROUP) -> str:
    """The group that pulls carry when nothing is committed (batch reads, dead letters, tail):
    ``pymq_group`` on the embedded broker, :data:`TOOLS_CONSUMER_GROUP` on RocketMQ (``backend``
    is a ``BackendConfig.kind``)."""
    return TOOLS_CONSUMER_GROUP if backend == "rocketmq" else pymq_group


@dataclass(frozen=True)
class OptionSpec:
    """One option: what the parser checks and what the docs say.

    ``default`` is the value the parser uses when the option is unset (None: unset
    means "none", or the default depends on other options: ``default_doc`` then
    says how). ``required`` says how the option is required, when it is
    ("required", "`endpoint` or `namesrvAddr` required"). ``minimum`` and
    ``maximum`` bound integers; ``choices`` are a choice's values as documented
    (matched case-insensitively), ``aliases`` other spellings accepted for them.
    """

    name: str
    type: OptionType
    doc: str
    default: str | int | bool | None = None
    default_doc: str | None = None
    required: str | None = None
    scope: Scope = "both"
    backend: BackendScope = "both"
    minimum: int | None = None
    maximum: int | None = None
    choices: tuple[str, ...] = ()
    aliases: tuple[tuple[str, str], ...] = ()  # (accepted spelling, choice)
    section: str = ""  # where the parser handles it: where / what / start / end / limits / retries / ...

    def __post_init__(self) -> None:
        if self.type == "choice" and not self.choices:
            raise ValueError(f"option {self.name}: a choice needs choices")
        if self.type != "integer" and (self.minimum is not None or self.maximum is not None):
            raise ValueError(f"option {self.name}: only integers have bounds")

    def choice(self, value: str) -> str | None:
        """``value`` as one of ``choices`` (case-insensitive, aliases resolved), else None."""
        low = value.lower()
        for choice in self.choices:
            if choice.lower() == low:
                return choice
        for alias, choice in self.aliases:
            if alias.lower() == low:
                return choice
        return None


@dataclass(frozen=True)
class OptionRegistry:
    """The options of one kind of query, in documentation order."""

    kind: str  # "source", "sink" or "view": names the regions of the rendered docs
    options: tuple[OptionSpec, ...]
    prefix: str  # how errors name an option: "pymq option", "pymq sink option"
    known_label: str  # "Known options": heads the list in an unknown-option error
    stream_api: str  # readStream / writeStream: for the scope column and errors
    batch_api: str  # read / write
    stream_words: tuple[str, str]  # ("a stream", "streams (spark.readStream)")
    batch_words: tuple[str, str]  # ("a batch read", "batch reads (spark.read)")
    scoped: bool = True  # False: every option applies to one kind of query; no scope column
    unknown: str = "is unknown"  # what an unknown-option error says of the name
    _by_lower: dict[str, OptionSpec] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        by_lower = {spec.name.lower(): spec for spec in self.options}
        if len(by_lower) != len(self.options):
            raise ValueError(f"{self.kind} options: a name is registered twice")
        object.__setattr__(self, "_by_lower", by_lower)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(spec.name for spec in self.options)

    def lookup(self, key: object) -> OptionSpec | None:
        """The option named ``key`` in any case (Spark lower-cases option names), else None."""
        return self._by_lower.get(str(key).lower())

    def __getitem__(self, name: str) -> OptionSpec:
        spec = self.lookup(name)
        if spec is None:
            raise KeyError(name)
        return spec

    def __iter__(self) -> Iterator[OptionSpec]:
        return iter(self.options)

    def __len__(self) -> int:
        return len(self.options)


# -- where: shared by every registry -------------------------------------------------------

_ENDPOINT_OR_NAMESRV = "`endpoint` or `namesrvAddr` required"
ENDPOINT = OptionSpec(
    "endpoint", "string", section="where", backend="pymq", required=_ENDPOINT_OR_NAMESRV,
    doc="`host:port` of a pymq broker: the address `pymq-broker` prints (`pymq broker listening on "
        "HOST:PORT`) or `EmbeddedBroker.endpoint`. Set exactly one of `endpoint` and `namesrvAddr`.",
)
NAMESRV_ADDR = OptionSpec(
    "namesrvAddr", "string", section="where", backend="rocketmq", required=_ENDPOINT_OR_NAMESRV,
    doc="Apache RocketMQ's name servers, `host:9876;host2:9876` "
        "(see [Use with Apache RocketMQ](#use-with-apache-rocketmq)): requests go to the brokers of each "
        "topic's route.",
)
ACCESS_KEY = OptionSpec(
    "accessKey", "string", section="where",
    doc="ACL access key (a user of the broker), with `secretKey` (both or neither): every request is "
        "signed, to a pymq broker as RocketMQ 5's gRPC clients sign (`MQv2-HMAC-SHA1`), to Apache "
        "RocketMQ as its `AclClientRPCHook` does.",
)
SECRET_KEY = OptionSpec(
    "secretKey", "string", section="where",
    doc="ACL secret key, with `accessKey`; it never shows in plans, logs or error messages (under "
        "Spark Connect see `secretKeyFile`).",
)
SECRET_KEY_FILE = OptionSpec(
    "secretKeyFile", "string", section="where",
    doc="instead of `secretKey`: a file whose first line is the ACL secret key, read on the driver "
        "when the query is planned. The secret is then in no option: a Spark Connect server, which "
        "records each request's options in its event log and UI, never sees it.",
)
TLS = OptionSpec(
    "tls", "boolean", section="where", default=False,
    doc="encrypt connections with TLS and verify the broker's certificate and host name (or IP address) "
        "against `tlsCaFile`, or the system's trust store without it.",
)
TLS_CA_FILE = OptionSpec(
    "tlsCaFile", "string", section="where",
    doc="with `tls=true`: PEM file of the certificate authorities to trust (a self-signed broker "
        "certificate or its CA). The file must be readable on the driver and every executor.",
)
TLS_CERT_FILE = OptionSpec(
    "tlsCertFile", "string", section="where",
    doc="with `tls=true` and `tlsKeyFile`: PEM certificate chain this client presents (mutual TLS).",
)
TLS_KEY_FILE = OptionSpec(
    "tlsKeyFile", "string", section="where",
    doc="with `tls=true` and `tlsCertFile`: the client certificate's PEM private key (unencrypted).",
)
_WHERE = (ENDPOINT, NAMESRV_ADDR, ACCESS_KEY, SECRET_KEY, SECRET_KEY_FILE, TLS, TLS_CA_FILE, TLS_CERT_FILE,
          TLS_KEY_FILE)


# -- the source ------------------------------------------------------------------------------

_TOPIC_OR_PATTERN = "`topic`, `subscribePattern` or `assign` required"

_SOURCE = (
    *_WHERE,
    # what
    OptionSpec(
        "topic", "list", section="what", required=_TOPIC_OR_PATTERN,
        doc="one topic or a comma-separated list (`orders,payments`; a topic named twice is read "
            "once). Names are 1-127 letters, digits, `%`, `|`, `_` or `-`, so `%RETRY%<group>` and "
            "`%DLQ%<group>` can be read too.",
    ),
    OptionSpec(
        "subscribePattern", "string", section="what", required=_TOPIC_OR_PATTERN,
        doc="the topics whose whole name matches this regular expression (Spark's Kafka option; "
            "Python's `re` syntax, which agrees with Java's for the usual `orders-.*` or "
            "`(orders|payments)_eu`). A stream looks for matching topics at every trigger and reads "
            "a new one from its first message (one deleted goes through `failOnDataLoss`); a batch "
            "read takes those there are when it is "
            "planned (none: no rows). System topics (`%RETRY%`, `%DLQ%`, `RMQ_SYS_*`, "
            "`SCHEDULE_TOPIC_XXXX`, `TBW102`, ...) never match. Instead of `topic`; listing topics "
            "needs the broker's LIST permission where users are on.",
    ),
    OptionSpec(
        "assign", "json_object", section="what", required=_TOPIC_OR_PATTERN,
        doc="some queues of some topics, and only those (Spark's Kafka option; RocketMQ's "
            '`DefaultLitePullConsumer.assign`): `{"orders": ["broker-a:0", "broker-a:1"], '
            '"payments": [2]}` (a bare queue id: that queue on any broker). Queries that split a '
            "topic's queues between them can share a `consumerGroup`: each commits the progress of "
            "its own queues; before another query takes a queue over from the group's progress, write "
            "the last batch of the query that read it (`commit_group_progress`: a stopped query's "
            "last batch is not committed). No retries are read along unless named: "
            "`%RETRY%<consumerGroup>`'s queues in one query's `assign` are read as `includeRetry` "
            "reads them (which is refused with `assign`). A named queue the topic does not have "
            "fails the query at its start, and is logged once when a stream restarted from its "
            "checkpoint finds it missing; one gone mid-stream waits, as any queue a topic no longer "
            "reads. Instead of `topic` and `subscribePattern`.",
    ),
    OptionSpec(
        "consumerGroup", "string", section="what",
        doc="the consumer group: 1-127 letters, digits, `|`, `_` or `-`. Required for streams in "
            "CLUSTERING, whose progress on the broker is the group's; batch reads need none (their "
            f"pulls carry `{DEFAULT_READER_GROUP}`, or RocketMQ's `{TOOLS_CONSUMER_GROUP}` on RocketMQ, "
            "under which nothing is committed).",
    ),
    OptionSpec(
        "messageModel", "choice", section="what", default="CLUSTERING",
        choices=("CLUSTERING", "BROADCASTING"),
        doc="`CLUSTERING`: Spark's commits of a stream become the group's progress on the broker, and "
            "retries are read along. `BROADCASTING`: nothing is written to the broker and there are "
            "no retries; progress lives in Spark's checkpoint only.",
    ),
    OptionSpec(
        "subscription", "string", section="what", default="*",
        doc="which messages, filtered on the broker: a tag expression such as `*` or `TagA || TagB`; "
            "with `subscriptionType=SQL92` a filter on user properties such as "
            "`amount > 100 AND region IN ('eu')`.",
    ),
    OptionSpec(
        "subscriptionType", "choice", section="what", default="TAG", choices=("TAG", "SQL92"),
        doc="how `subscription` is read: `TAG`, a tag expression; `SQL92`, RocketMQ's filter on user "
            "properties. Before the query starts its syntax is checked and each broker asked whether "
            "it serves SQL92 (RocketMQ's CHECK_CLIENT_CONFIG): the broker must allow it, "
            "`pymq-broker --enable-property-filter`, or `enablePropertyFilter=true` on RocketMQ.",
    ),
    # where reading starts
    OptionSpec(
        "startingOffsets", "json", section="start",
        default_doc="streams: `group` (CLUSTERING); batch: `earliest`",
        doc="where reading starts. `group`: the group's progress on the broker, else "
            "`consumeFromWhere` (CLUSTERING only); `earliest`; `latest` (streams: a batch read would "
            'read nothing); or JSON `{"orders": {"broker-a:0": 42, "broker-a:1": -2}}` (-2 earliest, '
            '-1 latest, streams only; a key `"1"` means queue 1 on any broker; unlisted queues start '
            'at earliest), '
            "naming the query's topics and, with `includeRetry`, `%RETRY%<consumerGroup>`; an offset "
            "before a queue's first message or past its end goes through `failOnDataLoss`. "
            "A BROADCASTING stream without it starts where `consumeFromWhere` says.",
    ),
    OptionSpec(
        "startingTimestamp", "integer", section="start", minimum=0,
        doc="milliseconds since the epoch: each queue starts at its first message stored at or after "
            "it; one without such a message starts at its end (see "
            "`startingOffsetsByTimestampStrategy`). Instead of `startingOffsets`, "
            "`startingOffsetsByTimestamp` and `lastMessagesPerQueue`.",
    ),
    OptionSpec(
        "startingOffsetsByTimestamp", "json_object", section="start",
        doc="a time per queue, in milliseconds since the epoch, keyed as `startingOffsets` JSON "
            '(Spark\'s Kafka option): `{"orders": {"broker-a:0": 1700000000000, "1": 1700000060000}}`; '
            "each queue named starts at its first message stored at or after its time, unlisted "
            "queues start at earliest (as in `startingOffsets` JSON). It names the query's topics and, "
            "with `includeRetry`, `%RETRY%<consumerGroup>`. Instead of `startingOffsets`, "
            "`startingTimestamp` and `lastMessagesPerQueue`.",
    ),
    OptionSpec(
        "startingOffsetsByTimestampStrategy", "choice", section="start", choices=("error", "latest"),
        default_doc="`error` with `startingOffsetsByTimestamp` (Kafka's default); `latest` with "
                    "`startingTimestamp`",
        doc="what a queue does that has no message stored at or after its starting time: `error` "
            "fails the query naming the topic, the queue and the time (an empty queue too, as "
            "Kafka's); `latest` starts it at its end. `startingTimestamp` keeps `latest` unless "
            "this says `error`, as it always started such a queue at its end (a stream started at a "
            "time yet to come reads what comes from then); with it, `%RETRY%<consumerGroup>` read "
            "along is never refused. Only with `startingTimestamp` or `startingOffsetsByTimestamp`.",
    ),
    OptionSpec(
        "consumeFromWhere", "choice", section="start", default="CONSUME_FROM_LAST_OFFSET",
        choices=("CONSUME_FROM_LAST_OFFSET", "CONSUME_FROM_FIRST_OFFSET", "CONSUME_FROM_TIMESTAMP"),
        aliases=(
            ("LAST", "CONSUME_FROM_LAST_OFFSET"),
            ("LAST_OFFSET", "CONSUME_FROM_LAST_OFFSET"),
            ("FIRST", "CONSUME_FROM_FIRST_OFFSET"),
            ("FIRST_OFFSET", "CONSUME_FROM_FIRST_OFFSET"),
            ("TIMESTAMP", "CONSUME_FROM_TIMESTAMP"),
        ),
        doc="where `startingOffsets=group` starts on a queue where the group has no progress, and "
            "where a BROADCASTING stream starts (RocketMQ's names): the queue's end (new messages "
            "only), its first message, or `consumeTimestamp`.",
    ),
    OptionSpec(
        "consumeTimestamp", "integer", section="start", minimum=0,
        doc="milliseconds since the epoch, for `consumeFromWhere=CONSUME_FROM_TIMESTAMP` (which needs "
            "it, and only it takes it): start at the first message stored at or after it.",
    ),
    # where a batch read ends
    OptionSpec(
        "endingOffsets", "json", section="end", scope="batch", default="latest",
        doc="where the read ends (exclusive): `latest`, resolved once when the read is planned, or "
            'JSON `{"orders": {"broker-a:0": 100}}` (-1 latest; unlisted queues end at latest), '
            "naming the query's topics and, with `includeRetry`, `%RETRY%<consumerGroup>`; a queue "
            "that `startingOffsets` starts after its end here is refused.",
    ),
    OptionSpec(
        "endingTimestamp", "integer", section="end", scope="batch", minimum=0,
        doc="milliseconds since the epoch: each queue ends before its first message stored at or "
            "after it. Instead of `endingOffsets` and `endingOffsetsByTimestamp`; not before the "
            "starting time.",
    ),
    OptionSpec(
        "endingOffsetsByTimestamp", "json_object", section="end", scope="batch",
        doc="a time per queue, in milliseconds since the epoch, keyed as `endingOffsets` JSON "
            '(Spark\'s Kafka option): `{"orders": {"broker-a:0": 1700000000000}}`; each queue named '
            "ends before its first message stored at or after its time (at its end if there is "
            "none), unlisted queues end at latest. Instead of `endingOffsets` and `endingTimestamp`; "
            "a queue whose starting time is after its time here is refused.",
    ),
    OptionSpec(
        "lastMessagesPerQueue", "integer", section="start", scope="batch", minimum=1,
        doc="the last N messages of each queue (before the end `endingOffsets` or `endingTimestamp` "
            "sets). Instead of `startingOffsets` and `startingTimestamp`. It counts queue offsets, "
            "so a filtered subscription returns fewer rows.",
    ),
    # limits
    OptionSpec(
        "maxMessagesPerTrigger", "integer", section="limits", scope="stream", minimum=1,
        default_doc="all",
        doc="at most N messages per micro-batch, shared among queues by backlog; it counts queue "
            "offsets, so a filtered subscription returns fewer rows. `Trigger.AvailableNow` honours "
            "it over several batches.",
    ),
    OptionSpec(
        "minMessagesPerTrigger", "integer", section="limits", scope="stream", minimum=1,
        default_doc="none",
        doc="a micro-batch waits until at least N new messages are there, or `maxTriggerDelay` has "
            "passed since the last one (Spark's Kafka `minOffsetsPerTrigger`): fewer, larger batches "
            "from a trickle. Counts queue offsets as `maxMessagesPerTrigger`, and is not above it. "
            "`Trigger.AvailableNow` ignores it.",
    ),
    OptionSpec(
        "maxTriggerDelay", "string", section="limits", scope="stream", default="15m",
        doc="with `minMessagesPerTrigger`: the longest a micro-batch waits for them, since the last "
            "batch, e.g. `30s`, `15m` (units ms, s, m, h, d; a bare number is ms), as Kafka's.",
    ),
    OptionSpec(
        "failOnDataLoss", "boolean", section="limits", default=True,
        doc="what happens when messages to read are gone (expired by `fileReservedTime`, topic "
            "deleted, or deleted and created again): `true` fails the query saying what was lost; "
            "`false` logs it and skips ahead (a re-created topic is read from its first message). "
            "The pymq broker gives each topic an id when it is created, so a stream tells a "
            "re-created topic whatever its offsets. Where there is no id (a RocketMQ cluster, "
            "`%RETRY%`/`%DLQ%` topics, topics made before pymq had ids, batch reads), as in Spark's "
            "Kafka source only offsets going back show it, and a topic re-created with as many "
            "messages as the stream had read goes unnoticed (its first ones are skipped); give the "
            "new topic a new name or start a new checkpoint.",
    ),
    OptionSpec(
        "includeRetry", "boolean", section="retries",
        default_doc="streams in CLUSTERING with a `consumerGroup` (without `assign`): `true`; else `false`",
        doc="read `%RETRY%<consumerGroup>` too (needs `consumerGroup` and CLUSTERING). Its queues "
            "start as the topics' do (`startingOffsets`, `startingTimestamp`, `lastMessagesPerQueue`), "
            "except that with `startingOffsets=group` a queue without the group's progress starts "
            "as RocketMQ's consumers start retry topics: at its first message, or with "
            "`consumeFromWhere=CONSUME_FROM_TIMESTAMP` at its last. A retried message shows its "
            "original topic in `topic` and the retry topic in `retry_topic`.",
    ),
    OptionSpec(
        "pullBatchSize", "integer", section="limits", default=DEFAULT_PULL_BATCH_SIZE,
        minimum=1, maximum=MAX_PULL_BATCH_SIZE,
        doc="at most this many messages per pull. RocketMQ's brokers answer at most "
            "`maxTransferCountOnMessageInMemory` (32) per pull, so an unfiltered pull goes out to "
            "them as up to 64 pulls in flight.",
    ),
    OptionSpec(
        "pullMaxBytes", "integer", section="limits", backend="pymq", default=DEFAULT_PULL_MAX_BYTES,
        minimum=1, maximum=MAX_PULL_MAX_BYTES,
        doc="at most this many bytes per pull (~1 MiB answers are the fastest over gRPC). RocketMQ's "
            "brokers apply their own `maxTransferBytesOnMessageInMemory` instead.",
    ),
    OptionSpec(
        "pollTimeoutMs", "integer", section="limits", default=DEFAULT_POLL_TIMEOUT_MS, minimum=1,
        doc="timeout of one pull in a task; a broker that does not answer (restarting, or crashed in "
            "a cluster) is asked again until its pulls have failed for this long.",
    ),
    OptionSpec(
        "connectTimeoutMs", "integer", section="limits", default=DEFAULT_CONNECT_TIMEOUT_MS,
        minimum=1,
        doc="timeout of the driver's calls to the broker (routes, offsets, progress): an unreachable "
            "broker fails the query within it, naming the endpoint.",
    ),
    OptionSpec(
        "minPartitions", "integer", section="limits", minimum=1,
        default_doc="one per queue with 1,000 messages or more; smaller ones together",
        doc="split large ranges so that a batch has at least this many Spark partitions (shared by "
            "size, as Spark's Kafka source does), and give each queue's range a partition of its own. "
            "Without it, the ranges of queues with fewer than 1,000 new messages share partitions of "
            "up to 1,000 messages: a Python source's task costs ~50 ms whatever it reads, so a "
            "trickle over 256 queues would make 256 tasks a batch (768 messages on 256 queues: "
            "0.7 s read together, 8 to 9 s one task a queue).",
    ),
    OptionSpec(
        "maxMessagesPerPartition", "integer", section="limits", minimum=1, default_doc="no limit",
        doc="split ranges larger than this: no Spark partition reads more messages (small ranges "
            "share partitions of at most this many).",
    ),
)


# -- the sink --------------------------------------------------------------------------------

_SINK = (
    *_WHERE,
    OptionSpec(
        "topic", "string", section="what",
        doc="the topic of every row; without it, each row's `topic` column. As in Spark's Kafka sink the "
            "option wins over a `topic` column, so rows read from pymq and written on are not sent back "
            "to their own topics. One topic: use a `topic` column (and no option) for several.",
    ),
    OptionSpec(
        "action", "choice", section="what", default="send", choices=ACTIONS,
        doc="`send`: produce the rows as messages; `reconsumeLater`: send rows read from a pymq source "
            "back to `%RETRY%<consumerGroup>` (RocketMQ's send back: after `maxReconsumeTimes` "
            "retries they go to `%DLQ%<consumerGroup>`).",
    ),
    OptionSpec(
        "sendMode", "choice", section="send", default="sync", choices=SEND_MODES,
        doc="`sync`: every batch acknowledged; a timeout, an unreachable or a busy broker is retried "
            "`retryTimesWhenSendFailed` times, on another broker where there is one, unless a "
            "`queue_id` or `sharding_key` column pins the queue. `async`: a bounded in-flight window; "
            "the task still waits for every acknowledgement and fails on a failed one; not retried "
            "unless `retryTimesWhenSendAsyncFailed` > 0, as in RocketMQ. `oneway`: **lossy** in its "
            "answers: a send a broker took but failed does not fail the task (the executor log says how "
            "many rows were not acknowledged); as RocketMQ's `sendOneway` throws, a send that reaches no "
            "broker (no route, a broker that does not answer) or can never succeed, such as to a topic "
            "without write permission, still fails it. "
            "An answer other than `SEND_OK` (`FLUSH_DISK_TIMEOUT`, `FLUSH_SLAVE_TIMEOUT`, "
            "`SLAVE_NOT_AVAILABLE`: stored, not yet durable) fails the task too, so that Spark sends "
            "those rows again with the same msgIds; `sync` first sends them to another broker where "
            "there is one (RocketMQ's `retryAnotherBrokerWhenNotStoreOK`).",
    ),
    OptionSpec(
        "deliveryGuarantee", "choice", section="send", default="at-least-once", choices=DELIVERY_GUARANTEES,
        doc="`exactly-once` (`writeStream` with `action=send`, pymq `endpoint` only for now): each "
            "micro-batch's rows are half messages committed with the batch, so consumers see every "
            "row once. It needs a local or mounted "
            "`checkpointLocation` and `sendMode` `sync` or `async`.",
    ),
    OptionSpec(
        "producerGroup", "string", section="send", default=DEFAULT_PRODUCER_GROUP,
        default_doc=f"`{DEFAULT_PRODUCER_GROUP}`; with `exactly-once`: `{DEFAULT_PRODUCER_GROUP}_TX_<hash>`",
        doc="RocketMQ's producer group (PGROUP). With `deliveryGuarantee=exactly-once` it is the group "
            "the broker's check-backs go to, so the default is one per checkpoint.",
    ),
    OptionSpec(
        "writeId", "string", section="send", scope="batch",
        default_doc="a new one for each `write`",
        doc="what a `df.write`'s msgIds are derived from, with the task and row (a `writeStream`'s "
            "come from its query and batch ids). Inside a `foreachBatch`, give each write of the "
            "function its own `writeId` made with the batch id (`f\"orders-{batch_id}\"`, "
            "`f\"refunds-{batch_id}\"`; two queries writing one topic: their names too): a "
            "micro-batch that Spark runs again then sends the same msgIds, which a topic's "
            "de-duplication window drops; without it, each run sends new ones. Under Spark Connect "
            "the function's writes do not see the stream's ids: a `writeId` without the batch id "
            "would send the same msgIds in every micro-batch, and a de-duplication window would "
            "drop all but the first's. Outside a stream a `writeId` names one write: running it again "
            "with the same `writeId` sends the same msgIds (a de-duplication window drops rows already "
            "sent) as long as each row lands in the same partition at the same place (a msgId is "
            "the partition and the row's index in it: read the input in a fixed order, without a "
            "`repartition`), so give new data a new one (`orders-2026-11-27`).",
    ),
    OptionSpec(
        "retryTimesWhenSendFailed", "integer", section="retries", default=2, minimum=0, maximum=16,
        doc="`sendMode=sync`: retries of a failed send.",
    ),
    OptionSpec(
        "retryTimesWhenSendAsyncFailed", "integer", section="retries", default=0, minimum=0, maximum=16,
        doc="`sendMode=async`: retries of a failed send.",
    ),
    OptionSpec(
        "sendMsgTimeoutMs", "integer", section="limits", default=3000, minimum=1,
        doc="timeout of one send request (a batch of up to `maxBatchBytes`).",
    ),
    OptionSpec(
        "maxInFlight", "integer", section="limits", default=DEFAULT_MAX_IN_FLIGHT, minimum=1, maximum=4096,
        doc="`async` and `oneway`: unanswered batches (of up to `maxBatchBytes`) per task.",
    ),
    OptionSpec(
        "maxBatchBytes", "integer", section="limits", default=DEFAULT_MAX_MESSAGE_SIZE,
        minimum=1024, maximum=MAX_MESSAGE_SIZE_LIMIT,
        default_doc=f"{DEFAULT_MAX_MESSAGE_SIZE} (4 MiB), or `maxMessageSize` when that is smaller",
        doc="rows go out as batches of up to this many bytes (at most `maxMessageSize`: the broker "
            "refuses a larger request whole).",
    ),
    OptionSpec(
        "maxMessageSize", "integer", section="limits", default=DEFAULT_MAX_MESSAGE_SIZE,
        minimum=1024, maximum=MAX_MESSAGE_SIZE_LIMIT,
        default_doc=f"{DEFAULT_MAX_MESSAGE_SIZE} (4 MiB)",
        doc="the largest body a row may send, as RocketMQ's producer `maxMessageSize`: a larger one "
            "fails its task naming the row. Raise the broker's with it (`pymq-broker "
            "--max-message-size`, RocketMQ's `maxMessageSize`).",
    ),
    OptionSpec(
        "consumerGroup", "string", section="send back",
        doc="`reconsumeLater` (required there): the group whose `%RETRY%` topic the rows go back to.",
    ),
    OptionSpec(
        "maxReconsumeTimes", "integer", section="send back", minimum=1, maximum=JAVA_INT_MAX,
        default_doc="the group's `retryMaxTimes` (16) on a pymq broker; 16 on Apache RocketMQ",
        doc="`reconsumeLater`: retries before a message goes to `%DLQ%<consumerGroup>`.",
    ),
    OptionSpec(
        "delayLevel", "integer", section="send back", default=0, minimum=-1, maximum=JAVA_INT_MAX,
        doc="`reconsumeLater`: the delay level of the retry; 0 = RocketMQ's 3 + retries, -1 = straight "
            "to the DLQ, a level past the broker's last is its last (as RocketMQ's). A row's "
            "`delay_level` column overrides it (within the same bounds).",
    ),
    OptionSpec(
        "stage", "string", section="send back", backend="pymq",
        default_doc="`spark-stream-sink` (`writeStream`), `spark-sink` (`write`)",
        doc="`reconsumeLater`: the name each message sent back keeps in its `CONSUME_FAILURE_STAGE` "
            "property, next to the error, the query id and the batch id, so a dead letter says which "
            "step failed it (the listener helper writes `listener`). RocketMQ's send back keeps no "
            "properties.",
    ),
)


# -- the broker tables -------------------------------------------------------------------------

_VIEW = (
    *_WHERE,
    OptionSpec(
        "view", "choice", section="what", required="required",
        choices=("topics", "queues", "groups", "lag", "deadLetters"),
        doc="the table: `topics` (one row per topic: `messages` in all its queues, `min_offset` / "
            "`max_offset` the lowest / highest of its queues'), `queues` (per queue), `groups` (per "
            "consumer group, with its retry settings), `lag` (per queue of the topics a group consumes; "
            "consumer offset 0 where it never committed, as RocketMQ's consumerProgress shows), "
            "`deadLetters` (per dead letter of `consumerGroup`).",
    ),
    OptionSpec(
        "consumerGroup", "string", section="what",
        doc="`lag`: the group (without it, every group), a group no broker knows fails naming it; "
            "`deadLetters` (required there): whose `%DLQ%` topic.",
    ),
    OptionSpec(
        "topic", "string", section="what",
        doc="`topics`, `queues` and `lag`: this topic only.",
    ),
    OptionSpec(
        "includeSystem", "boolean", section="what", default=False,
        doc="`topics` and `queues`: show `%RETRY%`, `%DLQ%` and system topics too.",
    ),
    OptionSpec(
        "maxMessages", "integer", section="limits", default=10000, minimum=1,
        doc="`deadLetters`: at most this many rows.",
    ),
)

SOURCE_OPTIONS = OptionRegistry(
    "source", _SOURCE, prefix="pymq option", known_label="Known options",
    stream_api="readStream", batch_api="read",
    stream_words=("a stream", "streams (spark.readStream)"),
    batch_words=("a batch read", "batch reads (spark.read)"),
)
SINK_OPTIONS = OptionRegistry(
    "sink", _SINK, prefix="pymq sink option", known_label="Known sink options",
    stream_api="writeStream", batch_api="write",
    stream_words=("a streaming write", "streaming writes (df.writeStream)"),
    batch_words=("a batch write", "batch writes (df.write)"),
)
VIEW_OPTIONS = OptionRegistry(
    "view", _VIEW, prefix="pymq option", known_label="View options",
    stream_api="readStream", batch_api="read",
    stream_words=("a stream", "streams (spark.readStream)"),
    batch_words=("a view read", "view reads (spark.read)"),
    scoped=False,
    unknown="does not apply to a view read",
)
REGISTRIES: tuple[OptionRegistry, ...] = (SOURCE_OPTIONS, SINK_OPTIONS, VIEW_OPTIONS)

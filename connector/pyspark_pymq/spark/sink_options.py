"""Options of the pymq sink: parsed and validated once, into :class:`SinkOptions`.

A write is either ``action=send`` (default: produce the rows as messages) or
``action=reconsumeLater`` (send rows read from a pymq source back to their
group's %RETRY% topic). Options and the input columns are checked before the
first row is written; errors name the option or column, the value, and what
to use instead.

Which options exist, their types, bounds and defaults come from
:data:`~pyspark_pymq.spark.option_registry.SINK_OPTIONS`, which the docs are
rendered from too.
"""

from __future__ import annotations

import hashlib
import os
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..backend.base import BackendConfig, parse_backend_options
from .option_registry import (
    ACTIONS,
    DEFAULT_MAX_IN_FLIGHT,
    DEFAULT_PRODUCER_GROUP,
    DELIVERY_GUARANTEES,
    SINK_OPTIONS,
)
from .options import OptionValues, _parse_group, _parse_topics

if TYPE_CHECKING:
    from pyspark.sql.types import DataType, StructType

__all__ = [
    "ACTIONS",
    "DEFAULT_MAX_IN_FLIGHT",
    "DEFAULT_PRODUCER_GROUP",
    "DELIVERY_GUARANTEES",
    "SINK_OPTION_NAMES",
    "SinkOptions",
    "parse_sink_options",
]

SINK_OPTION_NAMES: tuple[str, ...] = SINK_OPTIONS.names
_PREFIX = SINK_OPTIONS.prefix
# Spark's own options, passed along to every sink: not ours to check.
_SPARK_OPTIONS = frozenset({"checkpointlocation", "path", "queryname", "outputmode"})


@dataclass(frozen=True)
class SinkOptions:
    """The validated options of one write (see :class:`PymqDataSource` for the manual)."""

    backend: BackendConfig
    topic: str | None
    action: str
    send_mode: str
    producer_group: str
    retry_times_when_send_failed: int
    retry_times_when_send_async_failed: int
    send_msg_timeout_ms: int
    max_in_flight: int
    max_batch_bytes: int
    max_message_size: int
    consumer_group: str | None
    max_reconsume_times: int | None
    delay_level: int
    stage: str
    columns: tuple[str, ...]
    keys_is_array: bool
    body_is_string: bool
    write_id: str  # a df.write's: its UNIQ_KEYs derive from it (option writeId, else a new uuid)
    exactly_once: bool = False
    checkpoint_location: str | None = None  # a local path: exactly-once keeps its commit markers there
    stream: bool = False  # writeStream (else a df.write, maybe one of several in a foreachBatch)

    @property
    def endpoint(self) -> str:
        """The broker's endpoint or RocketMQ's name servers (for messages)."""
        return self.backend.address



# column -> (accepted Spark type names, what to say)
_SEND_COLUMNS: dict[str, tuple[tuple[str, ...], str]] = {
    "body": (("binary", "string"), "binary or string"),
    "topic": (("string",), "string"),
    "tags": (("string",), "string"),
    "keys": (("string", "array<string>"), "string or array<string>"),
    "properties": (("map<string,string>",), "map<string,string>"),
    "delay_level": (("int", "bigint", "smallint", "tinyint"), "an integer type"),
    "sharding_key": (("string",), "string"),
    "queue_id": (("int", "bigint", "smallint", "tinyint"), "an integer type"),
    # RocketMQ 5's delivery time (Message.setDeliverTimeMs): epoch milliseconds, or a timestamp
    # (not timestamp_ntz: its instant depends on the session's time zone)
    "deliver_time_ms": (("bigint", "timestamp"), "bigint (epoch ms) or timestamp"),
}
# body and properties: a row the broker cannot send back is sent to %RETRY% as a copy made from them
_SEND_BACK_REQUIRED = ("commit_log_offset", "msg_id", "topic", "broker_name", "reconsume_times", "body",
                       "properties")
_SEND_BACK_COLUMNS: dict[str, tuple[tuple[str, ...], str]] = {
    "commit_log_offset": (("bigint",), "bigint"),
    "msg_id": (("string",), "string"),
    "topic": (("string",), "string"),
    "broker_name": (("string",), "string"),
    "reconsume_times": (("int",), "int"),
    "body": (("binary",), "binary"),
    "properties": (("map<string,string>",), "map<string,string>"),
    "retry_topic": (("string",), "string"),
    "delay_level": (("int", "bigint", "smallint", "tinyint"), "an integer type"),
    "error": (("string",), "string"),
    "error_class": (("string",), "string"),
}


def _type_name(dt: DataType) -> str:
    return str(dt.simpleString())


def _check_columns(schema: StructType, spec: dict[str, tuple[tuple[str, ...], str]], action: str) -> None:
    # Other columns are ignored, so a misspelt one (Tags, KEYS, shardingKey, delayLevel, tag) would
    # quietly lose the row's tags, keys, order or delay: names are matched exactly, and say so.
    near = {name.replace("_", ""): name for name in spec}
    if "tags" in spec:
        near["tag"] = "tags"
    for field in schema.fields:
        meant = near.get(field.name.lower().replace("_", ""))
        if meant is not None and field.name != meant and meant not in schema.fieldNames():
            raise ValueError(
                f"pymq sink column {field.name!r} is not one it sends (action={action}): did you mean "
                f"{meant!r}? Column names are matched exactly; rename it, e.g. "
                f"df.withColumnRenamed({field.name!r}, {meant!r})"
            )
    for field in schema.fields:
        want = spec.get(field.name)
        if want is not None and _type_name(field.dataType) not in want[0]:
            raise ValueError(
                f"pymq sink column {field.name!r} has type {_type_name(field.dataType)}; "
                f"action={action} expects {want[1]}. Cast it, e.g. "
                f"df.withColumn({field.name!r}, col({field.name!r}).cast(...))"
            )


def _split_spark_options(raw_options: Mapping[str, str]) -> tuple[dict[str, str], str | None]:
    """The pymq options (any case) without Spark's own, and Spark's checkpointLocation."""
    ours: dict[str, str] = {}
    checkpoint: str | None = None
    for key, value in raw_options.items():
        low = str(key).lower()
        if low in _SPARK_OPTIONS:
            if low == "checkpointlocation" and value:
                checkpoint = str(value)
            continue
        ours[key] = value
    return ours, checkpoint


def _producer_group(
    opts: OptionValues, backend: BackendConfig, *, action: str, send_mode: str, stream: bool,
    checkpoint: str | None,
) -> tuple[bool, str, str | None]:
    """deliveryGuarantee: (exactly once?, the producer group, the checkpoint as a local path)."""
    exactly_once = opts.choice("deliveryGuarantee") == "exactly-once"
    producer_group = opts.text("producerGroup")
    if not exactly_once:
        return False, producer_group, None
    if backend.namesrv_addr:
        raise ValueError(
            "pymq sink option deliveryGuarantee=exactly-once is not available with namesrvAddr yet: "
            "the exactly-once sink needs the embedded broker's batched half messages. Use "
            "deliveryGuarantee=at-least-once (each row's UNIQ_KEY is deterministic, so consumers "
            "can drop the duplicates of a replayed batch) or a pymq endpoint"
        )
    local = _check_exactly_once(action, send_mode, stream, checkpoint)
    if not opts.get("producerGroup"):  # one group per query: check-backs must reach this query
        digest = hashlib.blake2b(local.encode(), digest_size=6).hexdigest().upper()
        producer_group = f"{DEFAULT_PRODUCER_GROUP}_TX_{digest}"
    return True, producer_group, local


def _parse_topic(opts: OptionValues) -> str | None:
    value = opts.get("topic")
    if not value:
        return None
    topic = _parse_topics(value, _PREFIX)[0]
    if "," in value:
        raise opts.bad("topic", value, "a sink writes to one topic; use a topic column for several")
    return topic


# Spark's Kafka sink columns that pymq does not send -> what to do instead: left alone they would be
# dropped in silence (a Kafka user's per-key order, partition or headers quietly lost)
_KAFKA_COLUMNS: dict[str, str] = {
    "key": "to keep a key's rows in order on one queue, name it 'sharding_key' (string); to index it "
           "for look-ups by key (Admin.query_message), name it 'keys'",
    "partition": "to choose the queue, name it 'queue_id' (an integer, 0 to the topic's write queues - 1)",
    "headers": "give the headers as a 'properties' column, map<string,string>, e.g. "
               "map_from_entries(transform(headers, h -> struct(h.key, CAST(h.value AS STRING))))",
    "value": "pymq sends the 'body' column; drop one of them",
}


def _check_send_input(schema: StructType, topic: str | None) -> None:
    columns = [f.name for f in schema.fields]
    _check_columns(schema, _SEND_COLUMNS, "send")  # first: a 'BODY' is named as the misspelling it is
    for name in columns:
        if name.lower() in _KAFKA_COLUMNS and not (name.lower() == "value" and "body" not in columns):
            raise ValueError(
                f"pymq sink column {name!r} is a column of Spark's Kafka sink, which pymq does not send "
                f"(it would be dropped): {_KAFKA_COLUMNS[name.lower()]}, or drop it"
            )
    if "body" not in columns:
        raise ValueError(
            "pymq sink needs a 'body' column (binary or string); the input has "
            f"{', '.join(columns) or 'no columns'}. Rename or select one, e.g. "
            "df.selectExpr('CAST(value AS BINARY) AS body')"
        )
    if topic is None and "topic" not in columns:
        raise ValueError(
            "pymq sink needs a topic: set .option('topic', 'orders') or give a 'topic' column"
        )


_SEND_BACK_OPTIONS = tuple(spec.name for spec in SINK_OPTIONS if spec.section == "send back")


def _refuse_send_back_options(opts: OptionValues) -> None:
    """action=send: an option of the send back would be ignored, so the rows would not be what was asked."""
    for name in _SEND_BACK_OPTIONS:
        if opts.given(name):
            hint = "; to delay the rows sent, give them a delay_level column" if name == "delayLevel" else ""
            raise ValueError(
                f"{_PREFIX} {name} applies to action=reconsumeLater (rows sent back to "
                f"%RETRY%<consumerGroup>), not to action=send: remove it{hint}"
            )


def _check_send_back_input(schema: StructType, group: str | None) -> None:
    if group is None:
        raise ValueError(
            "pymq sink option consumerGroup is required with action=reconsumeLater: the rows "
            "go back to %RETRY%<consumerGroup>"
        )
    columns = [f.name for f in schema.fields]
    missing = [c for c in _SEND_BACK_REQUIRED if c not in columns]
    if missing:
        raise ValueError(
            f"pymq sink action=reconsumeLater needs the pymq source's columns {missing}; "
            "pass rows read with format('pymq') and keep these columns (also in a .schema(...) of the "
            "source: a row the broker cannot send back goes to %RETRY% as a copy of its body and "
            "properties)"
        )
    _check_columns(schema, _SEND_BACK_COLUMNS, "reconsumeLater")


def parse_sink_options(raw_options: Mapping[str, str], schema: StructType, *, stream: bool) -> SinkOptions:
    """Validate the options and the input columns of a write."""
    raw, checkpoint = _split_spark_options(raw_options)
    opts = OptionValues(SINK_OPTIONS, raw, stream)
    backend = parse_backend_options(opts.get, _PREFIX)
    action = opts.choice("action")
    send_mode = opts.choice("sendMode")
    exactly_once, producer_group, checkpoint = _producer_group(
        opts, backend, action=action, send_mode=send_mode, stream=stream, checkpoint=checkpoint
    )
    topic = _parse_topic(opts)
    group = _parse_group(opts.get("consumerGroup"), _PREFIX)
    if action == "send":
        _refuse_send_back_options(opts)
        _check_send_input(schema, topic)
        delayed = [c for c in ("delay_level", "deliver_time_ms") if c in schema.fieldNames()]
        if exactly_once and delayed:
            raise ValueError(
                f"{_PREFIX} deliveryGuarantee=exactly-once cannot send the column {delayed[0]!r}: "
                "a half message cannot be delayed (RocketMQ delays no transactional message). Drop the "
                "column, or use deliveryGuarantee=at-least-once"
            )
    else:
        _check_send_back_input(schema, group)
    types = {f.name: _type_name(f.dataType) for f in schema.fields}
    max_message_size, max_batch_bytes = _message_sizes(opts)
    return SinkOptions(
        backend=backend,
        topic=topic,
        action=action,
        send_mode=send_mode,
        producer_group=producer_group,
        retry_times_when_send_failed=opts.integer_or_default("retryTimesWhenSendFailed"),
        retry_times_when_send_async_failed=opts.integer_or_default("retryTimesWhenSendAsyncFailed"),
        send_msg_timeout_ms=opts.integer_or_default("sendMsgTimeoutMs"),
        max_in_flight=opts.integer_or_default("maxInFlight"),
        max_batch_bytes=max_batch_bytes,
        max_message_size=max_message_size,
        consumer_group=group,
        max_reconsume_times=opts.integer("maxReconsumeTimes"),
        delay_level=opts.integer_or_default("delayLevel"),
        stage=opts.text("stage", "spark-stream-sink" if stream else "spark-sink"),
        columns=tuple(f.name for f in schema.fields),
        keys_is_array=types.get("keys") == "array<string>",
        body_is_string=types.get("body") == "string",
        write_id=opts.text("writeId") or uuid.uuid4().hex,
        exactly_once=exactly_once,
        checkpoint_location=checkpoint,
        stream=stream,
    )


def _message_sizes(opts: OptionValues) -> tuple[int, int]:
    """maxMessageSize, and maxBatchBytes within it (by default 4 MiB, or maxMessageSize if smaller)."""
    largest = opts.integer_or_default("maxMessageSize")
    batch = opts.integer("maxBatchBytes")
    if batch is None:
        return largest, min(largest, opts.integer_or_default("maxBatchBytes"))
    if batch > largest:
        raise opts.bad("maxBatchBytes", batch, f"at most maxMessageSize ({largest}): the broker refuses "
                       "a larger request whole. Lower maxBatchBytes, or raise maxMessageSize (and the "
                       "broker's)")
    return largest, batch


def _check_exactly_once(action: str, send_mode: str, stream: bool, checkpoint: str | None) -> str:
    """deliveryGuarantee=exactly-once: where it applies; returns the checkpoint as a local path."""
    what = "pymq sink option deliveryGuarantee=exactly-once"
    if not stream:
        raise ValueError(f"{what} is for df.writeStream (a micro-batch is committed once); "
                         "df.write sends each row once per job run: remove the option")
    if action != "send":
        raise ValueError(f"{what} applies to action=send; action={action} sends rows back at least once")
    if send_mode == "oneway":
        raise ValueError(f"{what} needs acknowledged sends: use sendMode sync or async, not oneway")
    if not checkpoint:
        raise ValueError(f"{what} needs .option('checkpointLocation', '/path'): "
                         "the sink keeps its commit markers next to Spark's checkpoint")
    path = checkpoint[len("file:"):] if checkpoint.startswith("file:") else checkpoint
    if "://" in path or (":" in path.split("/")[0] and not os.path.isabs(path)):
        raise ValueError(
            f"{what} keeps its commit markers under checkpointLocation, which must be a local or "
            f"mounted path on the driver; got {checkpoint!r}. Use a path such as /dbfs/... or /mnt/..."
        )
    if path.startswith("//"):
        path = "/" + path.lstrip("/")
    return os.path.abspath(path)

"""Options of the pymq sink: parsed and validated once, into :class:`SinkOptions`.

A write is either ``action=send`` (default: produce the rows as messages) or
``action=reconsumeLater`` (send rows read from a pymq source back to their
group's %RETRY% topic). Options and the input columns are checked before the
first row is written; errors name the option or column, the value, and what
to use instead.
"""

from __future__ import annotations

import hashlib
import os
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..backend.base import BackendConfig, parse_backend_options
from ..client.producer import DEFAULT_MAX_MESSAGE_SIZE, SEND_MODES
from .options import _parse_group, _parse_topics, parse_int_option, unknown_option

if TYPE_CHECKING:
    from pyspark.sql.types import DataType, StructType

__all__ = ["ACTIONS", "DELIVERY_GUARANTEES", "SINK_OPTION_NAMES", "SinkOptions", "parse_sink_options"]

ACTIONS = ("send", "reconsumeLater")
DELIVERY_GUARANTEES = ("at-least-once", "exactly-once")
DEFAULT_PRODUCER_GROUP = "PYMQ_SPARK_SINK"
# Each request of the sink is a batch of up to maxBatchBytes (4 MiB), not one message: a
# few in flight keep the broker busy, while 64 (the client's default) held ~200 MB per task
# and were ~30% slower (BENCHMARKS.md), with the last requests near sendMsgTimeoutMs.
DEFAULT_MAX_IN_FLIGHT = 4

_SINK_OPTIONS = (
    "endpoint", "namesrvAddr", "accessKey", "secretKey", "topic", "action", "sendMode", "producerGroup",
    "retryTimesWhenSendFailed", "retryTimesWhenSendAsyncFailed", "sendMsgTimeoutMs", "maxInFlight",
    "maxBatchBytes",
    "consumerGroup", "maxReconsumeTimes", "delayLevel", "stage", "deliveryGuarantee",
)
SINK_OPTION_NAMES: tuple[str, ...] = _SINK_OPTIONS
_CANONICAL = {n.lower(): n for n in _SINK_OPTIONS}
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
    consumer_group: str | None
    max_reconsume_times: int | None
    delay_level: int
    stage: str
    columns: tuple[str, ...]
    keys_is_array: bool
    body_is_string: bool
    write_id: str  # distinguishes batch (non-streaming) writes in UNIQ_KEYs
    exactly_once: bool = False
    checkpoint_location: str | None = None  # a local path: exactly-once keeps its commit markers there

    @property
    def endpoint(self) -> str:
        """The broker's endpoint or RocketMQ's name servers (for messages)."""
        return self.backend.address



def _bad(name: str, value: object, allowed: str) -> ValueError:
    return ValueError(f"pymq sink option {name}={value!r} is not valid: {allowed}")


def _int(raw: Mapping[str, str], name: str, default: int, minimum: int, maximum: int | None = None) -> int:
    number = parse_int_option(name, raw.get(name), minimum=minimum, maximum=maximum)
    return default if number is None else number


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
}
_SEND_BACK_REQUIRED = ("commit_log_offset", "msg_id", "topic", "broker_name", "reconsume_times")
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
    for field in schema.fields:
        want = spec.get(field.name)
        if want is not None and _type_name(field.dataType) not in want[0]:
            raise ValueError(
                f"pymq sink column {field.name!r} has type {_type_name(field.dataType)}; "
                f"action={action} expects {want[1]}. Cast it, e.g. "
                f"df.withColumn({field.name!r}, col({field.name!r}).cast(...))"
            )


def parse_sink_options(raw_options: Mapping[str, str], schema: StructType, *, stream: bool) -> SinkOptions:
    """Validate the options and the input columns of a write."""
    raw: dict[str, str] = {}
    checkpoint: str | None = None
    for key, value in raw_options.items():
        if str(key).lower() in _SPARK_OPTIONS:
            if str(key).lower() == "checkpointlocation" and value:
                checkpoint = str(value)
            continue
        name = _CANONICAL.get(str(key).lower())
        if name is None:
            raise unknown_option(key, SINK_OPTION_NAMES, prefix="pymq sink option",
                                 known_label="Known sink options")
        raw[name] = "" if value is None else str(value).strip()
    backend = parse_backend_options(raw.get, "pymq sink option")
    action = raw.get("action") or "send"
    matched = [a for a in ACTIONS if a.lower() == action.lower()]
    if not matched:
        raise _bad("action", action, f"use one of {', '.join(ACTIONS)}")
    action = matched[0]
    send_mode = (raw.get("sendMode") or "sync").lower()
    if send_mode not in SEND_MODES:
        raise _bad("sendMode", raw.get("sendMode"), f"use one of {', '.join(SEND_MODES)}")
    guarantee = (raw.get("deliveryGuarantee") or "at-least-once").lower()
    if guarantee not in DELIVERY_GUARANTEES:
        raise _bad("deliveryGuarantee", raw.get("deliveryGuarantee"),
                   f"use one of {', '.join(DELIVERY_GUARANTEES)}")
    exactly_once = guarantee == "exactly-once"
    producer_group = raw.get("producerGroup") or DEFAULT_PRODUCER_GROUP
    if exactly_once:
        if backend.namesrv_addr:
            raise ValueError(
                "pymq sink option deliveryGuarantee=exactly-once is not available with namesrvAddr yet: "
                "the exactly-once sink needs the embedded broker's batched half messages. Use "
                "deliveryGuarantee=at-least-once (each row's UNIQ_KEY is deterministic, so consumers "
                "can drop the duplicates of a replayed batch) or a pymq endpoint"
            )
        checkpoint = _check_exactly_once(action, send_mode, stream, checkpoint)
        if not raw.get("producerGroup"):  # one group per query: check-backs must reach this query
            digest = hashlib.blake2b(checkpoint.encode(), digest_size=6).hexdigest().upper()
            producer_group = f"{DEFAULT_PRODUCER_GROUP}_TX_{digest}"
    columns = tuple(f.name for f in schema.fields)
    topic = _parse_topics(raw["topic"])[0] if raw.get("topic") else None
    if raw.get("topic") and "," in raw["topic"]:
        raise _bad("topic", raw["topic"], "a sink writes to one topic; use a topic column for several")
    group = _parse_group(raw.get("consumerGroup"))
    types = {f.name: _type_name(f.dataType) for f in schema.fields}
    if action == "send":
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
        _check_columns(schema, _SEND_COLUMNS, action)
    else:
        if group is None:
            raise ValueError(
                "pymq sink option consumerGroup is required with action=reconsumeLater: the rows "
                "go back to %RETRY%<consumerGroup>"
            )
        missing = [c for c in _SEND_BACK_REQUIRED if c not in columns]
        if missing:
            raise ValueError(
                f"pymq sink action=reconsumeLater needs the pymq source's columns {missing}; "
                "pass rows read with format('pymq') (keep commit_log_offset, msg_id, topic, "
                "broker_name, reconsume_times)"
            )
        _check_columns(schema, _SEND_BACK_COLUMNS, action)
    max_reconsume = raw.get("maxReconsumeTimes")
    return SinkOptions(
        backend=backend,
        topic=topic,
        action=action,
        send_mode=send_mode,
        producer_group=producer_group,
        retry_times_when_send_failed=_int(raw, "retryTimesWhenSendFailed", 2, 0, 16),
        retry_times_when_send_async_failed=_int(raw, "retryTimesWhenSendAsyncFailed", 0, 0, 16),
        send_msg_timeout_ms=_int(raw, "sendMsgTimeoutMs", 3000, 1),
        max_in_flight=_int(raw, "maxInFlight", DEFAULT_MAX_IN_FLIGHT, 1, 4096),
        max_batch_bytes=_int(raw, "maxBatchBytes", DEFAULT_MAX_MESSAGE_SIZE, 1024, DEFAULT_MAX_MESSAGE_SIZE),
        consumer_group=group,
        max_reconsume_times=None if not max_reconsume else _int(raw, "maxReconsumeTimes", 16, 1),
        delay_level=_int(raw, "delayLevel", 0, -1),
        stage=raw.get("stage") or ("spark-stream-sink" if stream else "spark-sink"),
        columns=columns,
        keys_is_array=types.get("keys") == "array<string>",
        body_is_string=types.get("body") == "string",
        write_id=uuid.uuid4().hex,
        exactly_once=exactly_once,
        checkpoint_location=checkpoint if exactly_once else None,
    )


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

"""Broker tables as Spark DataFrames: ``spark.read.format("pymq").option("view", ...)``.

The same tables as :class:`pyspark_pymq.Admin`, for SQL and notebooks:

===============  ==========================================================================
view             rows
===============  ==========================================================================
``topics``       one per topic: queues, permissions, messages, min/max offset, last store time
``queues``       one per queue of ``topic`` (or of every topic): offsets, messages
``groups``       one per consumer group: its retry settings, orderly, paused
``lag``          one per queue of each topic a group has progress on: broker offset,
                 consumer offset (0 where it never committed, as RocketMQ shows), lag
                 (``consumerGroup``; without it, every group)
``deadLetters``  one per dead letter of ``consumerGroup``: origin, reason, retries, body
                 (``origin_msg_id``: the original's offsetMsgId, RocketMQ's ORIGIN_MESSAGE_ID)
===============  ==========================================================================

Options: :data:`~pyspark_pymq.spark.option_registry.VIEW_OPTIONS` (the README's view options
table is rendered from it). Example::

    spark.read.format("pymq").option("endpoint", ep).option("view", "lag") \\
        .option("consumerGroup", "billing").load().show()
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from pyspark.sql.datasource import DataSourceReader, InputPartition
from pyspark.sql.types import StructType

from ..backend.base import BackendConfig, parse_backend_options
from .option_registry import VIEW_OPTIONS
from .options import OptionValues, _parse_group
from .spark_errors import spark_call, spark_iterator

__all__ = ["VIEWS", "ViewOptions", "ViewReader", "parse_view_options", "view_requested"]

VIEWS: dict[str, str] = {
    "topics": "topic string, read_queues int, write_queues int, perm int, messages bigint, "
              "min_offset bigint, max_offset bigint, last_store_timestamp timestamp",
    "queues": "topic string, broker_name string, queue_id int, min_offset bigint, max_offset bigint, "
              "messages bigint, last_store_timestamp timestamp",
    "groups": "group string, retry_max_times int, retry_queue_nums int, consume_from_where string, "
              "consume_message_orderly boolean, consume_enable boolean",
    "lag": "group string, topic string, broker_name string, queue_id int, broker_offset bigint, "
           "consumer_offset bigint, lag bigint",
    "deadLetters": "msg_id string, origin_topic string, origin_msg_id string, reconsume_times int, "
                   "reason string, tags string, keys array<string>, store_timestamp timestamp, "
                   "queue_offset bigint, body binary",
}



@dataclass(frozen=True)
class ViewOptions:
    backend: BackendConfig
    view: str
    group: str | None
    topic: str | None
    include_system: bool
    max_messages: int


def view_requested(options: Mapping[str, str]) -> bool:
    return any(str(k).lower() == "view" for k in options)


def parse_view_options(raw: Mapping[str, str]) -> ViewOptions:
    """Validate a view read's options against VIEW_OPTIONS (errors name the option, the value
    and what to use)."""
    opts = OptionValues(VIEW_OPTIONS, raw, stream=None)
    backend = parse_backend_options(opts.get, VIEW_OPTIONS.prefix)
    if not opts.text("view"):
        raise opts.bad("view", opts.get("view"), f"use one of {', '.join(VIEWS)}")
    view = opts.choice("view")
    group = _parse_group(opts.get("consumerGroup"))
    if view == "deadLetters" and group is None:
        raise ValueError("pymq view deadLetters needs consumerGroup: whose %DLQ% topic to read")
    return ViewOptions(backend, view, group, opts.get("topic") or None, opts.boolean("includeSystem"),
                       opts.integer_or_default("maxMessages"))


def check_view_schema(view: str, schema: StructType) -> None:
    """ValueError naming ``view``'s columns when a user's ``.schema(...)`` is not the view's own.

    A view returns all of its columns; without this, Spark's own check says only how many.
    """
    ddl = VIEWS[view]
    want = [tuple(column.split()) for column in ddl.split(", ")]
    got = [(field.name, field.dataType.simpleString()) for field in schema.fields]
    if got != want:
        given = ", ".join(" ".join(column) for column in got)
        raise ValueError(
            f"pymq view {view!r} has the columns {ddl}; .schema(...) gave {given or 'none'}: leave "
            "out .schema(...) for a view and select or cast the columns after load()"
        )


def _ts(time: Any) -> datetime | None:
    """Admin's time (a pandas Timestamp; NaT: none) as Spark takes it."""
    if not isinstance(time, datetime) or time != time:
        return None
    return datetime.fromtimestamp(time.timestamp(), tz=time.tzinfo)  # pandas' as Python's


def _rows(opts: ViewOptions) -> list[dict[str, Any]]:
    from ..client.admin import Admin  # on an executor only: the stream's driver never needs it

    cfg = opts.backend
    admin = (Admin(namesrv_addr=cfg.namesrv_addr, access_key=cfg.access_key, secret_key=cfg.secret_key,
                   tls=cfg.tls)
             if cfg.namesrv_addr
             else Admin(cfg.endpoint, access_key=cfg.access_key, secret_key=cfg.secret_key, tls=cfg.tls))
    if opts.view == "topics":
        # a topic asked for by name is shown, system topic (%DLQ%g) or not, as the queues view does;
        # only its own brokers are asked (a hung broker elsewhere does not fail its row)
        return list(admin.topics(include_system=opts.include_system, topic=opts.topic).to_dict("records"))
    if opts.view == "queues":
        names = [opts.topic] if opts.topic else admin.topic_names(include_system=opts.include_system)
        return [r for name in names for r in admin.topic_stats(name).to_dict("records")]
    if opts.view == "groups":
        return list(admin.groups().to_dict("records"))
    if opts.view == "lag":
        if opts.group:
            return list(admin.group_progress(opts.group, opts.topic).to_dict("records"))
        # every group, on the topics each has progress on (committed_only: a group that never read
        # the topic is left out, not shown at full lag); of a topic, only its brokers are asked
        # (they know its groups and hold their offsets): a hung broker elsewhere does not stop it
        return [r for g in admin.groups(topic=opts.topic)["group"]
                for r in admin.group_progress(g, opts.topic, committed_only=True).to_dict("records")]
    assert opts.group is not None
    # keys as the source's column has them (array<string>), not Admin's one string (RocketMQ's KEYS,
    # space-separated: a key never holds a space)
    return [{**r, "keys": r["keys"].split()} for r in admin.dead_letters(opts.group, opts.max_messages)
            .to_dict("records")]


class ViewReader(DataSourceReader):
    """One partition: the table is small and comes from one broker call or a few."""

    def __init__(self, options: ViewOptions) -> None:
        self.options = options

    @spark_call
    def partitions(self) -> list[InputPartition]:
        return [InputPartition(0)]

    @spark_iterator
    def read(self, partition: InputPartition) -> Iterator[tuple[Any, ...]]:
        columns = [c.strip().split(" ")[0] for c in VIEWS[self.options.view].split(",")]
        for row in _rows(self.options):
            yield tuple(
                _ts(row.get(c)) if c.endswith("timestamp") else _plain(row.get(c)) for c in columns
            )


def _plain(value: Any) -> Any:
    """numpy scalars (from pandas) as Python values, for Spark."""
    return value.item() if hasattr(value, "item") else value

"""Column selections (``.schema(...)`` of some source columns) the decoder tests try."""

from __future__ import annotations

from pyspark_pymq.spark.schema import COLUMNS

ALL = tuple(name for name, _, _ in COLUMNS)

SUBSETS: tuple[tuple[str, ...], ...] = (
    ("body",),
    ("queue_offset", "body"),
    ("msg_id",),
    ("offset_msg_id", "tags"),
    ("topic", "retry_topic"),
    ("keys", "properties", "reconsume_times"),
    ("store_timestamp", "broker_name", "queue_id", "commit_log_offset", "born_timestamp"),
    tuple(reversed(ALL)),
)

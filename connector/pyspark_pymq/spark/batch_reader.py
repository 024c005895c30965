"""The batch reader: ``spark.read.format("pymq")``, for notebooks and backfills.

Reads each queue from ``startingOffsets`` (default ``earliest``) to
``endingOffsets`` (default ``latest``, resolved once when the read is
planned), or the last N messages per queue (``lastMessagesPerQueue``), or a
time window (``startingTimestamp`` / ``endingTimestamp``, or a time per queue:
``startingOffsetsByTimestamp`` / ``endingOffsetsByTimestamp``). Any topic can be read
this way, ``%RETRY%<group>`` and ``%DLQ%<group>`` included. Nothing is
committed to the broker.

``partitions()`` runs in Spark's planner process and talks to the broker; the
reader is then pickled into every task, carrying only its options.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSourceReader, InputPartition

from .offset_range import plan_ranges, split_ranges
from .offset_reader import OffsetReader
from .options import SourceOptions, StartKind
from .read_loop import make_partitions, read_partition
from .spark_errors import spark_call, spark_iterator

__all__ = ["PymqBatchReader"]


class PymqBatchReader(DataSourceReader):
    """A partition per queue range with data (large ranges may be split, small ones share one)."""

    def __init__(self, options: SourceOptions) -> None:
        self.options = options

    def __getstate__(self) -> dict[str, Any]:
        return {"options": self.options}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.options = state["options"]

    @spark_call
    def partitions(self) -> list[InputPartition]:
        opts = self.options
        reader = OffsetReader(opts)
        bounds, _ = reader.bounds(require_topics=True)
        ending = reader.ending_offsets(bounds)
        starting = reader.starting_offsets(
            bounds, ending if opts.starting.kind is StartKind.LAST_N else None
        )
        # A start past the end (e.g. startingTimestamp after endingTimestamp) reads nothing.
        starting = {mq: min(offset, ending[mq]) for mq, offset in starting.items()}
        ranges = plan_ranges(starting, ending, fail_on_data_loss=opts.fail_on_data_loss)
        ranges = split_ranges(
            ranges,
            min_partitions=opts.min_partitions,
            max_per_partition=opts.max_messages_per_partition,
        )
        return list(make_partitions(ranges, opts))

    @spark_iterator
    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return read_partition(self.options, partition)

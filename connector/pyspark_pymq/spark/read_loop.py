"""The executor read loop: pull the offset ranges of a partition, yield Arrow batches.

Both readers (``readStream`` and ``read``) run their tasks through
:func:`read_partition`. It pulls up to ``pullBatchSize`` messages or
``pullMaxBytes`` bytes at a time as raw records (no per-message objects) and
decodes them straight into ``pyarrow.RecordBatch`` es of about 8192 rows
(:meth:`Backend.decode_arrow <pyspark_pymq.backend.base.Backend.decode_arrow>`).
The next pull is requested before the current answer is decoded, so the
broker's work and the decoding overlap.

Backends (and their connections and routes) are cached per worker process:
Spark reuses Python workers across tasks, so only a worker's first task pays
for connecting. The cache key includes the pid, so a forked worker never
reuses its parent's connections. Pull statuses, record layouts and the
decoding into Arrow belong to the backend (:mod:`pyspark_pymq.backend`).

Gaps found while pulling (messages expired by retention, a queue emptied by a
deleted topic) go through :func:`.data_loss.report_data_loss`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import pyarrow as pa
from pymq_proto.topics import is_retry_topic
from pyspark.sql.datasource import InputPartition

from ..backend.base import PullBatch, cached_backend
from ..client.message import MessageQueue, PullStatus
from ..errors import NoPermissionError, PymqError, TopicNotExistError
from .data_loss import report_data_loss
from .offset_range import PACK_MESSAGES, OffsetRange, pack_ranges
from .options import SourceOptions
from .schema import project

__all__ = ["PymqInputPartition", "make_partitions", "read_partition"]

# Pulls answer ~1 MiB each (the fastest size over gRPC); their records are decoded
# and handed to Spark in batches of about this many rows or bytes, which keeps the
# per-batch costs (Python calls, Arrow IPC messages, JVM batches) small.
_BATCH_ROWS = 8192
_BATCH_BYTES = 8 << 20
_PULL_RETRY_S = 1.0  # between the tries of a pull whose broker is unreachable

logger = logging.getLogger("pyspark_pymq.spark")


@dataclass(frozen=True)
class _Range:
    topic: str
    broker_name: str
    queue_id: int
    start: int
    end: int
    subscription: str
    expression_type: str = "TAG"


class PymqInputPartition(InputPartition):
    """One Spark task: queue offsets ``[start, end)`` of one MessageQueue, or of several small ones
    read one after the other (:func:`.offset_range.pack_ranges`).

    Carries everything the task needs (Spark builds the reader that runs it in
    another process, from the pickled options only).
    """

    def __init__(self, index: int, ranges: tuple[_Range, ...]) -> None:
        super().__init__(index)
        self.ranges = ranges

    def __repr__(self) -> str:
        shown = ", ".join(f"{r.topic}@{r.broker_name}#{r.queue_id} [{r.start}, {r.end}) {r.subscription!r}"
                          for r in self.ranges[:3])
        more = f" and {len(self.ranges) - 3} more" if len(self.ranges) > 3 else ""
        return f"PymqInputPartition({shown}{more})"


def make_partitions(ranges: list[OffsetRange], opts: SourceOptions) -> list[PymqInputPartition]:
    """The ranges as partitions, small ones of several queues together unless ``minPartitions``
    asks for parallelism (within ``maxMessagesPerPartition``); retry topics are read with ``*``
    as RocketMQ does."""
    retry = opts.retry_topic

    def as_read(r: OffsetRange) -> _Range:
        sub, kind = ("*", "TAG") if r.mq.topic == retry else (opts.subscription, opts.subscription_type)
        return _Range(r.mq.topic, r.mq.broker_name, r.mq.queue_id, r.start, r.end, sub, kind)

    if opts.min_partitions is not None:
        parts = [[r] for r in ranges]
    else:
        parts = pack_ranges(ranges, min(PACK_MESSAGES, opts.max_messages_per_partition or PACK_MESSAGES))
    return [PymqInputPartition(i, tuple(as_read(r) for r in part)) for i, part in enumerate(parts)]


def read_partition(opts: SourceOptions, partition: InputPartition) -> Iterator[pa.RecordBatch]:
    """All rows of ``partition``, as RecordBatches of the source schema (or of the columns kept)."""
    if not isinstance(partition, PymqInputPartition):
        return  # Spark's placeholder partition when a batch read plans none
    for r in partition.ranges:
        if r.end > r.start:
            yield from _read_range(opts, r)


def _read_range(opts: SourceOptions, r: _Range) -> Iterator[pa.RecordBatch]:
    """The rows of one queue's range."""
    backend = cached_backend(opts.backend, opts.poll_timeout_ms / 1000.0)
    group = opts.pull_group
    mq = MessageQueue(r.topic, r.broker_name, r.queue_id)
    retry = is_retry_topic(r.topic)
    filtered = r.subscription.strip() != "*"
    fail = opts.fail_on_data_loss
    columns = opts.columns

    def pull(offset: int) -> PullBatch:
        # A broker that is restarting (or a cluster broker that crashed) holds the range's
        # messages still (as does a busy one): retry a retriable error up to pollTimeoutMs
        # rather than fail the task.
        deadline = time.monotonic() + opts.poll_timeout_ms / 1000.0
        while True:
            try:
                return backend.pull(
                    group,
                    mq,
                    offset,
                    min(opts.pull_batch_size, r.end - offset),
                    subscription=r.subscription,
                    expression_type=r.expression_type,
                    max_bytes=opts.pull_max_bytes,
                )
            except PymqError as err:
                left = deadline - time.monotonic()
                if isinstance(err, NoPermissionError) and not opts.consumer_group and group in err.remark:
                    # the pulls carry pymq's reader group, which an ACL may not name: say which option
                    raise type(err)(f"{err.remark}. Set option consumerGroup to a group this user may "
                                    f"Sub on (a read without it pulls as {group})", code=err.code) from err
                if not err.retriable:
                    raise
                if left <= 0:
                    raise type(err)(
                        f"pulling {mq} at offset {offset} failed for pollTimeoutMs="
                        f"{opts.poll_timeout_ms}: {err.remark}", code=err.code,
                    ) from err
                logger.warning("pymq source: pull of %s at %d failed (%s); retrying", mq, offset, err.remark)
                time.sleep(min(_PULL_RETRY_S, left))

    chunks: list[PullBatch] = []  # pulled, not decoded yet
    chunk_rows = 0
    chunk_bytes = 0

    def flush() -> Iterator[pa.RecordBatch]:
        nonlocal chunks, chunk_rows, chunk_bytes
        if chunks:
            pulled = chunks[0] if len(chunks) == 1 else PullBatch(
                PullStatus.FOUND, chunks[-1].next_begin_offset, chunks[-1].min_offset, chunks[-1].max_offset,
                b"".join(c.records for c in chunks), chunk_rows, chunks[0].first_queue_offset,
                b"".join(c.record_sizes for c in chunks) if all(c.record_sizes for c in chunks) else b"",
            )
            chunks, chunk_rows, chunk_bytes = [], 0, 0
            batch = backend.decode_arrow(
                pulled, mq, retry=retry, end_offset=r.end, subscription=r.subscription,
                expression_type=r.expression_type, columns=columns,
            )
            if batch.num_rows:
                yield project(batch, columns)

    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="pymq-pull") as pool:
        offset = r.start
        next_pull: Future[PullBatch] | None = pool.submit(pull, offset)
        while next_pull is not None:
            try:
                resp = next_pull.result()
            except TopicNotExistError:
                report_data_loss(
                    fail,
                    f"topic {r.topic!r} was deleted while offsets [{offset}, {r.end}) of "
                    f"{mq} were still to be read",
                    f"stop reading {mq}",
                )
                break
            next_pull = None
            status = resp.status
            if status is PullStatus.FOUND:
                following = resp.next_begin_offset
                if following < r.end:
                    next_pull = pool.submit(pull, following)
                first = resp.first_queue_offset
                if not filtered and first > offset:
                    report_data_loss(
                        fail,
                        f"queue {mq}: offsets [{offset}, {first}) are no longer on the broker",
                        f"skip to offset {first}",
                    )
                chunks.append(resp)
                chunk_rows += resp.message_count
                chunk_bytes += len(resp.records)
                if chunk_rows >= _BATCH_ROWS or chunk_bytes >= _BATCH_BYTES or next_pull is None:
                    yield from flush()
                offset = max(following, offset + 1)
                continue
            yield from flush()
            if status is PullStatus.NO_MATCHED_MSG:
                if not filtered and resp.next_begin_offset > offset:
                    report_data_loss(
                        fail,
                        f"queue {mq}: offsets [{offset}, {resp.next_begin_offset}) are no "
                        "longer on the broker",
                        f"skip to offset {resp.next_begin_offset}",
                    )
                offset = max(resp.next_begin_offset, offset + 1)
            elif offset < resp.min_offset:  # expired by retention (or the queue was emptied)
                report_data_loss(
                    fail,
                    f"queue {mq}: offsets [{offset}, {min(resp.min_offset, r.end)}) are no "
                    f"longer on the broker (its min offset is now {resp.min_offset})",
                    f"skip to offset {resp.min_offset}",
                )
                offset = resp.min_offset
            else:  # NO_NEW_MSG or an offset past the end: the range's tail is gone
                report_data_loss(
                    fail,
                    f"queue {mq}: offsets [{offset}, {r.end}) were planned but the broker "
                    f"has messages only up to {resp.max_offset} (min {resp.min_offset}); "
                    "was the topic deleted?",
                    f"stop reading {mq} at offset {offset}",
                )
                break
            if offset < r.end:
                next_pull = pool.submit(pull, offset)
    yield from flush()

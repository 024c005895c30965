"""The pymq sink's executor side: rows in (as Arrow batches), messages out.

``action=send``: each row becomes a message. Rows are grouped by destination
(topic, and the queue of their ``sharding_key`` or ``queue_id``) and sent as
batches of at most ``maxBatchBytes`` (4 MiB); a row with a ``delay_level`` goes
alone (RocketMQ does not delay batches). Every row gets a deterministic
UNIQ_KEY from (query id, batch id, partition, row index), so a retried task or
a replayed micro-batch sends the same keys, and a topic with a
de-duplication window stores them once.

``action=reconsumeLater``: each row (read from a pymq source) is sent back to
``%RETRY%<consumerGroup>`` with ConsumerSendMsgBack, its error context in the
message's properties. The task ends only when every send back is acknowledged;
one that cannot be done fails the task, so Spark runs it again (at-least-once).
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pymq_proto.record import MessageConst as MC
from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)

from ..client.consumer import PullConsumer
from ..client.message import MessageExt
from ..client.producer import Producer
from ..errors import PymqError
from .rows import column, messages_from_batch, send_back_acknowledged
from .sink_options import SinkOptions

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = ["PymqSinkWriter", "PymqStreamSinkWriter", "SinkCommitMessage", "write_partition"]

log = logging.getLogger(__name__)

SEND_BACK_CHUNK = 1000


@dataclass
class SinkCommitMessage(WriterCommitMessage):
    """What one task wrote: ``rows`` sent (or sent back), ``dead_letters`` among them."""

    partition_id: int
    rows: int
    dead_letters: int = 0
    fallbacks: int = 0
    transaction: str | None = None  # exactly-once: the task's half messages are <transaction><row:016X>
    query_id: str = ""


@dataclass(frozen=True)
class _TaskIds:
    query_id: str
    batch_id: str
    partition_id: int
    attempt: int

    def key_prefix(self) -> str:
        """16 hex digits shared by every UNIQ_KEY of this task (and of its retries)."""
        seed = f"{self.query_id}:{self.batch_id}:{self.partition_id}".encode()
        return hashlib.blake2b(seed, digest_size=8).hexdigest().upper()


def _task_ids(opts: SinkOptions) -> _TaskIds:
    from pyspark import TaskContext

    ctx = TaskContext.get()
    if ctx is None:  # called directly (tests, tools)
        return _TaskIds(opts.write_id, "0", 0, 0)
    query = ctx.getLocalProperty("sql.streaming.queryId") or opts.write_id
    batch = ctx.getLocalProperty("streaming.sql.batchId") or "0"
    return _TaskIds(query, batch, ctx.partitionId(), ctx.attemptNumber())


def _encode_properties(
    user: list[tuple[str, str]] | None, tags: str | None, keys: Any, delay: int | None,
    sharding_key: str | None, uniq: str,
) -> bytes:
    parts = [f"{k}\x01{v}\x02" for k, v in user if k is not None and v is not None] if user else []
    if tags:
        parts.append(f"{MC.PROPERTY_TAGS}\x01{tags}\x02")
    if keys:
        text = keys if isinstance(keys, str) else MC.KEY_SEPARATOR.join(k for k in keys if k)
        if text:
            parts.append(f"{MC.PROPERTY_KEYS}\x01{text}\x02")
    if delay:
        parts.append(f"{MC.PROPERTY_DELAY_TIME_LEVEL}\x01{delay}\x02")
    if sharding_key is not None:
        parts.append(f"{MC.PROPERTY_SHARDING_KEY}\x01{sharding_key}\x02")
    parts.append(f"{MC.PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX}\x01{uniq}\x02")
    text = "".join(parts)
    if text.count("\x01") != len(parts):
        raise ValueError("a property name or value contains the reserved characters \\x01 or \\x02")
    return text.encode()


class _Pending:
    """Rows bound for one destination, sent as one batch when full."""

    __slots__ = ("bodies", "first_row", "keys", "props", "size")

    def __init__(self, first_row: int) -> None:
        self.first_row = first_row
        self.bodies: list[bytes] = []
        self.props: list[bytes] = []
        self.keys: list[str] = []
        self.size = 0


def _send_rows(
    opts: SinkOptions, batches: Iterator[pa.RecordBatch], ids: _TaskIds, *,
    new_producer: Callable[..., Producer] = Producer, prefix: str | None = None,
    extra_properties: bytes = b"",
) -> SinkCommitMessage:
    """Send every row; ``prefix`` + row index is its UNIQ_KEY, ``extra_properties`` go on each."""
    producer = new_producer(
        opts.endpoint,
        send_mode=opts.send_mode,
        producer_group=opts.producer_group,
        retry_times_when_send_failed=opts.retry_times_when_send_failed,
        retry_times_when_send_async_failed=opts.retry_times_when_send_async_failed,
        send_msg_timeout_ms=opts.send_msg_timeout_ms,
        max_message_size=opts.max_batch_bytes,
        max_in_flight=opts.max_in_flight,
    )
    prefix = prefix or ids.key_prefix()
    pending: dict[tuple[str, int | None], _Pending] = {}
    futures: list[tuple[int, int, Future[Any]]] = []
    where = f"partition {ids.partition_id} of batch {ids.batch_id}"
    row = 0

    def flush(dest: tuple[str, int | None], p: _Pending) -> None:
        try:
            results = producer.send_encoded(dest[0], p.bodies, p.props, p.keys, queue_id=dest[1])
        except PymqError as err:
            raise type(err)(
                f"sending rows {p.first_row}..{p.first_row + len(p.bodies) - 1} of {where} to "
                f"{dest[0]!r} failed: {err.remark}", code=err.code,
            ) from err
        for r in results:
            if isinstance(r, Future):
                futures.append((p.first_row, p.first_row + len(p.bodies) - 1, r))

    for batch in batches:
        n = batch.num_rows
        bodies = column(batch, "body")
        topics = column(batch, "topic", opts.topic)
        tags = column(batch, "tags")
        keys = column(batch, "keys")
        props = column(batch, "properties")
        delays = column(batch, "delay_level")
        shard = column(batch, "sharding_key")
        queue_ids = column(batch, "queue_id")
        for i in range(n):
            body = bodies[i]
            if body is None:
                raise ValueError(f"row {row} of {where} has a null body; filter or fill it first")
            if isinstance(body, str):
                body = body.encode()
            topic = topics[i] or opts.topic
            if not topic:
                raise ValueError(f"row {row} of {where} has a null topic and no topic option is set")
            uniq = f"{prefix}{row:016X}"
            delay = delays[i]
            if delay is not None and delay < 0:
                raise ValueError(f"row {row} of {where} has delay_level {delay}; use 0 or more")
            try:
                encoded = _encode_properties(props[i], tags[i], keys[i], delay, shard[i], uniq)
                encoded += extra_properties
            except ValueError as err:
                raise ValueError(f"row {row} of {where}: {err}") from None
            qid = queue_ids[i]
            if qid is None and shard[i] is not None:
                qid = producer.queue_for_key(topic, shard[i])
            if delay:  # a delayed message goes alone
                flush((topic, qid), _one(row, body, encoded, uniq))
                row += 1
                continue
            dest = (topic, qid)
            p = pending.get(dest)
            if p is None:
                p = pending[dest] = _Pending(row)
            p.bodies.append(body)
            p.props.append(encoded)
            p.keys.append(uniq)
            p.size += len(body) + len(encoded) + 100
            if p.size >= opts.max_batch_bytes:
                flush(dest, pending.pop(dest))
            row += 1
    for dest, p in list(pending.items()):
        flush(dest, p)
    if opts.send_mode == "oneway":
        producer.flush()  # answers are not checked, but nothing is left unsent
    for first, last, fut in futures:
        try:
            fut.result()
        except PymqError as err:
            raise type(err)(
                f"async send of rows {first}..{last} of {where} failed: {err.remark}", code=err.code
            ) from err
    return SinkCommitMessage(ids.partition_id, row)


def _one(row: int, body: bytes, encoded: bytes, uniq: str) -> _Pending:
    p = _Pending(row)
    p.bodies.append(body)
    p.props.append(encoded)
    p.keys.append(uniq)
    return p


def _send_back_rows(
    opts: SinkOptions, batches: Iterator[pa.RecordBatch], ids: _TaskIds
) -> SinkCommitMessage:
    assert opts.consumer_group is not None
    consumer = PullConsumer(opts.endpoint, opts.consumer_group)
    total = dead = fallbacks = 0
    by_delay: dict[int, list[tuple[MessageExt, dict[str, str]]]] = {}

    def flush(level: int, items: list[tuple[MessageExt, dict[str, str]]]) -> None:
        nonlocal dead, fallbacks
        results = send_back_acknowledged(
            consumer, items, level, opts.max_reconsume_times,
            f"row(s) of partition {ids.partition_id} of batch {ids.batch_id}",
        )
        dead += sum(r.dead_letter for r in results)
        fallbacks += sum(r.fallback for r in results)

    for batch in batches:
        messages = messages_from_batch(batch)
        delays = column(batch, "delay_level")
        errors = column(batch, "error")
        error_classes = column(batch, "error_class")
        for i, msg in enumerate(messages):
            reason = {
                MC.PROPERTY_CONSUME_FAILURE_REASON: errors[i] or "",
                MC.PROPERTY_CONSUME_FAILURE_EXCEPTION: error_classes[i] or "",
                MC.PROPERTY_CONSUME_FAILURE_STAGE: opts.stage,
                MC.PROPERTY_CONSUME_FAILURE_QUERY_ID: ids.query_id,
                MC.PROPERTY_CONSUME_FAILURE_BATCH_ID: ids.batch_id,
            }
            level = opts.delay_level if delays[i] is None else int(delays[i])
            items = by_delay.setdefault(level, [])
            items.append((msg, reason))
            total += 1
            if len(items) >= SEND_BACK_CHUNK:
                flush(level, by_delay.pop(level))
    for level, items in by_delay.items():
        flush(level, items)
    return SinkCommitMessage(ids.partition_id, total, dead, fallbacks)


def write_partition(opts: SinkOptions, batches: Iterator[pa.RecordBatch]) -> SinkCommitMessage:
    """The one executor loop of the sink, for batch and streaming writes alike."""
    ids = _task_ids(opts)
    if opts.action == "reconsumeLater":
        return _send_back_rows(opts, batches, ids)
    return _send_rows(opts, batches, ids)


def _summary(messages: list[WriterCommitMessage | None]) -> str:
    rows = sum(m.rows for m in messages if isinstance(m, SinkCommitMessage))
    dead = sum(m.dead_letters for m in messages if isinstance(m, SinkCommitMessage))
    return f"{rows} row(s) from {len(messages)} task(s), {dead} to the DLQ"


class PymqSinkWriter(DataSourceArrowWriter):
    """``df.write.format("pymq")``: every row is acknowledged before its task ends."""

    def __init__(self, options: SinkOptions) -> None:
        self.options = options

    def write(self, iterator: Iterator[pa.RecordBatch]) -> SinkCommitMessage:
        return write_partition(self.options, iterator)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        log.info("pymq sink wrote %s", _summary(messages))

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        # What was acknowledged stays on the broker; a re-run sends the same UNIQ_KEYs.
        log.warning("pymq sink write aborted after %s", _summary(messages))


class PymqStreamSinkWriter(DataSourceStreamArrowWriter):
    """``df.writeStream.format("pymq")``: a micro-batch commits once all its rows are acknowledged."""

    def __init__(self, options: SinkOptions) -> None:
        self.options = options

    def write(self, iterator: Iterator[pa.RecordBatch]) -> SinkCommitMessage:
        return write_partition(self.options, iterator)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        log.info("pymq sink batch %d: %s", batchId, _summary(messages))

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        log.warning("pymq sink batch %d aborted after %s", batchId, _summary(messages))

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
from functools import partial
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc
from pymq_proto.record import MessageConst as MC
from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)

from ..backend.base import Backend, cached_backend
from ..client.codec import fixed_width
from ..client.consumer import PullConsumer
from ..client.message import RowKeys
from ..client.producer import Producer
from ..errors import PymqError
from .rows import column, rows_as_messages, send_back_acknowledged, send_back_columns
from .sink_options import SinkOptions

__all__ = ["PymqSinkWriter", "PymqStreamSinkWriter", "SinkCommitMessage", "write_partition"]

log = logging.getLogger(__name__)



@dataclass
class SinkCommitMessage(WriterCommitMessage):
    """What one task wrote: ``rows`` sent (or sent back), ``dead_letters`` among them.

    ``unacknowledged``: oneway rows whose send failed (oneway does not fail the task).
    """

    partition_id: int
    rows: int
    dead_letters: int = 0
    unacknowledged: int = 0
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
    # UNIQ_KEY first: the pre-encoded batch layout (the broker finds it there)
    parts = [f"{MC.PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX}\x01{uniq}\x02"]
    if user:
        parts += [f"{k}\x01{v}\x02" for k, v in user if k is not None and v is not None]
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
        opts.backend.endpoint,
        namesrv_addr=opts.backend.namesrv_addr,
        access_key=opts.backend.access_key,
        secret_key=opts.backend.secret_key,
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
            raise _naming(err, f"sending rows {p.first_row}..{p.first_row + len(p.bodies) - 1} of {where} "
                               f"to {dest[0]!r}") from err
        for r in results:
            if isinstance(r, Future):
                futures.append((p.first_row, p.first_row + len(p.bodies) - 1, r))

    for batch in batches:
        n = batch.num_rows
        if not n:
            continue
        plain = encode_plain_batch(batch, opts.topic, prefix, row, where, opts.max_batch_bytes,
                                   extra_properties, producer.backend)
        if plain is not None and opts.topic:
            records, sizes, row_keys = plain
            first = row
            try:
                results = producer.send_records(opts.topic, records, sizes, row_keys)
            except PymqError as err:
                what = f"sending rows {first}..{first + n - 1} of {where} to {opts.topic!r}"
                raise _naming(err, what) from err
            futures.extend((first, first + n - 1, r) for r in results if isinstance(r, Future))
            row += n
            continue
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
                try:
                    qid = producer.queue_for_key(topic, shard[i])
                except PymqError as err:
                    raise _naming(err, f"choosing the queue of row {row} of {where} in {topic!r}") from err
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
    lost = 0
    if opts.send_mode == "oneway":
        producer.flush()  # answers do not fail the task, but nothing is left unsent
        lost = producer.oneway_unacknowledged
        if lost:
            log.warning("sendMode=oneway: %d of %d row(s) of %s were not acknowledged and may be lost "
                        "(use sync or async to fail the task instead)", lost, row, where)
    for first, last, fut in futures:
        try:
            fut.result()
        except PymqError as err:
            raise _naming(err, f"async send of rows {first}..{last} of {where}") from err
    return SinkCommitMessage(ids.partition_id, row, unacknowledged=lost)


def _naming(err: PymqError, what: str) -> PymqError:
    """``err`` again, its code kept, its message saying which rows failed where."""
    return type(err)(f"{what} failed: {err.remark}", code=err.code)


_HEX = np.frombuffer(b"0123456789ABCDEF", dtype=np.uint8)
_SHIFTS = np.arange(60, -4, -4, dtype=np.uint64)
_UNIQ = f"{MC.PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX}\x01".encode()
_PER_ROW_COLUMNS = ("keys", "properties", "delay_level", "sharding_key", "queue_id")


def _all_null(batch: pa.RecordBatch, name: str) -> bool:
    index: int = batch.schema.get_field_index(name)
    if index < 0:
        return True
    nulls: int = batch.column(index).null_count
    rows: int = batch.num_rows
    return nulls == rows


def encode_plain_batch(
    batch: pa.RecordBatch, topic: str | None, prefix: str, first_row: int, where: str, max_body: int,
    extra_properties: bytes, backend: Backend,
) -> tuple[bytes, npt.NDArray[np.int32], RowKeys] | None:
    """Message images of a whole Arrow batch at once, or None when rows need the per-row path.

    The properties are built here (RocketMQ's encoding, the same on every
    backend); ``backend`` (default: the pymq layout) frames each message.

    The usual bulk write: rows to the ``topic`` option, round robin, with a body and
    maybe tags. Rows that name their own topic, queue, sharding key, delay, keys or
    properties take the per-row path. No per-row Python here but for the msgIds
    the send results carry.
    """
    if not topic or not _all_null(batch, "topic") or not all(
        _all_null(batch, c) for c in _PER_ROW_COLUMNS
    ):
        return None
    n = batch.num_rows
    body = batch.column(batch.schema.get_field_index("body"))
    if body.null_count:
        i = int(pc.index(pc.is_null(body), True).as_py())
        raise ValueError(f"row {first_row + i} of {where} has a null body; filter or fill it first")
    if not pa.types.is_binary(body.type):
        body = body.cast(pa.binary())
    body_lens = pc.binary_length(body).to_numpy(zero_copy_only=False).astype(np.int64)
    if int(body_lens.max()) > max_body:  # the per-row path names the row that is too big
        return None
    # UNIQ_KEY = the task's prefix + the row index as 16 hex digits, as the per-row path
    rows = np.arange(first_row, first_row + n, dtype=np.uint64)
    key_head = _UNIQ + prefix.encode()
    uniq = np.empty((n, len(key_head) + 17), dtype=np.uint8)
    uniq[:, : len(key_head)] = np.frombuffer(key_head, dtype=np.uint8)
    uniq[:, len(key_head) : -1] = _HEX[((rows[:, None] >> _SHIFTS) & np.uint64(15)).astype(np.intp)]
    uniq[:, -1] = 2
    plens = np.full(n, uniq.shape[1], dtype=np.int64)
    parts: list[pa.Array | pa.Scalar] = [fixed_width(uniq)]
    if not _all_null(batch, "tags"):
        tags = batch.column(batch.schema.get_field_index("tags")).cast(pa.binary())
        bad = pc.or_(pc.match_substring(tags, "\x01"), pc.match_substring(tags, "\x02"))
        if pc.any(bad).as_py():
            i = int(pc.index(bad, True).as_py())
            raise ValueError(
                f"row {first_row + i} of {where}: a property name or value contains the reserved "
                "characters \\x01 or \\x02"
            )
        tagged = pc.binary_join_element_wise(
            pa.scalar(f"{MC.PROPERTY_TAGS}\x01".encode()), tags, pa.scalar(b"\x02"), pa.scalar(b"")
        )
        tagged = pc.if_else(pc.equal(pc.binary_length(tags), 0), pa.scalar(b""), tagged).fill_null(b"")
        plens += pc.binary_length(tagged).to_numpy(zero_copy_only=False)
        parts.append(tagged)
    if extra_properties:  # the same on every row (the exactly-once sink's transaction tags)
        plens += len(extra_properties)
        parts.append(pa.scalar(extra_properties, pa.binary()))
    framed = backend.frame_columns(topic, body, body_lens, parts, plens)
    if framed is None:
        return None
    records, sizes = framed
    return records, sizes, RowKeys(prefix, first_row, first_row + n)


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
    consumer = PullConsumer(group=opts.consumer_group, backend=cached_backend(opts.backend))
    total = dead = fallbacks = 0
    shared = {
        MC.PROPERTY_CONSUME_FAILURE_STAGE: opts.stage,
        MC.PROPERTY_CONSUME_FAILURE_QUERY_ID: ids.query_id,
        MC.PROPERTY_CONSUME_FAILURE_BATCH_ID: ids.batch_id,
    }
    for batch in batches:
        for columns, rows in send_back_columns(batch, opts.delay_level, shared):
            results = send_back_acknowledged(
                partial(consumer.send_back_columns, columns, rows_as_messages(rows),
                        opts.max_reconsume_times),
                f"{len(rows)} row(s) of partition {ids.partition_id} of batch {ids.batch_id} "
                f"to %RETRY%{consumer.group}",
            )
            total += len(results)
            dead += sum(r.dead_letter for r in results)
            fallbacks += sum(r.fallback for r in results)
    return SinkCommitMessage(ids.partition_id, total, dead, fallbacks)


def write_partition(opts: SinkOptions, batches: Iterator[pa.RecordBatch]) -> SinkCommitMessage:
    """The one executor loop of the sink, for batch and streaming writes alike."""
    ids = _task_ids(opts)
    if opts.action == "reconsumeLater":
        return _send_back_rows(opts, batches, ids)
    return _send_rows(opts, batches, ids)


def _summary(messages: list[WriterCommitMessage | None]) -> str:
    done = [m for m in messages if isinstance(m, SinkCommitMessage)]
    text = (f"{sum(m.rows for m in done)} row(s) from {len(messages)} task(s), "
            f"{sum(m.dead_letters for m in done)} to the DLQ")
    lost = sum(m.unacknowledged for m in done)
    return f"{text}, {lost} oneway row(s) not acknowledged" if lost else text


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

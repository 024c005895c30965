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
from pymq_proto.record import NAME_VALUE_SEPARATOR, PROPERTY_SEPARATOR, property_key
from pymq_proto.record import MessageConst as MC
from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)

from ..arrow_arrays import INT32_ZERO as _ZERO
from ..arrow_arrays import binary_scalar, to_numpy
from ..backend.base import Backend, cached_backend
from ..client.codec import fixed_width, uniq_property_matrix
from ..client.consumer import PullConsumer
from ..client.message import RowKeys, SendStatus
from ..client.producer import Producer
from ..errors import PymqError, TopicNotExistError
from .option_registry import SINK_OPTIONS
from .rows import column, epoch_ms, rows_as_messages, send_back_acknowledged, send_back_columns
from .sink_options import SinkOptions
from .spark_errors import spark_call

__all__ = ["PymqSinkWriter", "PymqStreamSinkWriter", "SinkCommitMessage", "write_partition"]

log = logging.getLogger(__name__)



@dataclass
class SinkCommitMessage(WriterCommitMessage):
    """What one task wrote: ``rows`` sent (or sent back), ``dead_letters`` among them.

    ``unacknowledged``: oneway rows whose send failed (oneway does not fail the task);
    ``fallbacks``: rows sent back that the client copied to %RETRY% (the broker could not send them back).
    """

    partition_id: int
    rows: int
    dead_letters: int = 0
    unacknowledged: int = 0
    fallbacks: int = 0
    transaction: str | None = None  # exactly-once: the task's half messages are <transaction><row:016X>
    query_id: str = ""
    first_sent_ms: int = 0  # exactly-once: when the task began sending (its half messages' clock starts)


@dataclass(frozen=True)
class _TaskIds:
    query_id: str
    batch_id: str
    partition_id: int
    attempt: int
    write_id: str = ""  # a df.write inside a foreachBatch: which write of the micro-batch

    def key_prefix(self) -> str:
        """16 hex digits shared by every UNIQ_KEY of this task (and of its retries)."""
        seed = f"{self.query_id}:{self.batch_id}:{self.partition_id}"
        if self.write_id:
            seed += f":{self.write_id}"
        return hashlib.blake2b(seed.encode(), digest_size=8).hexdigest().upper()


def _task_ids(opts: SinkOptions) -> _TaskIds:
    from pyspark import TaskContext

    ctx = TaskContext.get()
    if ctx is None:  # called directly (tests, tools)
        return _TaskIds(opts.write_id, "0", 0, 0)
    query = ctx.getLocalProperty("sql.streaming.queryId")
    batch = ctx.getLocalProperty("streaming.sql.batchId") or "0"
    if not query:
        return _TaskIds(opts.write_id, batch, ctx.partitionId(), ctx.attemptNumber())
    # A df.write inside a foreachBatch sees the stream's ids too: its write id keeps two writes
    # of one micro-batch from sending the same keys (a de-duplication window would keep only
    # the first); failed rows sent back still name the stream's query.
    write = "" if opts.stream else opts.write_id
    return _TaskIds(query, batch, ctx.partitionId(), ctx.attemptNumber(), write)


_RESERVED = "a property name or value contains the reserved characters \\x01 or \\x02"
_SEP, _END = NAME_VALUE_SEPARATOR, PROPERTY_SEPARATOR
_SYSTEM_PROPERTIES = MC.STRING_HASH_SET
# how the properties the sink sets begin: their name, then _SEP
_UNIQ_HEAD, _TAGS_HEAD, _KEYS_HEAD, _DELAY_HEAD, _SHARDING_HEAD, _TIMER_HEAD = (name + _SEP for name in (
    MC.PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX, MC.PROPERTY_TAGS, MC.PROPERTY_KEYS,
    MC.PROPERTY_DELAY_TIME_LEVEL, MC.PROPERTY_SHARDING_KEY, MC.PROPERTY_TIMER_DELIVER_MS,
))


def _encode_properties(
    user: list[tuple[str, str]] | None, tags: str | None, keys: Any, delay: int | None,
    sharding_key: str | None, uniq: str, deliver_ms: int | None = None,
) -> bytes:
    """A row's own properties, RocketMQ's encoding: UNIQ_KEY, the user's, TAGS, KEYS, DELAY,
    __SHARDINGKEY, TIMER_DELIVER_MS.

    The ``properties`` column's system properties (RocketMQ's reserved names: UNIQ_KEY,
    TAGS, TRAN_MSG, DELAY, RETRY_TOPIC...) are left out: a row read from a pymq source
    carries all of its message's, and forwarding it as it is must not make a half message
    or a copy with the old msgId. Tags, keys, delay and sharding key come from their columns.
    ValueError (:data:`_RESERVED`) if a value holds a separator \\x01 or \\x02.
    """
    # UNIQ_KEY first: the pre-encoded batch layout (the broker finds it there)
    parts = [f"{_UNIQ_HEAD}{uniq}{_END}"]
    if user:
        parts += [f"{k}{_SEP}{v}{_END}" for k, v in user
                  if k is not None and v is not None and k not in _SYSTEM_PROPERTIES]
    if tags:
        parts.append(f"{_TAGS_HEAD}{tags}{_END}")
    if keys:
        if not isinstance(keys, str):
            spaced = next((k for k in keys if k and MC.KEY_SEPARATOR in k), None)
            if spaced is not None:  # as Message(keys=[...]) refuses it: it would be stored as two keys
                raise ValueError(
                    f"key {spaced!r} of the keys array contains a space, which separates RocketMQ's "
                    "KEYS: it would be stored (and found) as several keys; replace the space, or give "
                    "the keys as one space-separated string"
                )
        text = keys if isinstance(keys, str) else MC.KEY_SEPARATOR.join(k for k in keys if k)
        if text:
            parts.append(f"{_KEYS_HEAD}{text}{_END}")
    if delay:
        parts.append(f"{_DELAY_HEAD}{delay}{_END}")
    if sharding_key is not None:
        parts.append(f"{_SHARDING_HEAD}{sharding_key}{_END}")
    if deliver_ms is not None:
        parts.append(f"{_TIMER_HEAD}{deliver_ms}{_END}")
    text = "".join(parts)
    if text.count(_SEP) != len(parts) or text.count(_END) != len(parts):  # a separator inside a value
        raise ValueError(_RESERVED)
    return text.encode()


def _null_body(row: int, where: str) -> ValueError:
    return ValueError(f"row {row} of {where} has a null body; filter or fill it first")


def _body_column(batch: pa.RecordBatch) -> pa.Array | None:
    """The body column as binary (a string column's values UTF-8 encoded), or None if there is none."""
    index = batch.schema.get_field_index("body")
    if index < 0:
        return None
    body = batch.column(index)
    return body if pa.types.is_binary(body.type) else body.cast(pa.binary())


_ROW_COLUMNS = ("topic", "tags", "keys", "properties", "delay_level", "sharding_key", "queue_id",
                "deliver_time_ms")


def _row_values(batch: pa.RecordBatch, topic: str | None) -> Iterator[tuple[Any, ...]]:
    """Each row's (body, topic, tags, keys, properties, delay_level, sharding_key, queue_id,
    deliver_time_ms: epoch ms, from a timestamp column too).

    A column the batch does not have is null on every row. The ``topic`` option, when set, is
    every row's topic whatever a ``topic`` column holds (as in Spark's Kafka sink: a pass-through
    of read rows must not write back into the topics they came from).
    """
    body = _body_column(batch)
    bodies = [None] * batch.num_rows if body is None else body.to_numpy(zero_copy_only=False).tolist()
    columns = ([topic] * batch.num_rows if name == "topic" and topic
               else epoch_ms(batch, name) if name == "deliver_time_ms" else column(batch, name)
               for name in _ROW_COLUMNS)
    return zip(bodies, *columns, strict=True)


class _MessageBatch:
    """Rows bound for one destination (topic, queue id), sent as one request when full.

    RocketMQ's MessageBatch. ``size`` estimates the request: each row's body and properties,
    and 100 bytes of header.
    """

    __slots__ = ("bodies", "keys", "props", "rows", "size")

    def __init__(self) -> None:
        self.rows: list[int] = []  # the partition's row indexes (interleaved with other destinations')
        self.bodies: list[bytes] = []
        self.props: list[bytes] = []
        self.keys: list[str] = []
        self.size = 0


def _open_producer(opts: SinkOptions, new_producer: Callable[..., Producer]) -> Producer:
    """The task's producer; its send mode, retries, timeout, request size and in-flight window are options.

    It sends through the Python worker's backend, which Spark's later tasks reuse: a route the
    name servers cannot give now (one restarting) is the one an earlier task learnt (probe helper-93).
    """
    return new_producer(
        backend=cached_backend(opts.backend, opts.send_msg_timeout_ms / 1000.0),
        send_mode=opts.send_mode,
        producer_group=opts.producer_group,
        retry_times_when_send_failed=opts.retry_times_when_send_failed,
        retry_times_when_send_async_failed=opts.retry_times_when_send_async_failed,
        send_msg_timeout_ms=opts.send_msg_timeout_ms,
        max_batch_bytes=opts.max_batch_bytes,
        max_message_size=opts.max_message_size,
        # a row stored but not yet durable is sent again to another broker before the task fails
        retry_another_broker_when_not_store_ok=True,
        max_in_flight=opts.max_in_flight,
    )


class _SendTask:
    """One task's ``action=send``, as Spark's KafkaWriteTask: rows in, requests out, every answer checked.

    An Arrow batch whose rows need no more than a body and tags goes whole
    (:meth:`send_arrow_batch`); other batches go row by row
    (:meth:`send_row_by_row`), each row joining its destination's
    :class:`_MessageBatch` (:meth:`_accumulate`). Sends go by the send mode
    (the producer retries them and bounds those in flight); one that fails
    fails the task, naming its rows. :meth:`close` sends what is left, then
    counts oneway losses and waits for every async answer.
    """

    __slots__ = ("extra_properties", "in_flight", "max_batch_bytes", "open_batches", "opts", "partition_id",
                 "prefix", "producer", "rows", "sent", "where")

    def __init__(
        self, opts: SinkOptions, ids: _TaskIds, producer: Producer, prefix: str, extra_properties: bytes,
    ) -> None:
        self.opts = opts
        self.producer = producer
        self.prefix = prefix  # + the row index (16 hex digits): the row's UNIQ_KEY
        self.extra_properties = extra_properties  # the same on every row, after the row's own
        self.max_batch_bytes = opts.max_batch_bytes
        self.partition_id = ids.partition_id
        self.where = f"partition {ids.partition_id} of batch {ids.batch_id}"
        # (topic, queue id, broker): a sharding key's queue is a broker's; a queue_id column's any
        self.open_batches: dict[tuple[str, int | None, str | None], _MessageBatch] = {}
        # async: (its rows, as errors name them, the queue id and broker they pin or None, answer)
        self.in_flight: list[tuple[str, int | None, str | None, Future[Any]]] = []
        self.rows = 0  # rows taken: the index of the next one
        self.sent = 0  # rows handed to the producer (the failed task's error says how many)

    def execute(self, batches: Iterator[pa.RecordBatch]) -> SinkCommitMessage:
        try:
            for batch in batches:
                if batch.num_rows and not self.send_arrow_batch(batch):
                    self.send_row_by_row(batch)
            return self.close()
        except Exception as err:
            # The driver hears nothing from a failed task: without this, "aborted after 0 row(s)"
            # read as if nothing was written, and a re-run wrote the rows sent here a second time.
            # (exactly-once: the rows sent are half messages, never delivered unless the batch commits)
            # oneway: the rows whose sends failed (none of them reached a broker where the task
            # fails for that) are not among them; those acknowledged before are stored
            sent = self.sent - (self.producer.oneway_unacknowledged if self.opts.send_mode == "oneway" else 0)
            if sent > 0 and not self.opts.exactly_once:
                err.add_note(
                    f"pymq sink: {sent} row(s) of {self.where} had been sent before this failure "
                    "and may be stored (those of sync sends are); sent again, they are stored twice unless "
                    "the topic has a de-duplication window (a stream's batch run again, or a write run "
                    "again with the same writeId, sends the same msgIds)")
            raise

    def send_arrow_batch(self, batch: pa.RecordBatch) -> bool:
        """The whole batch at once, laid out by Arrow (:func:`encode_plain_batch`); False if it cannot be."""
        topic, first, n = self.opts.topic, self.rows, batch.num_rows
        plain = encode_plain_batch(batch, topic, self.prefix, first, self.where,
                                   self.producer.max_message_size, self.extra_properties,
                                   self.producer.backend)
        if plain is None or not topic:
            return False
        records, sizes, row_keys = plain
        what = f"rows {first}..{first + n - 1}"
        try:
            results = self.producer.send_records(topic, records, sizes, row_keys)
        except PymqError as err:
            raise self._send_failed(err, topic, what) from err
        self.sent += n
        self._keep_answers(results, what)
        self.rows += n
        return True

    def send_row_by_row(self, batch: pa.RecordBatch) -> None:
        """Rows that may name their own topic, queue, sharding key, delay, keys or properties."""
        default_topic, prefix, extra, where = self.opts.topic, self.prefix, self.extra_properties, self.where
        producer, accumulate = self.producer, self._accumulate  # looked up once, not per row
        row = self.rows
        for body, topic, tags, keys, props, delay, shard, queue_id, at in _row_values(batch, default_topic):
            if body is None:
                raise _null_body(row, where)
            topic = topic or default_topic
            if not topic:
                raise ValueError(f"row {row} of {where} has a null topic and no topic option is set")
            if delay is not None and delay < 0:
                raise ValueError(f"row {row} of {where} has delay_level {delay}; use 0 or more")
            if at is not None and at < 0:
                raise ValueError(f"row {row} of {where} has deliver_time_ms {at}, before 1970: give "
                                 "milliseconds since the epoch (or a timestamp), or null to send now")
            if at is not None and delay:
                raise ValueError(f"row {row} of {where} has delay_level {delay} and deliver_time_ms "
                                 f"{at}: give one of them")
            uniq = f"{prefix}{row:016X}"
            try:  # the row's own properties, then those of every row
                encoded = _encode_properties(props, tags, keys, delay, shard, uniq, at) + extra
            except ValueError as err:
                raise ValueError(f"row {row} of {where}: {err}") from None
            broker = None
            if queue_id is None and shard is not None:  # MessageQueueSelector by hash (inline: per row)
                try:
                    mq = producer.message_queue_for_key(topic, shard)
                except PymqError as err:
                    raise _naming(err, f"choosing the queue of row {row} of {where} in {topic!r}") from err
                queue_id, broker = mq.queue_id, mq.broker_name
            if delay or at is not None:  # RocketMQ does not delay batches: a delayed message goes alone
                self._send_encoded((topic, queue_id, broker), [row], [body], [encoded], [uniq])
            else:
                accumulate((topic, queue_id, broker), row, body, encoded, uniq)
            row += 1
        self.rows = row

    def close(self) -> SinkCommitMessage:
        """Sends the batches still open; fails the task if a sync or async send did not succeed."""
        for dest, batch in list(self.open_batches.items()):
            self._send_batch(dest, batch)
        lost = self._oneway_unacknowledged()
        self._check_for_errors()
        return SinkCommitMessage(self.partition_id, self.rows, unacknowledged=lost)

    def _accumulate(
        self, dest: tuple[str, int | None, str | None], row: int, body: bytes, props: bytes, key: str,
    ) -> None:
        """The row joins its destination's batch, which is sent once it holds ``maxBatchBytes``."""
        batch = self.open_batches.get(dest)
        if batch is None:
            batch = self.open_batches[dest] = _MessageBatch()
        batch.rows.append(row)
        batch.bodies.append(body)
        batch.props.append(props)
        batch.keys.append(key)
        batch.size += len(body) + len(props) + 100
        if batch.size >= self.max_batch_bytes:
            self._send_batch(dest, self.open_batches.pop(dest))

    def _send_batch(self, dest: tuple[str, int | None, str | None], batch: _MessageBatch) -> None:
        self._send_encoded(dest, batch.rows, batch.bodies, batch.props, batch.keys)

    def _send_encoded(
        self, dest: tuple[str, int | None, str | None], rows: list[int], bodies: list[bytes],
        props: list[bytes], keys: list[str],
    ) -> None:
        """``rows`` with their properties encoded, to ``dest``: (topic, queue id, broker);
        queue id None: round robin."""
        topic, queue_id, broker = dest
        what = _rows_text(rows)
        try:
            results = self.producer.send_encoded(topic, bodies, props, keys, queue_id=queue_id,
                                                 broker_name=broker)
        except PymqError as err:
            raise _pinned(self._send_failed(err, topic, what), err, queue_id, broker) from err
        self.sent += len(rows)
        self._keep_answers(results, what, queue_id, broker)

    def _send_failed(self, err: PymqError, topic: str, what: str) -> PymqError:
        return _naming(err, f"sending {what} of {self.where} to {topic!r}")

    def _keep_answers(self, results: list[Any], what: str, queue_id: int | None = None,
                      broker: str | None = None) -> None:
        """The answers to the sends of ``what`` (rows, as errors name them) to ``queue_id`` of
        ``broker`` where rows pin theirs: sync ones checked now, async ones kept for :meth:`close`."""
        for r in results:
            if isinstance(r, Future):
                self.in_flight.append((what, queue_id, broker, r))
            else:
                _check_stored(r, f"sending {what} of {self.where}")

    def _oneway_unacknowledged(self) -> int:
        """sendMode=oneway: waits for every answer; the failed sends are logged, not raised, but
        for sends that never reached a broker (as RocketMQ's sendOneway throws then)."""
        if self.opts.send_mode != "oneway":
            return 0
        self.producer.flush()  # answers do not fail the task, but nothing is left unsent
        lost = self.producer.oneway_unacknowledged
        unsent = self.producer.oneway_undelivered
        if unsent is not None:
            raise _naming(unsent, f"sendMode=oneway: {lost} of {self.rows} row(s) of {self.where} not "
                                  "sent: a broker could not be reached; sending them")
        if lost:
            log.warning("sendMode=oneway: %d of %d row(s) of %s were not acknowledged and may be lost "
                        "(use sync or async to fail the task instead)", lost, self.rows, self.where)
        return lost

    def _check_for_errors(self) -> None:
        """sendMode=async: waits for every answer; the first failed send fails the task, naming its rows."""
        for rows, queue_id, broker, answer in self.in_flight:
            what = f"async send of {rows} of {self.where}"
            try:
                result = answer.result()
            except PymqError as err:
                raise _pinned(_naming(err, what), err, queue_id, broker) from err
            _check_stored(result, what)


def _rows_text(rows: list[int]) -> str:
    """The rows a request carried, as errors name them: ``rows 4..9``, or a few and how many
    when other destinations' rows came between them."""
    first, last = rows[0], rows[-1]
    if len(rows) == 1:
        return f"row {first}"
    if last - first == len(rows) - 1:
        return f"rows {first}..{last}"
    shown = ", ".join(map(str, rows[:5]))
    return f"rows {shown}{', ...' if len(rows) > 5 else ''} ({len(rows)} rows from {first} to {last})"


def _check_stored(result: Any, what: str) -> None:
    """Fail the task on a send the broker answered with other than SEND_OK.

    FLUSH_DISK_TIMEOUT, FLUSH_SLAVE_TIMEOUT and SLAVE_NOT_AVAILABLE mean the rows are
    stored but not yet as durable as the broker is set to make them (SYNC_FLUSH, a
    synchronous slave): a broker crash could lose them. A task that succeeded would not
    be run again, so it fails; Spark's retry sends them again with the same msgIds.
    """
    status = getattr(result, "status", SendStatus.SEND_OK)
    if status is not SendStatus.SEND_OK:
        raise PymqError(
            f"{what}: the broker answered {status.value}: the rows are stored but not yet durable "
            "as the broker is set to make them (SYNC_FLUSH within syncFlushTimeout, or a "
            "synchronous slave), so the task fails and Spark sends them again with the same msgIds; "
            "check the broker's disk or slave, or raise its syncFlushTimeout",
            code=status.value,
        )


def _send_rows(
    opts: SinkOptions, batches: Iterator[pa.RecordBatch], ids: _TaskIds, *,
    new_producer: Callable[..., Producer] = Producer, prefix: str | None = None,
    extra_properties: bytes = b"",
) -> SinkCommitMessage:
    """Send every row; ``prefix`` + row index is its UNIQ_KEY, ``extra_properties`` go on each."""
    producer = _open_producer(opts, new_producer)
    return _SendTask(opts, ids, producer, prefix or ids.key_prefix(), extra_properties).execute(batches)


def _pinned(failed: PymqError, err: PymqError, queue_id: int | None, broker: str | None) -> PymqError:
    """``failed`` (``err`` named), saying which queue the rows pin and why they were not sent to another
    broker, where a broker failed (``err.retriable``: down, busy, no answer) a send of rows that pin
    their queue: a ``sharding_key``'s (its broker known) or a ``queue_id`` column's."""
    if queue_id is None or not err.retriable:
        return failed
    if broker is not None:
        failed.remark += (
            f". Their sharding_key maps these rows to queue {queue_id} of broker {broker!r}, and a keyed "
            "row is not sent to another broker (as with RocketMQ's MessageQueueSelector: a key's rows "
            "keep one queue, in order); once the name servers drop a broker that is down from the "
            "topic's route, a run of the task again maps the keys onto the queues the route lists then")
    else:
        failed.remark += (f". Their queue_id column names queue {queue_id}: they are not sent to another "
                          "queue or broker")
    return failed


def _naming(err: PymqError, what: str) -> PymqError:
    """``err`` again, its code kept, its message saying which rows failed where."""
    return type(err)(f"{what} failed: {err.remark}", code=err.code)


_TAGS_KEY = binary_scalar(property_key(MC.PROPERTY_TAGS))
_END_BYTES = binary_scalar(_END.encode())
_NO_BYTES = binary_scalar(b"")
_PER_ROW_COLUMNS = ("keys", "properties", "delay_level", "sharding_key", "queue_id", "deliver_time_ms")


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
) -> tuple[bytes | memoryview, npt.NDArray[np.int32], RowKeys] | None:
    """Message images of a whole Arrow batch at once, or None when rows need the per-row path.

    The properties are built here (RocketMQ's encoding, the same on every
    backend); ``backend`` (default: the pymq layout) frames each message.

    The usual bulk write: rows to the ``topic`` option (a ``topic`` column is then
    ignored), round robin, with a body and maybe tags. Rows that name their own queue,
    sharding key, delay, keys or properties take the per-row path. No per-row Python here but for the msgIds
    the send results carry.
    """
    if not topic or not all(_all_null(batch, c) for c in _PER_ROW_COLUMNS):
        return None
    n = batch.num_rows
    body = _body_column(batch)
    if body is None:  # the per-row path names the first row
        return None
    if body.null_count:
        raise _null_body(first_row + int(pc.index(pc.is_null(body), True).as_py()), where)
    body_lens = to_numpy(pc.binary_length(body)).astype(np.int64)
    if int(body_lens.max()) > max_body:  # the per-row path names the row that is too big
        return None
    # UNIQ_KEY = the task's prefix + the row index as 16 hex digits, as the per-row path
    keys = RowKeys(prefix, first_row, first_row + n)
    uniq = uniq_property_matrix(keys)
    plens = np.full(n, uniq.shape[1], dtype=np.int64)
    parts: list[pa.Array | pa.Scalar] = [fixed_width(uniq)]
    if not _all_null(batch, "tags"):
        tags = batch.column(batch.schema.get_field_index("tags")).cast(pa.binary())
        bad = pc.or_(pc.match_substring(tags, "\x01"), pc.match_substring(tags, "\x02"))
        if pc.any(bad).as_py():
            raise ValueError(f"row {first_row + int(pc.index(bad, True).as_py())} of {where}: {_RESERVED}")
        tagged = pc.binary_join_element_wise(_TAGS_KEY, tags, _END_BYTES, _NO_BYTES)
        tagged = pc.if_else(pc.equal(pc.binary_length(tags), _ZERO), _NO_BYTES, tagged).fill_null(_NO_BYTES)
        plens += to_numpy(pc.binary_length(tagged))
        parts.append(tagged)
    if extra_properties:  # the same on every row (the exactly-once sink's transaction tags)
        plens += len(extra_properties)
        parts.append(binary_scalar(extra_properties))
    framed = backend.frame_columns(topic, body, body_lens, parts, plens)
    if framed is None:
        return None
    records, sizes = framed
    return records, sizes, keys


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
    first = 0  # the task's index of the batch's first row
    for batch in batches:
        _check_delay_levels(batch, first, f"partition {ids.partition_id} of batch {ids.batch_id}")
        for columns, rows, where in send_back_columns(batch, opts.delay_level, shared):
            results = send_back_acknowledged(
                partial(consumer.send_back_columns, columns, rows_as_messages(rows),
                        opts.max_reconsume_times),
                rows.num_rows,
                partial(_rows_sent_back, first, where, f"of partition {ids.partition_id} of batch "
                        f"{ids.batch_id} to %RETRY%{consumer.group}"),
            )
            total += len(results)
            dead += sum(r.dead_letter for r in results)
            fallbacks += sum(r.fallback for r in results)
        first += batch.num_rows
    return SinkCommitMessage(ids.partition_id, total, dead_letters=dead, fallbacks=fallbacks)


def _check_delay_levels(batch: pa.RecordBatch, first: int, where: str) -> None:
    """A send back's ``delay_level`` column within the delayLevel option's bounds (a Java int on the wire)."""
    index = batch.schema.get_field_index("delay_level")
    if index < 0:
        return
    spec = SINK_OPTIONS["delayLevel"]
    levels = batch.column(index)
    bad = pc.or_(pc.less(levels, spec.minimum), pc.greater(levels, spec.maximum)).fill_null(False)
    if pc.any(bad).as_py():
        row = int(pc.index(bad, True).as_py())
        raise ValueError(
            f"row {first + row} of {where} has delay_level {levels[row].as_py()}; action=reconsumeLater "
            f"takes {spec.minimum}..{spec.maximum} (-1: straight to the DLQ, 0: RocketMQ's 3 + retries)"
        )


def _rows_sent_back(first: int, where: list[int], of: str, items: list[int]) -> str:
    return f"{_rows_text([first + where[i] for i in items])} {of}"


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
    copied = sum(m.fallbacks for m in done)
    if copied:
        text += f", {copied} copied to %RETRY% directly (the broker could not send them back)"
    lost = sum(m.unacknowledged for m in done)
    return f"{text}, {lost} oneway row(s) not acknowledged" if lost else text


def _aborted(messages: list[WriterCommitMessage | None]) -> str:
    """What an aborted write left: the finished tasks' rows are stored; a failed task's error
    (the task's log, the query's exception) says how many of its rows it had sent."""
    failed = sum(1 for m in messages if not isinstance(m, SinkCommitMessage))
    text = f"the {len(messages) - failed} task(s) that finished stored {_summary(messages)}"
    if failed:
        text += (f"; {failed} task(s) failed or did not run, and a failed one may have stored rows "
                 "before failing (its error says how many it had sent)")
    return text


def check_sink_topic(opts: SinkOptions) -> None:
    """The ``topic`` option's route, looked up once on the driver before any task runs: a topic the
    brokers do not know (and would not create) fails the write naming it, instead of every task's
    first send after Spark's task retries. Rows' own ``topic`` columns are checked where they are sent.
    A broker that does not answer now is left to the tasks, which retry their sends."""
    if opts.action != "send" or opts.topic is None:
        return
    try:
        cached_backend(opts.backend, opts.send_msg_timeout_ms / 1000.0).route(opts.topic, refresh=True)
    except TopicNotExistError as err:
        raise _naming(err, f"pymq sink: looking up topic {opts.topic!r} before writing") from None
    except PymqError as err:
        log.warning("pymq sink: could not look up topic %r before writing (%s); the tasks will try",
                    opts.topic, err)


class PymqSinkWriter(DataSourceArrowWriter):
    """``df.write.format("pymq")``: every row is acknowledged before its task ends."""

    def __init__(self, options: SinkOptions) -> None:
        self.options = options

    @spark_call
    def write(self, iterator: Iterator[pa.RecordBatch]) -> SinkCommitMessage:
        return write_partition(self.options, iterator)

    @spark_call
    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        log.info("pymq sink wrote %s", _summary(messages))

    @spark_call
    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        log.warning("pymq sink write aborted: %s", _aborted(messages))


class PymqStreamSinkWriter(DataSourceStreamArrowWriter):
    """``df.writeStream.format("pymq")``: a micro-batch commits once all its rows are acknowledged."""

    def __init__(self, options: SinkOptions) -> None:
        self.options = options

    @spark_call
    def write(self, iterator: Iterator[pa.RecordBatch]) -> SinkCommitMessage:
        return write_partition(self.options, iterator)

    @spark_call
    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        log.info("pymq sink batch %d: %s", batchId, _summary(messages))

    @spark_call
    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        log.warning("pymq sink batch %d aborted: %s", batchId, _aborted(messages))

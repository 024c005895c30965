"""Rows of the pymq source, back as the client's MessageExt (for send back and listeners)."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pymq_proto.record import MessageConst

from ..client.consumer import SendBackColumns, SendBackResult
from ..client.message import MessageExt
from ..errors import PymqError
from .schema import arrow_schema

__all__ = [
    "SEND_BACK_ATTEMPTS", "SEND_BACK_WAIT_S", "column", "empty_batch", "epoch_ms", "messages_from_batch",
    "messages_to_batch", "rows_as_messages", "send_back_acknowledged", "send_back_columns",
]

SEND_BACK_ATTEMPTS = 4
# How long a send back waits for a broker that does not answer (restarting, or crashed and coming
# back): as long as the source's pulls wait for it (pollTimeoutMs's default), so a broker restart
# that a stream's reads ride through does not fail the micro-batch whose failures are being sent back.
SEND_BACK_WAIT_S = 60.0
_SEND_BACK_BACKOFF_MAX_S = 2.0
_RETRY_TOPIC = MessageConst.PROPERTY_RETRY_TOPIC

_FIELDS = ("topic", "queue_id", "broker_name", "queue_offset", "msg_id", "offset_msg_id",
           "commit_log_offset", "body", "tags", "keys", "properties", "born_timestamp",
           "store_timestamp", "reconsume_times", "retry_topic")


def column(batch: pa.RecordBatch, name: str, default: Any = None) -> list[Any]:
    """One column as a Python list, or ``default`` repeated when it is absent."""
    index = batch.schema.get_field_index(name)
    if index < 0:
        return [default] * batch.num_rows
    arr = batch.column(index)
    kind = arr.type
    if (pa.types.is_map(kind) or pa.types.is_string(kind) or pa.types.is_large_string(kind)
            or (pa.types.is_integer(kind) and arr.null_count == 0)):
        # the same values as to_pylist, made in C++ (to_pylist costs ~30 us a row for a map)
        return list(arr.to_numpy(zero_copy_only=False).tolist())
    return list(arr.to_pylist())


def epoch_ms(batch: pa.RecordBatch, name: str, null: int | None = None) -> list[int | None]:
    """A bigint (epoch ms) or timestamp column as milliseconds since the epoch; ``null`` where a
    value is null or the column is absent."""
    index = batch.schema.get_field_index(name)
    if index < 0:
        return [null] * batch.num_rows
    arr = batch.column(index)
    if pa.types.is_timestamp(arr.type):
        # the instants as UTC, without their zone (Spark's session time zone): floor_temporal
        # floors in local time, and an instant of a DST fall-back hour is ambiguous there
        arr = arr.cast(pa.timestamp(arr.type.unit))
        if arr.type.unit in ("us", "ns"):  # floored: a cast truncates -0.5 ms to 0, past a sign check
            arr = pc.floor_temporal(arr, unit="millisecond")
        arr = arr.cast(pa.timestamp("ms")).cast(pa.int64())
    if null is not None:
        arr = arr.fill_null(null)
    return list(arr.to_pylist())


def messages_from_batch(batch: pa.RecordBatch) -> list[MessageExt]:
    """A MessageExt per row of a pymq source batch.

    As RocketMQ shows them: a retried message has its original topic in
    ``topic`` and RETRY_TOPIC in its properties. Rows without
    ``commit_log_offset`` did not come from a pymq source: ValueError.
    """
    cols = {name: column(batch, name) for name in _FIELDS if not name.endswith("_timestamp")}
    cols["born_timestamp"] = epoch_ms(batch, "born_timestamp", 0)
    cols["store_timestamp"] = epoch_ms(batch, "store_timestamp", 0)
    out = []
    for i in range(batch.num_rows):
        if cols["commit_log_offset"][i] is None or not cols["topic"][i]:
            raise ValueError(
                f"row {i} has no commit_log_offset or topic: only rows read with "
                "format('pymq') (with their metadata columns) can be sent back"
            )
        props = dict(cols["properties"][i] or ())
        if cols["retry_topic"][i]:
            props.setdefault(MessageConst.PROPERTY_RETRY_TOPIC, cols["topic"][i])
        out.append(MessageExt(
            topic=cols["topic"][i],
            queue_id=cols["queue_id"][i] or 0,
            broker_name=cols["broker_name"][i] or "",
            queue_offset=cols["queue_offset"][i] or 0,
            msg_id=cols["msg_id"][i] or "",
            offset_msg_id=cols["offset_msg_id"][i] or "",
            commit_log_offset=cols["commit_log_offset"][i],
            body=cols["body"][i] or b"",
            tags=cols["tags"][i],
            keys=tuple(cols["keys"][i] or ()),
            properties=props,
            born_timestamp=cols["born_timestamp"][i],
            store_timestamp=cols["store_timestamp"][i],
            reconsume_times=cols["reconsume_times"][i] or 0,
        ))
    return out


def rows_as_messages(batch: pa.RecordBatch) -> Callable[[Sequence[int]], list[MessageExt]]:
    """``messages(indexes)`` for :meth:`PullConsumer.send_back_columns`: those rows as MessageExt."""
    return lambda indexes: messages_from_batch(batch.take(pa.array(indexes, pa.int64())))


def send_back_columns(
    batch: pa.RecordBatch, delay_level: int, properties: Mapping[str, str]
) -> list[tuple[SendBackColumns, pa.RecordBatch, list[int]]]:
    """The rows of a pymq source batch as send-back columns, one per broker, with their rows
    and where those are in ``batch`` (an error names the rows of the task).

    Straight from the Arrow columns (a MessageExt per row cost more than the send
    back itself). ``delay_level`` is for rows whose ``delay_level`` column is
    null or absent; ``error`` and ``error_class`` columns become each row's
    CONSUME_FAILURE_REASON / _EXCEPTION. Rows without ``commit_log_offset`` or
    ``topic`` did not come from a pymq source: ValueError.
    """
    for name in ("commit_log_offset", "topic"):
        index = batch.schema.get_field_index(name)
        missing = pa.array([True] * batch.num_rows) if index < 0 else pc.is_null(batch.column(index))
        if name == "topic" and index >= 0:
            missing = pc.or_(missing, pc.fill_null(pc.equal(batch.column(index), ""), True))
        if pc.any(missing).as_py():
            raise ValueError(
                f"row {pc.index(missing, True).as_py()} has no commit_log_offset or topic: only rows "
                "read with format('pymq') (with their metadata columns) can be sent back"
            )
    brokers = _strings(batch, "broker_name")
    if len(set(brokers)) > 1:
        names = pa.array(brokers)
        parts = []
        for b in dict.fromkeys(brokers):
            mine = pc.equal(names, b)
            ((columns, rows, _),) = send_back_columns(batch.filter(mine), delay_level, properties)
            parts.append((columns, rows, pc.indices_nonzero(mine).to_numpy().tolist()))
        return parts
    index = batch.schema.get_field_index("delay_level")
    delays = ([delay_level] * batch.num_rows if index < 0
              else batch.column(index).fill_null(delay_level).to_numpy().tolist())
    reasons = {prop: _strings(batch, col, clean=True) for col, prop in _REASON_COLUMNS
               if batch.schema.get_field_index(col) >= 0}
    offsets = batch.column(batch.schema.get_field_index("commit_log_offset")).cast(pa.int64())
    index = batch.schema.get_field_index("reconsume_times")
    times = [] if index < 0 else batch.column(index).fill_null(0).to_numpy().tolist()
    columns = SendBackColumns(
        brokers[0] if brokers else "", offsets.to_numpy().tolist(), delays,
        _strings(batch, "msg_id"), _strings(batch, "topic"), properties, reasons, times,
    )
    return [(columns, batch, list(range(batch.num_rows)))]


_REASON_COLUMNS = (("error", MessageConst.PROPERTY_CONSUME_FAILURE_REASON),
                   ("error_class", MessageConst.PROPERTY_CONSUME_FAILURE_EXCEPTION))


def _strings(batch: pa.RecordBatch, name: str, *, clean: bool = False) -> list[str]:
    """A string column as a list, "" for null or absent; ``clean``: without property separators."""
    index = batch.schema.get_field_index(name)
    if index < 0:
        return [""] * batch.num_rows
    arr = batch.column(index).cast(pa.string()).fill_null("")
    if clean:
        arr = pc.replace_substring_regex(arr, "[\x01\x02]", "\ufffd")
    return list(arr.to_numpy(zero_copy_only=False).tolist())


def send_back_acknowledged(
    send: Callable[[list[SendBackResult | None]], list[SendBackResult]], items: int,
    what: Callable[[list[int]], str], *, wait_s: float | None = None,
) -> list[SendBackResult]:
    """Run ``send`` (the send back of ``items`` items), retrying with backoff until all are acknowledged.

    A micro-batch must not complete before its send backs are acknowledged. An error a retry
    may mend (``PymqError.retriable``: the broker unreachable, restarting, busy, slow) is retried
    for ``wait_s`` (:data:`SEND_BACK_WAIT_S`), as the source's pulls wait for a restarting broker;
    any other after SEND_BACK_ATTEMPTS attempts. Then the error is raised, so the task fails and
    Spark runs it again (at-least-once). ``send(done)`` keeps each item's result in
    ``done`` and skips the items that have one (``done`` of
    :meth:`PullConsumer.send_back_columns`): an attempt after an error sends
    only what the broker has not taken, not the whole request again.
    ``what(items)`` names the items still without a result, for the message.
    """
    done: list[SendBackResult | None] = [None] * items
    deadline = time.monotonic() + (SEND_BACK_WAIT_S if wait_s is None else wait_s)
    attempt = 0
    while True:
        try:
            return send(done)
        except PymqError as err:
            attempt += 1
            pause = min(0.5 * 2 ** (attempt - 1), _SEND_BACK_BACKOFF_MAX_S)
            waiting = err.retriable and time.monotonic() + pause < deadline
            if attempt >= SEND_BACK_ATTEMPTS and not waiting:
                pending = [i for i, r in enumerate(done) if r is None] or list(range(items))
                raise type(err)(
                    f"could not send {what(pending)} back: {err.remark}; the task fails so that Spark "
                    "runs it again",
                    code=err.code,
                ) from err
            time.sleep(pause)


def empty_batch() -> pa.RecordBatch:
    schema = arrow_schema()
    return pa.RecordBatch.from_arrays([pa.nulls(0, f.type) for f in schema], schema=schema)


def messages_to_batch(
    messages: Sequence[MessageExt], *, read_from: str, retry: bool
) -> pa.RecordBatch:
    """Rows of already-decoded messages (the slow, obviously-right reference path)."""
    schema = arrow_schema()
    rows: dict[str, list[Any]] = {f.name: [] for f in schema}
    for m in messages:
        original = m.properties.get(_RETRY_TOPIC) if retry else None
        rows["topic"].append(m.topic if original is None else original)
        rows["queue_id"].append(m.queue_id)
        rows["broker_name"].append(m.broker_name)
        rows["queue_offset"].append(m.queue_offset)
        rows["msg_id"].append(m.msg_id)
        rows["offset_msg_id"].append(m.offset_msg_id)
        rows["commit_log_offset"].append(m.commit_log_offset)
        rows["tags"].append(m.tags)
        rows["keys"].append(list(m.keys))
        rows["body"].append(m.body)
        rows["properties"].append(list(m.properties.items()))
        rows["born_timestamp"].append(m.born_timestamp * 1000)
        rows["store_timestamp"].append(m.store_timestamp * 1000)
        rows["reconsume_times"].append(m.reconsume_times)
        rows["retry_topic"].append(read_from if retry else None)
    return pa.RecordBatch.from_arrays(
        [pa.array(rows[f.name], f.type) for f in schema], schema=schema
    )

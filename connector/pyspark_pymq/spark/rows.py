"""Rows of the pymq source, back as the client's MessageExt (for send back and listeners)."""

from __future__ import annotations

import time
from datetime import datetime
from typing import Any

import pyarrow as pa
from pymq_proto.record import MessageConst

from ..client.consumer import PullConsumer, SendBackResult
from ..client.message import MessageExt
from ..errors import PymqError

__all__ = ["SEND_BACK_ATTEMPTS", "column", "messages_from_batch", "send_back_acknowledged"]

SEND_BACK_ATTEMPTS = 4
Failed = list[tuple[MessageExt, dict[str, str]]]

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


def _ms_column(batch: pa.RecordBatch, name: str) -> list[int]:
    """A timestamp (or ms) column as ms since the epoch, 0 for null."""
    index = batch.schema.get_field_index(name)
    if index < 0:
        return [0] * batch.num_rows
    arr = batch.column(index)
    if pa.types.is_timestamp(arr.type):
        ms = arr.cast(pa.timestamp("ms", arr.type.tz), safe=False).cast(pa.int64()).fill_null(0)
        return list(ms.to_numpy().tolist())
    return [_ms(v) for v in arr.to_pylist()]


def _ms(value: Any) -> int:
    if isinstance(value, datetime):
        return int(value.timestamp() * 1000)
    return int(value or 0)


def messages_from_batch(batch: pa.RecordBatch) -> list[MessageExt]:
    """A MessageExt per row of a pymq source batch.

    As RocketMQ shows them: a retried message has its original topic in
    ``topic`` and RETRY_TOPIC in its properties. Rows without
    ``commit_log_offset`` did not come from a pymq source: ValueError.
    """
    cols = {name: column(batch, name) for name in _FIELDS if not name.endswith("_timestamp")}
    cols["born_timestamp"] = _ms_column(batch, "born_timestamp")
    cols["store_timestamp"] = _ms_column(batch, "store_timestamp")
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


def send_back_acknowledged(
    consumer: PullConsumer, failed: Failed, delay_level: int, max_reconsume_times: int | None,
    where: str,
) -> list[SendBackResult]:
    """Send ``failed`` (message, reason) back, retrying with backoff until acknowledged.

    A micro-batch must not complete before its send backs are acknowledged:
    after SEND_BACK_ATTEMPTS the error is raised, so the task fails and Spark
    runs it again (at-least-once). ``where`` says which rows, for the message.
    """
    for attempt in range(SEND_BACK_ATTEMPTS):
        try:
            return consumer.send_back_batch(
                [m for m, _ in failed], delay_level=delay_level,
                max_reconsume_times=max_reconsume_times, reasons=[r for _, r in failed],
            )
        except PymqError as err:
            if attempt + 1 == SEND_BACK_ATTEMPTS:
                raise type(err)(
                    f"could not send {len(failed)} {where} back to %RETRY%{consumer.group}: "
                    f"{err.remark}; the task fails so that Spark runs it again",
                    code=err.code,
                ) from err
            time.sleep(0.5 * 2**attempt)
    raise AssertionError("unreachable")

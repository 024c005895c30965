"""Stored records, as a pull returns them, decoded straight into Arrow.

This is the source's hot path: every message read goes through
:func:`decode_to_arrow`. A pull answers with commit-log records back to back
(layout in ``pymq_proto.record``: an 80-byte little-endian header, the body,
``u16`` topic length + topic, ``u16`` properties length + properties). Decoding
them one ``MessageExt`` at a time costs several microseconds per message;
here nothing is done per record in Python:

- where each record starts comes from the sizes the broker sends with the pull
  (``record_sizes``, checked against each record's ``TOTALSIZE``); without them,
  a tight loop follows ``TOTALSIZE`` from record to record;
- the 80-byte headers are gathered into one ``(n, 80)`` array and viewed with a
  structured dtype (queue id, offsets, timestamps, store host ...);
- bodies and properties are cut out of the pulled buffer with one Arrow
  ``take`` over a binary array whose offsets alternate between "wanted" and
  "skipped" spans (no per-message slicing);
- properties (``name\\x01value\\x02`` ...) are split with numpy by the positions
  of the separator bytes into a ``map<string,string>`` column; tags, keys and
  the msg id are looked up in it by name;
- ``offset_msg_id`` (store host + physical offset as 32 hex digits) is one
  ``hexlify`` of all ids at once.

If a record's properties are not in the well-formed encoding, or not UTF-8, the
batch falls back to the client's per-message decoder (which replaces bytes that
are not UTF-8 by U+FFFD), so odd input costs speed, never correctness.
"""

from __future__ import annotations

import binascii
import struct
from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pymq_proto.record import HEADER_DTYPE, HEADER_SIZE, MessageConst

from ..arrow_arrays import INT32_ZERO as _ZERO
from ..arrow_arrays import from_numpy, indices_of, null_scalar, string_scalar, to_numpy
from ..spark.rows import empty_batch, messages_to_batch
from ..spark.schema import arrow_schema, needs_properties, wants

__all__ = ["decode_to_arrow", "empty_batch", "find_record_starts", "messages_to_batch"]

_TOTAL_SIZE = struct.Struct("<i")

# The header fields the decoder reads (same offsets and size as the stored header).
_HEADER_DTYPE = HEADER_DTYPE[
    ["total", "queue_id", "queue_offset", "phy", "born", "store_ts", "reconsume", "body_len"]
]
_STORE_HOST = slice(56, 64)
_PHY_BYTES = slice(28, 36)
_SIZE_BYTES = np.arange(4, dtype=np.int64)

_TAGS = MessageConst.PROPERTY_TAGS
_KEYS = MessageConst.PROPERTY_KEYS
_UNIQ_KEY = MessageConst.PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX
_RETRY_TOPIC = MessageConst.PROPERTY_RETRY_TOPIC


def find_record_starts(records: bytes, sizes: bytes = b"") -> np.ndarray:
    """Where each record of ``records`` starts (int64 array).

    Records follow each other, so each start depends on the previous record's
    size. The broker says each size (``sizes``, little-endian int32s, from its
    consume queue): their running sum gives every start, and one vectorised
    check that each record's own TOTALSIZE agrees proves it is the chain. Without
    them, when all records have the same size (fixed-size bodies and properties,
    common for telemetry) the same check on the multiples of the first size
    proves the chain. Otherwise a tight Python loop follows the sizes.
    """
    end = len(records)
    if end < HEADER_SIZE:
        if end:
            raise ValueError("a pull answered with a truncated record")
        return np.zeros(0, dtype=np.int64)
    if sizes and len(sizes) % 4 == 0:
        told = np.frombuffer(sizes, dtype="<i4").astype(np.int64)
        starts = np.zeros(len(told), dtype=np.int64)
        np.cumsum(told[:-1], out=starts[1:])
        if (int(starts[-1]) + int(told[-1]) == end and bool(np.all(told >= HEADER_SIZE + 4))
                and _sizes_at(records, starts, told)):
            return starts
    (first,) = _TOTAL_SIZE.unpack_from(records, 0)
    if first >= HEADER_SIZE + 4 and end % first == 0:
        starts = np.arange(0, end, first, dtype=np.int64)
        if _sizes_at(records, starts, first):
            return starts
    out: list[int] = []
    append = out.append
    unpack = _TOTAL_SIZE.unpack_from
    pos = 0
    while pos < end:
        append(pos)
        (total,) = unpack(records, pos)
        if total < HEADER_SIZE + 4:
            raise ValueError(f"corrupt record at byte {pos} of a pull: size {total}")
        pos += total
    if pos > end:
        raise ValueError("a pull answered with a truncated record")
    return np.asarray(out, dtype=np.int64)


def _sizes_at(records: bytes, starts: np.ndarray, expected: np.ndarray | int) -> bool:
    """Whether the TOTALSIZE at each of ``starts`` (all within ``records``) is ``expected``."""
    sizes = np.frombuffer(records, dtype=np.uint8)[starts[:, None] + _SIZE_BYTES]
    return bool(np.all(sizes.view("<i4").reshape(-1) == expected))


def _headers(records: bytes, starts: np.ndarray) -> np.ndarray:
    """The 80-byte headers, gathered into one ``(n, 80)`` uint8 array.

    One Arrow ``take`` over a binary view cut at (start, start + 80) pairs: a
    numpy fancy index would need an ``(n, 80)`` int64 index array (640 bytes of
    scratch per message).
    """
    n = len(starts)
    bounds = np.empty(2 * n, dtype=np.int64)
    bounds[0::2] = starts
    bounds[1::2] = starts + HEADER_SIZE
    if n and bounds[-1] > np.iinfo(np.int32).max:
        raise ValueError("a pull answered with more than 2 GiB of records")
    (spans,) = _spans(pa.py_buffer(records), bounds.astype(np.int32), n, 2, (0,), pa.binary())
    data = spans.buffers()[2]
    if data is None:
        return np.zeros((0, HEADER_SIZE), dtype=np.uint8)
    return np.frombuffer(data, dtype=np.uint8, count=n * HEADER_SIZE).reshape(n, HEADER_SIZE)


def _constant_strings(value: str, n: int) -> pa.Array:
    raw = value.encode()
    offsets = np.arange(0, (n + 1) * len(raw), len(raw) or 1, dtype=np.int32)[: n + 1]
    if not raw:
        offsets = np.zeros(n + 1, dtype=np.int32)
    return pa.StringArray.from_buffers(n, pa.py_buffer(offsets), pa.py_buffer(raw * n))


def _spans(data: pa.Buffer, bounds: np.ndarray, count: int, stride: int, pick: Sequence[int],
           as_type: pa.DataType) -> list[pa.Array]:
    """Arrays of the spans ``pick`` (indexes within each group of ``stride``
    spans) of a binary view over ``data`` cut at ``bounds`` (int32, increasing)."""
    n_spans = len(bounds) - 1
    cut = pa.Array.from_buffers(as_type, n_spans, [None, pa.py_buffer(bounds), data])
    out = []
    for k in pick:
        idx = np.arange(k, count * stride, stride, dtype=np.int64)
        out.append(cut.take(from_numpy(idx)))
    return out


def _lookup(entry_keys: pa.Array, entry_values: pa.Array, entry_record: np.ndarray,
            n: int, name: str) -> tuple[pa.Array, np.ndarray]:
    """Per record, the value of property ``name`` (null if absent), and a presence mask."""
    hits = indices_of(pc.equal(entry_keys, string_scalar(name)))
    index = np.full(n, -1, dtype=np.int64)
    index[entry_record[hits]] = hits
    present = index >= 0
    if present.all():
        return entry_values.take(from_numpy(index)), present
    return entry_values.take(from_numpy(index, mask=~present)), present


def decode_to_arrow(
    records: bytes,
    *,
    topic: str,
    broker_name: str,
    retry: bool,
    end_offset: int | None = None,
    sizes: bytes = b"",
    columns: tuple[str, ...] | None = None,
) -> pa.RecordBatch:
    """The rows of a pull's ``records`` (all from one queue of ``topic``).

    Args:
        records: the stored records, back to back.
        topic: the topic they were read from.
        broker_name: the broker that stores the queue.
        retry: whether ``topic`` is a ``%RETRY%`` topic: then the ``topic`` column
            holds each message's original topic (RETRY_TOPIC) and ``retry_topic``
            the retry topic.
        end_offset: rows at or beyond this queue offset are left out (a filtered
            pull may scan past the range it was asked for).
        sizes: each record's size as the broker said it (``PullBatch.record_sizes``),
            checked against the records; empty: found by following the records.
        columns: the columns the caller keeps (None: all); the others are left null
            (no properties are parsed when none of the kept columns comes from them).
    """
    schema = arrow_schema()
    if not records:
        return empty_batch()
    buf = np.frombuffer(records, dtype=np.uint8)
    starts = find_record_starts(records, sizes)
    header = _headers(records, starts)
    fields = header.view(_HEADER_DTYPE).reshape(-1)
    queue_offset = np.ascontiguousarray(fields["queue_offset"])
    if end_offset is not None and len(queue_offset) and queue_offset[-1] >= end_offset:
        keep = int(np.searchsorted(queue_offset, end_offset, side="left"))
        starts, header, fields = starts[:keep], header[:keep], fields[:keep]
        queue_offset = queue_offset[:keep]
    n = len(starts)
    if n == 0:
        return empty_batch()

    want_props = needs_properties(columns, retry=retry)
    picks = tuple(k for k, wanted in ((0, wants(columns, "body")), (2, want_props)) if wanted)
    spans: dict[int, pa.Array] = {}
    if picks:
        body_start = starts + HEADER_SIZE
        body_end = body_start + fields["body_len"].astype(np.int64)
        topic_len = buf[body_end].astype(np.int64) | (buf[body_end + 1].astype(np.int64) << 8)
        props_len_at = body_end + 2 + topic_len
        props_len = buf[props_len_at].astype(np.int64) | (buf[props_len_at + 1].astype(np.int64) << 8)
        props_start = props_len_at + 2
        props_end = props_start + props_len

        # One binary view over the whole pull: spans body_i, gap, props_i, gap ...
        bounds = np.empty(4 * n, dtype=np.int64)
        bounds[0::4] = body_start
        bounds[1::4] = body_end
        bounds[2::4] = props_start
        bounds[3::4] = props_end
        if bounds[-1] > np.iinfo(np.int32).max:
            raise ValueError("a pull answered with more than 2 GiB of records")
        cut = _spans(pa.py_buffer(records), bounds.astype(np.int32), n, 4, picks, pa.binary())
        spans = dict(zip(picks, cut, strict=True))
    body = spans.get(0, pa.nulls(n, pa.binary()))

    map_type = schema.field("properties").type
    string = pa.string()
    properties: pa.Array = pa.nulls(n, map_type)
    tags: pa.Array = pa.nulls(n, string)
    keys: pa.Array = pa.nulls(n, schema.field("keys").type)
    uniq: pa.Array | None = None  # UNIQ_KEY, null where absent
    all_uniq = False
    original: pa.Array | None = None  # RETRY_TOPIC
    if want_props:
        parsed = _properties(spans[2], n, map_type)
        if parsed is None:
            return _fallback(records, topic, broker_name, retry, end_offset)
        properties, keys_arr, values_arr, entry_record = parsed
        if wants(columns, "tags"):
            tags, _ = _lookup(keys_arr, values_arr, entry_record, n, _TAGS)
        if wants(columns, "msg_id"):
            uniq, has_uniq = _lookup(keys_arr, values_arr, entry_record, n, _UNIQ_KEY)
            all_uniq = bool(has_uniq.all())
        if wants(columns, "keys"):
            keys = _keys_column(keys_arr, values_arr, entry_record, n, schema.field("keys").type)
        if retry and wants(columns, "topic"):
            original, _ = _lookup(keys_arr, values_arr, entry_record, n, _RETRY_TOPIC)

    offset_msg_id: pa.Array = pa.nulls(n, string)
    if wants(columns, "offset_msg_id") or (uniq is not None and not all_uniq):
        # offset_msg_id: store host (8 bytes) + physical offset big-endian, in hex.
        raw_id = np.empty((n, 16), dtype=np.uint8)
        raw_id[:, :8] = header[:, _STORE_HOST]
        raw_id[:, 8:] = header[:, _PHY_BYTES][:, ::-1]
        offset_msg_id = pa.StringArray.from_buffers(
            n, pa.py_buffer(np.arange(0, 32 * (n + 1), 32, dtype=np.int32)),
            pa.py_buffer(binascii.hexlify(raw_id.data).upper()),
        )
    msg_id: pa.Array = pa.nulls(n, string)
    if uniq is not None:
        msg_id = uniq if all_uniq else pc.coalesce(uniq, offset_msg_id)

    topic_col = _constant_strings(topic, n)
    if retry:
        retry_col = topic_col
        if original is not None:
            topic_col = pc.coalesce(original, topic_col)
    else:
        retry_col = pa.nulls(n, string)

    ts_type = schema.field("born_timestamp").type
    out: list[Any] = [
        topic_col,
        from_numpy(fields["queue_id"], pa.int32()),
        _constant_strings(broker_name, n),
        from_numpy(queue_offset),
        msg_id,
        offset_msg_id,
        from_numpy(fields["phy"]),
        tags,
        keys,
        body,
        properties,
        from_numpy(fields["born"] * 1000, ts_type),
        from_numpy(fields["store_ts"] * 1000, ts_type),
        from_numpy(fields["reconsume"], pa.int32()),
        retry_col,
    ]
    return pa.RecordBatch.from_arrays(out, schema=schema)


def _properties(
    props: pa.Array, n: int, map_type: pa.DataType
) -> tuple[pa.Array, pa.Array, pa.Array, np.ndarray] | None:
    """The ``properties`` map column of ``props`` (``name\\x01value\\x02`` ..., one per record),
    with each entry's key, value and record for look-ups; None if they are not well formed
    or not UTF-8 (the caller's per-message decoder copes with both)."""
    props_data = props.buffers()[2]
    props_offsets = np.frombuffer(props.buffers()[1], dtype=np.int32, count=n + 1)
    flat = (
        np.frombuffer(props_data, dtype=np.uint8, count=int(props_offsets[-1]))
        if props_data is not None
        else np.zeros(0, dtype=np.uint8)
    )
    sep_name = np.flatnonzero(flat == 1)
    sep_entry = np.flatnonzero(flat == 2)
    entries = len(sep_entry)
    entry_start = np.empty(entries, dtype=np.int64)
    if entries:
        entry_start[0] = 0
        entry_start[1:] = sep_entry[:-1] + 1
    well_formed = (
        len(sep_name) == entries
        and (entries == 0 or sep_entry[-1] == len(flat) - 1)
        and bool(np.all(sep_name > entry_start - 1))
        and bool(np.all(sep_name < sep_entry))
        # every record's properties end with a separator (or are empty)
        and (
            len(flat) == 0
            or bool(
                np.all(
                    (props_offsets[1:] == props_offsets[:-1])
                    | (flat[np.maximum(props_offsets[1:] - 1, 0)] == 2)
                )
            )
        )
    )
    if not well_formed:
        return None

    map_offsets = np.searchsorted(sep_entry, props_offsets, side="left").astype(np.int32)
    per_record = np.diff(map_offsets)
    entry_record = np.repeat(np.arange(n, dtype=np.int64), per_record)
    if entries > 1 and _may_repeat_a_name(flat, entry_start, sep_name, entry_record,
                                          int(per_record.max())):
        return None
    if entries:
        cuts = np.empty(4 * entries + 1, dtype=np.int64)
        cuts[0:-1:4] = entry_start
        cuts[1::4] = sep_name
        cuts[2::4] = sep_name + 1
        cuts[3::4] = sep_entry
        cuts[-1] = len(flat)
        keys_arr, values_arr = _spans(
            props_data, cuts.astype(np.int32), entries, 4, (0, 2), pa.string()
        )
        if int(flat.max()) >= 0x80 and not _utf8(keys_arr, values_arr):
            # bytes that are not UTF-8 (stored before the broker refused them): an Arrow string
            # column must be UTF-8, so these rows take the decoder that replaces them (U+FFFD)
            return None
    else:
        keys_arr = values_arr = pa.nulls(0, pa.string())
    properties = pa.MapArray.from_arrays(
        from_numpy(map_offsets, pa.int32()), keys_arr, values_arr, type=map_type
    )
    return properties, keys_arr, values_arr, entry_record


_MAX_NAMES_COMPARED = 64


def _may_repeat_a_name(flat: np.ndarray, name_start: np.ndarray, name_end: np.ndarray,
                       entry_record: np.ndarray, most: int) -> bool:
    """Whether a record may name a property twice (a foreign producer's records can): a map
    column holding both would disagree with ``tags`` and the per-message decoder (the last
    value counts) and break Spark's map functions. Compares each name's length, first and last
    byte with the names after it in its record (~0.03 µs a record); a false alarm only costs
    the per-message decoder."""
    if most < 2:
        return False
    if most > _MAX_NAMES_COMPARED:
        return True
    key = (entry_record << 32) | ((name_end - name_start) << 16)
    key |= flat[name_start].astype(np.int64) << 8
    key |= flat[name_end - 1]
    return any(bool((key[d:] == key[:-d]).any()) for d in range(1, most))


def _utf8(*arrays: pa.Array) -> bool:
    """Whether every value of these string arrays is UTF-8 (Arrow checks it in C)."""
    try:
        for arr in arrays:
            arr.validate(full=True)
    except pa.ArrowInvalid:
        return False
    return True


def _keys_column(entry_keys: pa.Array, entry_values: pa.Array, entry_record: np.ndarray, n: int,
                 list_type: pa.DataType) -> pa.Array:
    """KEYS ("k1 k2") split into a list per record; an empty list where absent."""
    hits = indices_of(pc.equal(entry_keys, string_scalar(_KEYS)))
    if not len(hits):
        return pa.ListArray.from_arrays(
            from_numpy(np.zeros(n + 1), pa.int32()), pa.nulls(0, pa.string()), type=list_type
        )
    records = entry_record[hits]  # one KEYS a record: _properties sent repeated names elsewhere
    values = entry_values.take(from_numpy(hits))
    # an empty KEYS is no key (the per-message decoder's ()), not one empty key
    values = pc.if_else(pc.equal(pc.binary_length(values), _ZERO), null_scalar(pa.string()), values)
    split = pc.split_pattern(values, pattern=" ")
    lengths = np.zeros(n, dtype=np.int32)
    lengths[records] = to_numpy(pc.list_value_length(split).fill_null(_ZERO))
    offsets = np.zeros(n + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    return pa.ListArray.from_arrays(from_numpy(offsets, pa.int32()), split.flatten(), type=list_type)


def _fallback(
    records: bytes, topic: str, broker_name: str, retry: bool, end_offset: int | None
) -> pa.RecordBatch:
    from ..client.codec import decode_messages

    messages = decode_messages(records, broker_name)
    if end_offset is not None:
        messages = [m for m in messages if m.queue_offset < end_offset]
    return messages_to_batch(messages, read_from=topic, retry=retry)

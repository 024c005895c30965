"""The commit-log record layout on the client: decoding pulls, encoding batches to send."""

from __future__ import annotations

import gc
import struct
from array import array
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt
import pyarrow as pa
from pymq_proto.record import (
    HEADER,
    HEADER_SIZE,
    MAX_PROPERTIES_SIZE,
    MESSAGE_MAGIC_CODE,
    MessageConst,
    property_key,
    remove_property,
)

from ..errors import MessageIllegalError
from .message import MessageExt, RowKeys

__all__ = [
    "UNIQ_PREFIX", "decode_messages", "encode_records", "fixed_width", "uniq_first", "uniq_property_matrix",
]

UNIQ_PREFIX = property_key(MessageConst.PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX)
_U16 = struct.Struct("<H")
_NO_HOST = bytes(8)

_KEYS = MessageConst.PROPERTY_KEYS
_TAGS = MessageConst.PROPERTY_TAGS
_UNIQ = MessageConst.PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX


def decode_messages(records: bytes, broker_name: str) -> list[MessageExt]:
    """Every record in ``records`` (back to back, as the broker stored them)."""
    was_enabled = gc.isenabled()
    gc.disable()  # thousands of new objects and no cycle: no collection passes meanwhile
    try:
        return _decode(records, broker_name)
    finally:
        if was_enabled:
            gc.enable()


def _decode(records: bytes, broker_name: str) -> list[MessageExt]:
    out: list[MessageExt] = []
    append = out.append
    unpack = HEADER.unpack_from
    topics: dict[bytes, str] = {}
    hosts: dict[bytes, str] = {}
    pos, end = 0, len(records)
    while pos < end:
        (total, _magic, _crc, queue_id, flag, queue_offset, phy, _sys, born, stored, host,
         reconsume, _tx, body_len) = unpack(records, pos)
        b = pos + HEADER_SIZE
        t = b + body_len
        t1 = t + 2 + (records[t] | records[t + 1] << 8)
        p0 = t1 + 2
        p1 = p0 + (records[t1] | records[t1 + 1] << 8)
        raw_topic = records[t + 2 : t1]
        topic = topics.get(raw_topic)
        if topic is None:
            topic = topics[raw_topic] = raw_topic.decode("utf-8", "replace")
        host_hex = hosts.get(host)
        if host_hex is None:
            host_hex = hosts[host] = host.hex().upper()
        offset_id = f"{host_hex}{phy:016X}"  # = offset_msg_id(host, phy)
        props: dict[str, str] = {}
        if p1 > p0:
            # U+FFFD for bytes that are not UTF-8 (stored before the broker refused them)
            for item in records[p0:p1].decode("utf-8", "replace").split("\x02"):
                if item:
                    name, _, value = item.partition("\x01")
                    props[name] = value
        keys = props.get(_KEYS)
        append(MessageExt(
            topic, queue_id, broker_name, queue_offset, props.get(_UNIQ, offset_id), offset_id, phy,
            records[b:t], props.get(_TAGS),
            tuple(keys.split(MessageConst.KEY_SEPARATOR)) if keys else (), props, born, stored,
            reconsume, total, flag,
        ))
        pos += total
    return out


def encode_records(
    topic: str, bodies: Sequence[bytes], properties: Sequence[bytes],
    flags: Sequence[int] | None = None, born_timestamp: int = 0,
) -> tuple[bytes, array[int]]:
    """Record images of a pre-encoded batch (``EncodedBatch``): the records and their sizes.

    The broker fills the store's header fields (offsets, CRC, store time and
    host); ``properties[i]`` must begin with UNIQ_KEY (see :func:`uniq_first`).
    """
    topic_b = topic.encode()
    topic_part = _U16.pack(len(topic_b)) + topic_b
    fixed = HEADER_SIZE + len(topic_part) + 2
    pack, u16 = HEADER.pack, _U16.pack
    parts: list[bytes] = []
    sizes = array("i")
    add_size = sizes.append
    for i, body in enumerate(bodies):
        props = properties[i]
        if len(props) > MAX_PROPERTIES_SIZE:
            raise MessageIllegalError(
                f"message {i} of the batch: its properties (tags, keys and the others) are "
                f"{len(props)} bytes encoded, over RocketMQ's limit of {MAX_PROPERTIES_SIZE}"
            )
        size = fixed + len(body) + len(props)
        parts += (
            pack(size, MESSAGE_MAGIC_CODE, 0, 0, flags[i] if flags else 0, 0, 0, 0, born_timestamp, 0,
                 _NO_HOST, 0, 0, len(body)),
            body, topic_part, u16(len(props)), props,
        )
        add_size(size)
    return b"".join(parts), sizes


_HEX_PAIRS = np.array([list(b"%02X" % b) for b in range(256)], dtype=np.uint8)  # byte -> 2 hex digits


def uniq_property_matrix(keys: RowKeys) -> npt.NDArray[np.uint8]:
    """Row i is the property ``UNIQ_KEY\x01<keys[i]>\x02`` (all the same width), made with numpy.

    The row numbers' big-endian bytes index a table of two hex digits each (one gather,
    not a shift per digit).
    """
    head = UNIQ_PREFIX + keys.prefix.encode()
    n, digits = len(keys), keys.digits
    nbytes = (digits + 1) // 2
    rows = np.arange(keys.start, keys.start + n, dtype=">u8").view(np.uint8).reshape(n, 8)
    hexed = _HEX_PAIRS[rows[:, 8 - nbytes :]].reshape(n, 2 * nbytes)
    out = np.empty((n, len(head) + digits + 1), dtype=np.uint8)
    out[:, : len(head)] = np.frombuffer(head, dtype=np.uint8)
    out[:, len(head) : -1] = hexed[:, 2 * nbytes - digits :]
    out[:, -1] = 2
    return out


def uniq_first(properties: bytes, uniq_key: str) -> bytes:
    """``properties`` with UNIQ_KEY = ``uniq_key`` as the first property (the batch layout)."""
    head = UNIQ_PREFIX + uniq_key.encode() + b"\x02"
    if properties.startswith(head):
        return properties
    return head + remove_property(properties, UNIQ_PREFIX[:-1])


def fixed_width(mat: npt.NDArray[np.uint8]) -> pa.Array:
    """A binary array whose i-th value is row i of ``mat`` (no per-row object)."""
    n, width = mat.shape
    offsets = np.arange(0, n * width + 1, width, dtype=np.int32)
    return pa.Array.from_buffers(pa.binary(), n, [None, pa.py_buffer(offsets), pa.py_buffer(mat)])

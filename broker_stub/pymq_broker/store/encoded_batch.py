"""Record images of a put, checked and located with numpy (issue 5).

A producer may send a batch already in the commit log's layout (``EncodedBatch``
in pymq.proto): the broker then checks and completes the headers of all the
records at once instead of building each record in Python. Messages sent the
classic way (``MessageData``) are laid out the same way by :meth:`from_messages`,
so both reach the commit log and the dispatch as one :class:`EncodedRecords`.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt
from pymq_proto.record import HEADER_SIZE, MAX_PROPERTIES_SIZE, MESSAGE_MAGIC_CODE, find_property

if TYPE_CHECKING:
    from .commit_log import MessageToStore

__all__ = ["HEADER_DTYPE", "UNIQ_PREFIX", "EncodedRecords", "parse_encoded"]

HEADER_DTYPE = np.dtype([
    ("total", "<i4"), ("magic", "<i4"), ("crc", "<u4"), ("queue_id", "<i4"), ("flag", "<i4"),
    ("queue_offset", "<i8"), ("phy", "<i8"), ("sys_flag", "<i4"), ("born", "<i8"),
    ("store_ts", "<i8"), ("host", "S8"), ("reconsume", "<i4"), ("prepared_tx", "<i8"),
    ("body_len", "<i4"),
])
assert HEADER_DTYPE.itemsize == HEADER_SIZE

UNIQ_PREFIX = b"UNIQ_KEY\x01"
MAX_UNIQ_KEY = 128  # RocketMQ's are 32 hex digits; the bound keeps the search vectorized
_AR_HEADER = np.arange(HEADER_SIZE, dtype=np.int64)
_AR_PREFIX = np.arange(len(UNIQ_PREFIX), dtype=np.int64)
_AR_UNIQ = np.arange(MAX_UNIQ_KEY + 1, dtype=np.int64)
_U16 = struct.Struct("<H")
_ZERO_HEADER = bytes(HEADER_SIZE)

I64 = npt.NDArray[np.int64]


@dataclass(slots=True)
class EncodedRecords:
    """Records back to back in ``buf``; ``headers`` is a working copy of their headers.

    The commit log completes ``headers`` and writes them back into ``buf``.
    ``uniq_start``/``uniq_end`` locate each UNIQ_KEY value when known (a
    pre-encoded batch puts it first); else it is looked up when needed.
    """

    buf: bytearray
    offsets: I64
    sizes: I64
    headers: npt.NDArray[np.void]
    props_start: I64
    props_end: I64
    uniq_start: I64 | None = None
    uniq_end: I64 | None = None
    plain: bool = False  # every record's properties are its UNIQ_KEY alone

    def __len__(self) -> int:
        return len(self.offsets)

    @property
    def body_lens(self) -> npt.NDArray[np.int32]:
        return self.headers["body_len"]

    def properties(self, i: int) -> bytes:
        return bytes(self.buf[int(self.props_start[i]) : int(self.props_end[i])])

    def all_properties(self) -> list[bytes]:
        buf = self.buf
        return [bytes(buf[a:b]) for a, b in zip(self.props_start.tolist(), self.props_end.tolist(),
                                                 strict=True)]

    def contains(self, needle: bytes) -> bool:
        """Whether ``needle`` may occur in some record's properties (bodies may cause false hits)."""
        return not self.plain and needle in self.buf

    def uniq_hashes(self, seed: int) -> list[int]:
        """The index's key hash of each UNIQ_KEY (no key object made); needs the located keys."""
        assert self.uniq_start is not None and self.uniq_end is not None
        mv = memoryview(self.buf)
        crc = zlib.crc32
        try:
            return [crc(mv[a:b], seed) & 0x7FFFFFFF
                    for a, b in zip(self.uniq_start.tolist(), self.uniq_end.tolist(), strict=True)]
        finally:
            mv.release()

    def uniq_keys(self) -> list[bytes | None]:
        """Each record's UNIQ_KEY (None when it has none)."""
        if self.uniq_start is None or self.uniq_end is None:
            return [find_property(p, UNIQ_PREFIX[:-1]) or None for p in self.all_properties()]
        buf = self.buf
        return [bytes(buf[a:b]) for a, b in zip(self.uniq_start.tolist(), self.uniq_end.tolist(),
                                                 strict=True)]

    def select(self, keep: Sequence[int]) -> EncodedRecords:
        """Only the records at indexes ``keep`` (in order): the de-duplication window's cut."""
        idx = np.asarray(keep, dtype=np.int64)
        mv = memoryview(self.buf)
        offs, sizes = self.offsets[idx], self.sizes[idx]
        buf = bytearray(b"".join(mv[a : a + s] for a, s in zip(offs.tolist(), sizes.tolist(), strict=True)))
        new_offs = np.zeros(len(idx), dtype=np.int64)
        np.cumsum(sizes[:-1], out=new_offs[1:])
        shift = new_offs - offs
        return EncodedRecords(
            buf, new_offs, sizes, self.headers[idx], self.props_start[idx] + shift,
            self.props_end[idx] + shift,
            None if self.uniq_start is None else self.uniq_start[idx] + shift,
            None if self.uniq_end is None else self.uniq_end[idx] + shift,
            self.plain,
        )

    @classmethod
    def from_messages(cls, topic: str, messages: Sequence[MessageToStore]) -> EncodedRecords:
        """The classic path: lay ``messages`` out as records (store fields left to the commit log)."""
        topic_b = topic.encode()
        topic_part = _U16.pack(len(topic_b)) + topic_b
        n = len(messages)
        headers = np.zeros(n, dtype=HEADER_DTYPE)
        parts: list[bytes] = []
        sizes = np.empty(n, dtype=np.int64)
        body_lens = np.empty(n, dtype=np.int64)
        plens = np.empty(n, dtype=np.int64)
        fixed = HEADER_SIZE + len(topic_part) + 2
        for i, m in enumerate(messages):
            body, props = m.body, m.properties
            parts += (_ZERO_HEADER, body, topic_part, _U16.pack(len(props)), props)
            body_lens[i] = len(body)
            plens[i] = len(props)
            sizes[i] = fixed + len(body) + len(props)
        headers["total"] = sizes
        headers["flag"] = [m.flag for m in messages]
        headers["sys_flag"] = [m.sys_flag for m in messages]
        headers["born"] = [m.born_timestamp for m in messages]
        headers["reconsume"] = [m.reconsume_times for m in messages]
        headers["body_len"] = body_lens
        offsets = np.zeros(n, dtype=np.int64)
        np.cumsum(sizes[:-1], out=offsets[1:])
        props_end = offsets + sizes
        return cls(bytearray(b"".join(parts)), offsets, sizes, headers, props_end - plens, props_end)

    def message(self, i: int) -> tuple[bytes, int, bytes]:
        """(body, flag, properties) of record ``i``: for the paths that rewrite messages."""
        off = int(self.offsets[i])
        body = bytes(self.buf[off + HEADER_SIZE : off + HEADER_SIZE + int(self.body_lens[i])])
        return body, int(self.headers["flag"][i]), self.properties(i)


def _gather(arr: npt.NDArray[np.uint8], starts: I64, width: npt.NDArray[np.int64]) -> npt.NDArray[np.uint8]:
    out: npt.NDArray[np.uint8] = arr[starts[:, None] + width]
    return out


def _u16_at(arr: npt.NDArray[np.uint8], pos: I64) -> I64:
    return arr[pos].astype(np.int64) | (arr[pos + 1].astype(np.int64) << 8)


def parse_encoded(records: bytes, sizes_raw: bytes, topic: str) -> EncodedRecords:
    """Check and locate the records of an ``EncodedBatch``; ValueError naming what is wrong.

    Every check is over all records at once. The first bad record is named, with
    its index and byte position: a malformed batch is refused whole.
    """
    if not sizes_raw or len(sizes_raw) % 4:
        raise ValueError(
            f"encoded batch: sizes must be packed little-endian int32 values, one per record; "
            f"got {len(sizes_raw)} bytes"
        )
    sizes = np.frombuffer(sizes_raw, dtype="<i4").astype(np.int64)
    n = len(sizes)
    topic_b = topic.encode()
    min_size = HEADER_SIZE + 2 + len(topic_b) + 2 + len(UNIQ_PREFIX) + 2
    small = np.flatnonzero(sizes < min_size)
    if len(small):
        i = int(small[0])
        raise ValueError(
            f"encoded batch: sizes[{i}] = {int(sizes[i])} is below the smallest possible record "
            f"of {min_size} bytes for topic {topic!r}"
        )
    if int(sizes.sum()) != len(records):
        raise ValueError(
            f"encoded batch: the {n} sizes add up to {int(sizes.sum())} bytes but records holds "
            f"{len(records)} bytes"
        )
    offsets = np.zeros(n, dtype=np.int64)
    np.cumsum(sizes[:-1], out=offsets[1:])
    ends = offsets + sizes
    buf = bytearray(records)
    arr = np.frombuffer(buf, dtype=np.uint8)
    headers = _gather(arr, offsets, _AR_HEADER).view(HEADER_DTYPE).reshape(n)

    def fail(mask: npt.NDArray[np.bool_], what: str) -> None:
        bad = np.flatnonzero(mask)
        if len(bad):
            i = int(bad[0])
            raise ValueError(
                f"encoded batch: record {i} of {n} (at byte {int(offsets[i])}): "
                + what.format(i=i, h=headers[i], size=int(sizes[i]))
            )

    fail(headers["total"] != sizes, "TOTALSIZE {h[total]} differs from sizes[{i}] = {size}")
    fail(headers["magic"] != MESSAGE_MAGIC_CODE,
         f"MAGICCODE {{h[magic]}} is not MESSAGE_MAGIC_CODE {MESSAGE_MAGIC_CODE}")
    body_lens = headers["body_len"].astype(np.int64)
    fail((body_lens < 0) | (body_lens > sizes - min_size),
         "BODYLEN {h[body_len]} does not fit in a record of {size} bytes")
    t = offsets + HEADER_SIZE + body_lens
    fail(_u16_at(arr, t) != len(topic_b),
         f"its topic is not the request's topic {topic!r} (TOPICLEN differs)")
    if topic_b:
        topics = _gather(arr, t + 2, np.arange(len(topic_b), dtype=np.int64))
        fail((topics != np.frombuffer(topic_b, dtype=np.uint8)).any(axis=1),
             f"its topic is not the request's topic {topic!r}")
    p = t + 2 + len(topic_b)
    plen = _u16_at(arr, p)
    fail(p + 2 + plen != ends,
         "BODYLEN, TOPICLEN and PROPERTIESLEN do not add up to TOTALSIZE {size}")
    fail(plen > MAX_PROPERTIES_SIZE, f"properties are over the limit of {MAX_PROPERTIES_SIZE} bytes")
    props_start = p + 2
    prefix = _gather(arr, props_start, _AR_PREFIX)
    fail((prefix != np.frombuffer(UNIQ_PREFIX, dtype=np.uint8)).any(axis=1),
         "properties must begin with UNIQ_KEY")
    uniq_start = props_start + len(UNIQ_PREFIX)
    # the end of each UNIQ_KEY: first in a window that fits the usual 32 digits, then a wide one
    uniq_end = np.empty(n, dtype=np.int64)
    todo = np.arange(n)
    for width in (_AR_UNIQ[:33], _AR_UNIQ):
        window = np.minimum(uniq_start[todo, None] + width, len(arr) - 1)
        stops = (arr[window] == 2) & (window < ends[todo, None])
        found = stops.any(axis=1)
        uniq_end[todo] = uniq_start[todo] + stops.argmax(axis=1)
        todo = todo[~found]
        if not len(todo):
            break
    fail(np.isin(np.arange(n), todo),
         f"its UNIQ_KEY value does not end with \\x02 within {MAX_UNIQ_KEY} bytes")
    fail(uniq_end == uniq_start, "its UNIQ_KEY is empty")
    plain = bool((uniq_end + 1 == ends).all())
    return EncodedRecords(buf, offsets, sizes, headers, props_start, ends, uniq_start, uniq_end, plain)

"""Record images of a put, checked and located with numpy (issue 5).

A producer may send a batch already in the commit log's layout (``EncodedBatch``
in pymq.proto): the broker then checks and completes the headers of all the
records at once instead of building each record in Python. Messages sent the
classic way (``MessageData``) are laid out the same way by :meth:`from_messages`,
so both reach the commit log and the dispatch as one :class:`EncodedRecords`.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt
from pymq_proto.record import HEADER as _HEADER
from pymq_proto.record import (
    HEADER_DTYPE,
    HEADER_SIZE,
    MAX_PROPERTIES_SIZE,
    MESSAGE_MAGIC_CODE,
    MessageConst,
    find_property,
    property_key,
)

from .byte_windows import byte_windows
from .crc32_vector import crc32_slices

if TYPE_CHECKING:
    from .commit_log import MessageToStore

__all__ = [
    "HEADER_DTYPE", "SCALAR_MAX_RECORDS", "UNIQ_PREFIX", "EncodedRecords", "parse_encoded", "use_scalar",
]

UNIQ_PREFIX = property_key(MessageConst.PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX)
MAX_UNIQ_KEY = 128  # RocketMQ's are 32 hex digits; the bound keeps the search vectorized
_U16 = struct.Struct("<H")
_NO_HOST = bytes(8)

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
    # every record's properties back to back, and where each record's begin in it (made once)
    _props: tuple[bytes, I64] | None = field(default=None, repr=False, compare=False)

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
        """Whether ``needle`` may occur in some record's properties (one that spans two
        records' properties may cause a false hit)."""
        return not self.plain and needle in self._properties()[0]

    def _properties(self) -> tuple[bytes, I64]:
        """All properties back to back (a sixth of a 200-byte-body batch: each search scans
        that, not the bodies) and the position of each record's in it."""
        if self._props is None:
            lens = self.props_end - self.props_start
            width = int(lens[0]) if len(lens) else 0
            if width and (lens == width).all():  # one layout for the batch (the usual): rows
                rows = byte_windows(np.frombuffer(self.buf, dtype=np.uint8), width)
                blob = rows[self.props_start].tobytes()
            else:  # (a join of slices: 3.6x faster than a numpy gather of each byte)
                mv = memoryview(self.buf)
                blob = b"".join([mv[a:b] for a, b in zip(self.props_start.tolist(), self.props_end.tolist(),
                                                         strict=True)])
                mv.release()
            self._props = (blob, np.cumsum(lens) - lens)
        return self._props

    def property_values(self, key: bytes) -> tuple[I64, I64, I64, bytes]:
        """Each record's value of the property whose entry begins with ``key`` (name + 0x01,
        :func:`~pymq_proto.record.property_key`), as :func:`~pymq_proto.record.find_property`
        finds it (the last entry of that name), for all records at once.

        Returns ``(records, starts, ends, blob)``: the indexes of the records that have it, in
        order, and where each value lies in ``blob`` (all properties back to back).
        """
        empty = np.empty(0, dtype=np.int64)
        if self.plain or not len(self):
            return empty, empty, empty, b""
        blob, begins = self._properties()
        arr = np.frombuffer(blob, dtype=np.uint8)
        at = np.flatnonzero(arr == key[-1]) - (len(key) - 1)  # candidate entry starts
        at = at[at >= 0]
        for j, byte in enumerate(key[:-1]):
            at = at[arr[at + j] == byte]
        if not len(at):
            return empty, empty, empty, blob
        rec = np.searchsorted(begins, at, side="right") - 1
        ends = begins + (self.props_end - self.props_start)
        # an entry starts a record's properties or follows the 0x02 that ends the one before
        at_entry = (at == begins[rec]) | (arr[np.maximum(at - 1, 0)] == 2)
        # (the name's bytes themselves never span two records: a hit must fit in its record)
        fits = at + len(key) <= ends[rec]
        at, rec = at[at_entry & fits], rec[at_entry & fits]
        # a record's last hit (np.unique keeps the first of each: it reads them reversed)
        rec, last = np.unique(rec[::-1], return_index=True)
        starts = at[len(at) - 1 - last] + len(key)
        # the value ends at the next 0x02, or with its record's properties
        twos = np.append(np.flatnonzero(arr == 2), len(arr))
        stop = twos[np.searchsorted(twos, starts)]
        return rec, starts, np.minimum(stop, ends[rec]), blob

    def uniq_hashes(self, seed: int) -> npt.NDArray[np.uint32]:
        """The index's key hash of each UNIQ_KEY (no key object made); needs the located keys.

        Many keys of one width (the usual batch) are hashed together: :mod:`.crc32_vector`.
        """
        assert self.uniq_start is not None and self.uniq_end is not None
        return crc32_slices(self.buf, self.uniq_start, self.uniq_end, seed) & np.uint32(0x7FFFFFFF)

    def uniq_keys(self) -> list[bytes | None]:
        """Each record's UNIQ_KEY (None when it has none)."""
        if self.uniq_start is None or self.uniq_end is None:
            return [find_property(p, UNIQ_PREFIX[:-1]) or None for p in self.all_properties()]
        buf = self.buf
        return [bytes(buf[a:b]) for a, b in zip(self.uniq_start.tolist(), self.uniq_end.tolist(),
                                                 strict=True)]

    def select(self, keep: Sequence[int], *, topic: str | None = None, suffix: bytes = b"") -> EncodedRecords:
        """Only the records at indexes ``keep`` (in order), maybe re-addressed.

        The de-duplication window's cut; and the half messages, which are stored
        in another ``topic`` with ``suffix`` (REAL_TOPIC/REAL_QID) appended to
        their properties (the caller checks that they end with a whole entry).
        """
        idx = np.asarray(keep, dtype=np.int64)
        offs, sizes = self.offsets[idx], self.sizes[idx]
        props_start, props_end = self.props_start[idx], self.props_end[idx]
        body_end = offs + HEADER_SIZE + self.body_lens[idx].astype(np.int64)
        new_topic = b"" if topic is None else _U16.pack(len(topic.encode())) + topic.encode()
        mv = memoryview(self.buf)
        parts: list[memoryview | bytes] = []
        if topic is None and not suffix:
            parts = [mv[a : a + s] for a, s in zip(offs.tolist(), sizes.tolist(), strict=True)]
        else:
            for a, t, p, e in zip(offs.tolist(), body_end.tolist(), (props_start - 2).tolist(),
                                  props_end.tolist(), strict=True):
                parts += (mv[a:t], new_topic or mv[t:p], mv[p:e], suffix)
        buf = bytearray(b"".join(parts))
        mv.release()
        grow = (len(new_topic) - (props_start - 2 - body_end) if topic is not None else 0) + len(suffix)
        new_sizes = sizes + grow
        new_offs = np.zeros(len(idx), dtype=np.int64)
        np.cumsum(new_sizes[:-1], out=new_offs[1:])
        props_shift = new_offs - offs + grow - len(suffix)  # where each record's properties moved
        headers = self.headers[idx]
        headers["total"] = new_sizes
        new_props_start = props_start + props_shift
        if suffix:
            arr = np.frombuffer(buf, dtype=np.uint8)
            lens = _u16_at(arr, new_props_start - 2) + len(suffix)  # PROPERTIESLEN
            arr[new_props_start - 2] = lens & 0xFF
            arr[new_props_start - 1] = lens >> 8
        return EncodedRecords(
            buf, new_offs, new_sizes, headers, new_props_start, new_offs + new_sizes,
            None if self.uniq_start is None else self.uniq_start[idx] + props_shift,
            None if self.uniq_end is None else self.uniq_end[idx] + props_shift,
            self.plain and not suffix,
        )

    def first_not_utf8(self) -> tuple[int, UnicodeDecodeError] | None:
        """The first record whose properties are not UTF-8, and why; None when all are.

        RocketMQ's properties are Java strings: bytes that do not decode would make
        every reader of the queue fail (issue 17). One C pass finds the records
        with a byte >= 0x80 in their properties (ASCII is UTF-8); only those are
        decoded.
        """
        starts, ends = self.props_start, self.props_end
        n = len(self)
        mv = memoryview(self.buf)
        try:
            suspects: Sequence[int]
            if use_scalar(n, None) or int(starts[-1]) >= len(self.buf):
                suspects = range(n)
            else:  # maxima over [start, end) of each record's properties (and of the gaps between)
                bounds = np.empty(2 * n, dtype=np.int64)
                bounds[0::2], bounds[1::2] = starts, ends
                peaks = np.maximum.reduceat(np.frombuffer(self.buf, dtype=np.uint8), bounds[:-1])[0::2]
                suspects = np.flatnonzero(peaks >= 0x80).tolist()
            for i in suspects:
                try:
                    str(mv[int(starts[i]) : int(ends[i])], "utf-8")
                except UnicodeDecodeError as err:
                    return i, err
            return None
        finally:
            mv.release()

    def properties_end_whole(self) -> bool:
        """Whether every record's properties end with \\x02 (a whole entry): more can be appended."""
        arr = np.frombuffer(self.buf, dtype=np.uint8)
        return bool((self.props_end > self.props_start).all() and (arr[self.props_end - 1] == 2).all())

    def each_properties_hold_once(self, key: bytes, entry: bytes) -> bool:
        """Whether every record's properties hold ``key`` (a name + 0x01) once only, in ``entry``
        (two C searches each).

        Of a name given twice the last entry counts (:func:`~pymq_proto.record.find_property`):
        ``entry`` found among others of its name says nothing. (A value holding ``key`` is counted
        too: such a record goes the per-message path, which reads it exactly.)
        """
        buf = self.buf
        return all(buf.count(key, a, b) == 1 and buf.find(entry, a, b) >= 0
                   for a, b in zip(self.props_start.tolist(), self.props_end.tolist(), strict=True))

    @classmethod
    def from_messages(cls, topic: str, messages: Sequence[MessageToStore]) -> EncodedRecords:
        """The classic path: lay ``messages`` out as records (store fields left to the commit log)."""
        topic_b = topic.encode()
        topic_part = _U16.pack(len(topic_b)) + topic_b
        n = len(messages)
        heads: list[bytes] = []
        parts: list[bytes] = []
        sizes: list[int] = []
        plens: list[int] = []
        fixed = HEADER_SIZE + len(topic_part) + 2
        pack, u16 = _HEADER.pack, _U16.pack
        for m in messages:
            body, props = m.body, m.properties
            size = fixed + len(body) + len(props)
            head = pack(size, 0, 0, 0, m.flag, 0, 0, m.sys_flag, m.born_timestamp, 0, _NO_HOST,
                        m.reconsume_times, 0, len(body))
            heads.append(head)
            parts += (head, body, topic_part, u16(len(props)), props)
            sizes.append(size)
            plens.append(len(props))
        headers = np.frombuffer(bytearray(b"".join(heads)), dtype=HEADER_DTYPE)
        size_arr = np.array(sizes, dtype=np.int64)
        offsets = np.zeros(n, dtype=np.int64)
        np.cumsum(size_arr[:-1], out=offsets[1:])
        props_end = offsets + size_arr
        return cls(bytearray(b"".join(parts)), offsets, size_arr, headers,
                   props_end - np.array(plens, dtype=np.int64), props_end)

    def message(self, i: int) -> tuple[bytes, int, bytes]:
        """(body, flag, properties) of record ``i``: for the paths that rewrite messages."""
        off = int(self.offsets[i])
        body = bytes(self.buf[off + HEADER_SIZE : off + HEADER_SIZE + int(self.body_lens[i])])
        return body, int(self.headers["flag"][i]), self.properties(i)


def _gather(arr: npt.NDArray[np.uint8], starts: I64, width: int) -> npt.NDArray[np.uint8]:
    """``width`` bytes from each of ``starts``, as rows (no index array of n x width positions)."""
    out: npt.NDArray[np.uint8] = byte_windows(arr, width)[starts]
    return out


def _u16_at(arr: npt.NDArray[np.uint8], pos: I64) -> I64:
    return arr[pos].astype(np.int64) | (arr[pos + 1].astype(np.int64) << 8)


_UNIQ_WINDOW = MAX_UNIQ_KEY + 1
SCAN_BELOW_RECORD_BYTES = 3 * _UNIQ_WINDOW
"""Batches whose records average fewer bytes find the UNIQ_KEY ends by one scan of the buffer.

Larger records search a window of :data:`MAX_UNIQ_KEY` + 1 bytes each instead: a scan
reads every body byte (and keeps 8 bytes per 0x02 of a binary body), windows cost
n x 129 bytes. A 4 MiB parse, scan against windows (``benchmarks/bench_parse.py``):
200-byte text bodies 3.3 / 4.5 ms, 400-byte 1.7 / 1.8 (binary 3.1 / 1.8), 64 KB
0.8 / 0.24 (binary 2.4 / 0.24).
"""


def _uniq_ends(arr: npt.NDArray[np.uint8], uniq_start: I64, ends: I64) -> I64:
    """The first 0x02 at or after each of ``uniq_start``; where none is within
    :data:`MAX_UNIQ_KEY` bytes, a position the caller's bounds check refuses."""
    n = len(uniq_start)
    # The usual batch (a bulk writer's): keys of one width, the UNIQ_KEY alone or followed by
    # the same other properties (a tags column). Then only the keys' bytes need a look, not
    # every body byte: the first record's key width, checked for all.
    s0 = int(uniq_start[0])
    first = np.flatnonzero(arr[s0 : min(s0 + _UNIQ_WINDOW, int(ends[0]))] == 2)
    width = int(first[0]) if len(first) else 0
    stop = uniq_start + width
    if (0 < width <= MAX_UNIQ_KEY and bool((stop < ends).all()) and bool((arr[stop] == 2).all())
            and not (_gather(arr, uniq_start, width) == 2).any()):
        return stop
    if len(arr) < _UNIQ_WINDOW or len(arr) < n * SCAN_BELOW_RECORD_BYTES:
        stops = np.flatnonzero(arr == 2)
        if not len(stops):
            return np.full(n, -1, dtype=np.int64)
        found: I64 = stops[np.minimum(np.searchsorted(stops, uniq_start), len(stops) - 1)]
        return found
    # windows end inside the buffer: the last records' start earlier, their first bytes masked
    starts = np.minimum(uniq_start, len(arr) - _UNIQ_WINDOW)
    hits = _gather(arr, starts, _UNIQ_WINDOW) == 2
    hits &= np.arange(_UNIQ_WINDOW) >= (uniq_start - starts)[:, None]
    first = hits.argmax(axis=1)
    return np.where(hits[np.arange(n), first], starts + first, -1)


SCALAR_MAX_RECORDS = 32
"""Puts of at most this many records are checked and completed with struct, not numpy.

numpy's fixed cost per call (~1 µs, a few dozen calls per put) outweighs its
per-record gain below this: a put of n pre-encoded records (parse, checks, commit
log, index) took 30/47/87/139 µs scalar against 95/104/124/164 µs vector for
n = 1/4/16/32, even at 48 and ahead past 64 (BENCHMARKS.md, "Single messages").
"""


def use_scalar(n: int, scalar: bool | None) -> bool:
    """Whether a put of ``n`` records takes the scalar path (``scalar`` forces it either way)."""
    return n <= SCALAR_MAX_RECORDS if scalar is None else scalar


# What a malformed record breaks: one message per rule, for both paths.
_BAD_TOTAL = "TOTALSIZE {total} differs from sizes[{i}] = {size}"
_BAD_MAGIC = f"MAGICCODE {{magic}} is not MESSAGE_MAGIC_CODE {MESSAGE_MAGIC_CODE}"
_BAD_BODY_LEN = "BODYLEN {body_len} does not fit in a record of {size} bytes"
_BAD_TOPIC_LEN = "its topic is not the request's topic {topic!r} (TOPICLEN differs)"
_BAD_TOPIC = "its topic is not the request's topic {topic!r}"
_BAD_LENGTHS = "BODYLEN, TOPICLEN and PROPERTIESLEN do not add up to TOTALSIZE {size}"
_BAD_PROPS_SIZE = f"properties are over the limit of {MAX_PROPERTIES_SIZE} bytes"
_NO_UNIQ_FIRST = "properties must begin with UNIQ_KEY"
_UNIQ_NOT_ENDED = f"its UNIQ_KEY value does not end with \\x02 within {MAX_UNIQ_KEY} bytes"
_UNIQ_EMPTY = "its UNIQ_KEY is empty"


def _refuse(i: int, n: int, offset: int, what: str) -> ValueError:
    return ValueError(f"encoded batch: record {i} of {n} (at byte {offset}): {what}")


def parse_encoded(
    records: bytes, sizes_raw: bytes, topic: str, *, scalar: bool | None = None
) -> EncodedRecords:
    """Check and locate the records of an ``EncodedBatch``; ValueError naming what is wrong.

    Each check runs over all records before the next (a malformed batch is refused
    whole, naming the first bad record with its index and byte position). Up to
    :data:`SCALAR_MAX_RECORDS` records (or as ``scalar`` says) the checks are
    plain Python, else numpy over all records at once: same rules, same messages.
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
    too_small = np.flatnonzero(sizes < min_size)
    if len(too_small):
        small = int(too_small[0])
        raise ValueError(
            f"encoded batch: sizes[{small}] = {int(sizes[small])} is below the smallest possible record "
            f"of {min_size} bytes for topic {topic!r}"
        )
    total = int(sizes.sum())
    if total != len(records):
        raise ValueError(
            f"encoded batch: the {n} sizes add up to {total} bytes but records holds "
            f"{len(records)} bytes"
        )
    buf = bytearray(records)
    if use_scalar(n, scalar):
        return _parse_scalar(buf, sizes.tolist(), topic, min_size)
    return _parse_vector(buf, sizes, topic, min_size)


def _parse_scalar(buf: bytearray, sizes: list[int], topic: str, min_size: int) -> EncodedRecords:
    """:func:`parse_encoded` for a few records: struct, no numpy call per check."""
    n = len(sizes)
    topic_b = topic.encode()
    offsets = [0] * n
    for i in range(1, n):
        offsets[i] = offsets[i - 1] + sizes[i - 1]
    heads = [_HEADER.unpack_from(buf, o) for o in offsets]

    def fail(bad: list[bool], what: str) -> None:
        if True in bad:
            i = bad.index(True)
            raise _refuse(i, n, offsets[i], what.format(
                i=i, size=sizes[i], total=heads[i][0], magic=heads[i][1], body_len=heads[i][13], topic=topic,
            ))

    fail([h[0] != s for h, s in zip(heads, sizes, strict=True)], _BAD_TOTAL)
    fail([h[1] != MESSAGE_MAGIC_CODE for h in heads], _BAD_MAGIC)
    fail([not 0 <= h[13] <= s - min_size for h, s in zip(heads, sizes, strict=True)], _BAD_BODY_LEN)
    t = [o + HEADER_SIZE + h[13] for o, h in zip(offsets, heads, strict=True)]
    fail([_U16.unpack_from(buf, x)[0] != len(topic_b) for x in t], _BAD_TOPIC_LEN)
    if topic_b:
        fail([buf[x + 2 : x + 2 + len(topic_b)] != topic_b for x in t], _BAD_TOPIC)
    p = [x + 2 + len(topic_b) for x in t]
    plen = [_U16.unpack_from(buf, x)[0] for x in p]
    ends = [o + s for o, s in zip(offsets, sizes, strict=True)]
    fail([x + 2 + pl != e for x, pl, e in zip(p, plen, ends, strict=True)], _BAD_LENGTHS)
    fail([pl > MAX_PROPERTIES_SIZE for pl in plen], _BAD_PROPS_SIZE)
    props_start = [x + 2 for x in p]
    fail([buf[x : x + len(UNIQ_PREFIX)] != UNIQ_PREFIX for x in props_start], _NO_UNIQ_FIRST)
    uniq_start = [x + len(UNIQ_PREFIX) for x in props_start]
    uniq_end = [buf.find(2, u, min(u + MAX_UNIQ_KEY + 1, e)) for u, e in zip(uniq_start, ends, strict=True)]
    fail([u < 0 for u in uniq_end], _UNIQ_NOT_ENDED)
    fail([u == s for u, s in zip(uniq_end, uniq_start, strict=True)], _UNIQ_EMPTY)
    head_bytes = bytearray(b"".join(buf[o : o + HEADER_SIZE] for o in offsets))
    headers = np.frombuffer(head_bytes, dtype=HEADER_DTYPE)
    plain = all(u + 1 == e for u, e in zip(uniq_end, ends, strict=True))
    return EncodedRecords(
        buf, np.array(offsets, dtype=np.int64), np.array(sizes, dtype=np.int64), headers,
        np.array(props_start, dtype=np.int64), np.array(ends, dtype=np.int64),
        np.array(uniq_start, dtype=np.int64), np.array(uniq_end, dtype=np.int64), plain,
    )


def _parse_vector(buf: bytearray, sizes: I64, topic: str, min_size: int) -> EncodedRecords:
    """:func:`parse_encoded` for many records: every check over all records at once."""
    n = len(sizes)
    topic_b = topic.encode()
    offsets = np.zeros(n, dtype=np.int64)
    np.cumsum(sizes[:-1], out=offsets[1:])
    ends = offsets + sizes
    arr = np.frombuffer(buf, dtype=np.uint8)
    headers = _gather(arr, offsets, HEADER_SIZE).view(HEADER_DTYPE).reshape(n)

    def fail(mask: npt.NDArray[np.bool_], what: str) -> None:
        bad = np.flatnonzero(mask)
        if len(bad):
            i = int(bad[0])
            h = headers[i]
            raise _refuse(i, n, int(offsets[i]), what.format(
                i=i, size=int(sizes[i]), total=int(h["total"]), magic=int(h["magic"]),
                body_len=int(h["body_len"]), topic=topic,
            ))

    fail(headers["total"] != sizes, _BAD_TOTAL)
    fail(headers["magic"] != MESSAGE_MAGIC_CODE, _BAD_MAGIC)
    body_lens = headers["body_len"].astype(np.int64)
    fail((body_lens < 0) | (body_lens > sizes - min_size), _BAD_BODY_LEN)
    t = offsets + HEADER_SIZE + body_lens
    fail(_u16_at(arr, t) != len(topic_b), _BAD_TOPIC_LEN)
    if topic_b:
        topics = _gather(arr, t + 2, len(topic_b))
        fail((topics != np.frombuffer(topic_b, dtype=np.uint8)).any(axis=1), _BAD_TOPIC)
    p = t + 2 + len(topic_b)
    plen = _u16_at(arr, p)
    fail(p + 2 + plen != ends, _BAD_LENGTHS)
    fail(plen > MAX_PROPERTIES_SIZE, _BAD_PROPS_SIZE)
    props_start = p + 2
    prefix = _gather(arr, props_start, len(UNIQ_PREFIX))
    fail((prefix != np.frombuffer(UNIQ_PREFIX, dtype=np.uint8)).any(axis=1), _NO_UNIQ_FIRST)
    uniq_start = props_start + len(UNIQ_PREFIX)
    uniq_end = _uniq_ends(arr, uniq_start, ends)
    fail((uniq_end < uniq_start) | (uniq_end >= np.minimum(uniq_start + MAX_UNIQ_KEY + 1, ends)),
         _UNIQ_NOT_ENDED)
    fail(uniq_end == uniq_start, _UNIQ_EMPTY)
    plain = bool((uniq_end + 1 == ends).all())
    return EncodedRecords(buf, offsets, sizes, headers, props_start, ends, uniq_start, uniq_end, plain)

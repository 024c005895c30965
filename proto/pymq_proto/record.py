"""The commit-log record: how a stored message is laid out, on disk and on the wire.

A pull is answered with records exactly as the broker stored them (as RocketMQ
does), so the broker copies bytes and the client decodes. All integers are
little-endian.

======  =========================  ======================================
offset  field                      notes
======  =========================  ======================================
0       TOTALSIZE        int32     whole record, header included
4       MAGICCODE        int32     MESSAGE_MAGIC_CODE, or BLANK_MAGIC_CODE
8       BODYCRC          uint32    crc32 of everything after the header
12      QUEUEID          int32
16      FLAG             int32
20      QUEUEOFFSET      int64     index in the consume queue
28      PHYSICALOFFSET   int64     position in the commit log
36      SYSFLAG          int32
40      BORNTIMESTAMP    int64     ms, set by the producer
48      STORETIMESTAMP   int64     ms, set by the broker
56      STOREHOST        8 bytes   IPv4 (4) + port (big-endian int32)
64      RECONSUMETIMES   int32
68      PREPAREDTXOFFSET int64
76      BODYLEN          int32
80      body             BODYLEN   then TOPICLEN uint16, topic (utf-8),
                                   PROPERTIESLEN uint16, properties
======  =========================  ======================================

BODYCRC covers body, topic and properties (RocketMQ's covers the body only):
together with MAGICCODE and PHYSICALOFFSET matching the record's position it
lets recovery tell a torn or corrupt tail from a good record.

Properties use RocketMQ's encoding: ``name 0x01 value 0x02`` repeated.
"""

from __future__ import annotations

import functools
import re
import socket
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .crc32 import crc32

if TYPE_CHECKING:
    import numpy as np

__all__ = [
    "BLANK_MAGIC_CODE",
    "HEADER",
    "HEADER_DTYPE",
    "HEADER_SIZE",
    "MAX_PROPERTIES_SIZE",
    "MAX_REASON_CHARS",
    "MAX_TOPIC_BYTES",
    "MESSAGE_MAGIC_CODE",
    "MessageConst",
    "RecordHeader",
    "decode_properties",
    "encode_properties",
    "encode_record",
    "find_property",
    "offset_msg_id",
    "parse_offset_msg_id",
    "property_key",
    "remove_property",
    "store_host_bytes",
    "tag_hash",
]

MESSAGE_MAGIC_CODE = -626843481  # RocketMQ's MESSAGE_MAGIC_CODE
BLANK_MAGIC_CODE = -875286124  # RocketMQ's BLANK_MAGIC_CODE: padding at a file's end

HEADER = struct.Struct("<iiIiiqqiqq8siqi")
HEADER_SIZE = HEADER.size  # 80
_BLANK_HEAD = struct.Struct("<ii")  # TOTALSIZE, MAGICCODE: all a blank end-of-file record must hold
_U16 = struct.Struct("<H")
MAX_PROPERTIES_SIZE = 32767  # RocketMQ stores the properties length in a short
# a send back's extra properties (a failure reason, a traceback) keep this many characters, so that
# the copy's properties stay within MAX_PROPERTIES_SIZE: the broker's send back and the client's
# direct copy to %RETRY% cut them alike
MAX_REASON_CHARS = 4000
MAX_TOPIC_BYTES = 65535

# Field indexes of HEADER.unpack(...)
TOTALSIZE, MAGICCODE, BODYCRC, QUEUEID, FLAG, QUEUEOFFSET, PHYSICALOFFSET = range(7)
SYSFLAG, BORNTIMESTAMP, STORETIMESTAMP, STOREHOST, RECONSUMETIMES = range(7, 12)
PREPAREDTXOFFSET, BODYLEN = 12, 13

RecordHeader = tuple[int, int, int, int, int, int, int, int, int, int, bytes, int, int, int]

# HEADER as a numpy record, for the code that reads or completes many headers at once
HEADER_DTYPE: np.dtype[np.void]


def __getattr__(name: str) -> Any:
    # numpy (~60 ms to import) loads with the first user of HEADER_DTYPE: Spark's short-lived
    # Python processes that only parse options or build a schema import this module too
    if name == "HEADER_DTYPE":
        import numpy

        dtype = numpy.dtype([
            ("total", "<i4"), ("magic", "<i4"), ("crc", "<u4"), ("queue_id", "<i4"), ("flag", "<i4"),
            ("queue_offset", "<i8"), ("phy", "<i8"), ("sys_flag", "<i4"), ("born", "<i8"),
            ("store_ts", "<i8"), ("host", "S8"), ("reconsume", "<i4"), ("prepared_tx", "<i8"),
            ("body_len", "<i4"),
        ])
        assert dtype.itemsize == HEADER_SIZE
        globals()[name] = dtype
        return dtype
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

NAME_VALUE_SEPARATOR = "\x01"
PROPERTY_SEPARATOR = "\x02"


class MessageConst:
    """RocketMQ's property names (org.apache.rocketmq.common.message.MessageConst)."""

    PROPERTY_KEYS = "KEYS"
    PROPERTY_TAGS = "TAGS"
    PROPERTY_DELAY_TIME_LEVEL = "DELAY"
    PROPERTY_TIMER_DELIVER_MS = "TIMER_DELIVER_MS"  # RocketMQ 5: deliver at this time (epoch ms)
    PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX = "UNIQ_KEY"
    PROPERTY_RETRY_TOPIC = "RETRY_TOPIC"
    PROPERTY_REAL_TOPIC = "REAL_TOPIC"
    PROPERTY_REAL_QUEUE_ID = "REAL_QID"
    PROPERTY_ORIGIN_MESSAGE_ID = "ORIGIN_MESSAGE_ID"
    PROPERTY_RECONSUME_TIME = "RECONSUME_TIME"
    PROPERTY_MAX_RECONSUME_TIMES = "MAX_RECONSUME_TIMES"
    PROPERTY_TRANSACTION_PREPARED = "TRAN_MSG"
    PROPERTY_PRODUCER_GROUP = "PGROUP"
    PROPERTY_SHARDING_KEY = "__SHARDINGKEY"
    PROPERTY_DLQ_ORIGIN_TOPIC = "DLQ_ORIGIN_TOPIC"
    PROPERTY_DLQ_ORIGIN_MESSAGE_ID = "DLQ_ORIGIN_MESSAGE_ID"
    PROPERTY_TRANSACTION_CHECK_TIMES = "TRANSACTION_CHECK_TIMES"
    PROPERTY_WAIT_STORE_MSG_OK = "WAIT"
    PROPERTY_CLUSTER = "CLUSTER"  # stamped by RocketMQ's broker on every message it stores
    PROPERTY_MSG_REGION = "MSG_REGION"
    PROPERTY_TRACE_SWITCH = "TRACE_ON"
    # pymq: why a message was sent back (kept on its dead letter)
    PROPERTY_CONSUME_FAILURE_REASON = "CONSUME_FAILURE_REASON"
    PROPERTY_CONSUME_FAILURE_EXCEPTION = "CONSUME_FAILURE_EXCEPTION"
    PROPERTY_CONSUME_FAILURE_STAGE = "CONSUME_FAILURE_STAGE"
    PROPERTY_CONSUME_FAILURE_QUERY_ID = "CONSUME_FAILURE_QUERY_ID"
    PROPERTY_CONSUME_FAILURE_BATCH_ID = "CONSUME_FAILURE_BATCH_ID"
    # pymq: "<queryId>:<batchId>:<transaction>" of a row written by the exactly-once sink
    PROPERTY_SINK_TRANSACTION = "PYMQ_SINK_TXN"
    # RocketMQ's broker: a half message's UNIQ_KEY once more (kept by the committed message);
    # not in STRING_HASH_SET, so a user may set it, but not a user's property when read
    PROPERTY_TRANSACTION_ID = "__transactionId__"
    KEY_SEPARATOR = " "

    SYSTEM_PROPERTIES = frozenset(
        {
            PROPERTY_KEYS,
            PROPERTY_TAGS,
            PROPERTY_DELAY_TIME_LEVEL,
            PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX,
            PROPERTY_RETRY_TOPIC,
            PROPERTY_REAL_TOPIC,
            PROPERTY_REAL_QUEUE_ID,
            PROPERTY_ORIGIN_MESSAGE_ID,
            PROPERTY_RECONSUME_TIME,
            PROPERTY_MAX_RECONSUME_TIMES,
            PROPERTY_TRANSACTION_PREPARED,
            PROPERTY_PRODUCER_GROUP,
            PROPERTY_SHARDING_KEY,
            PROPERTY_DLQ_ORIGIN_TOPIC,
            PROPERTY_DLQ_ORIGIN_MESSAGE_ID,
            PROPERTY_TRANSACTION_CHECK_TIMES,
            PROPERTY_WAIT_STORE_MSG_OK,
            PROPERTY_CLUSTER,
            PROPERTY_MSG_REGION,
            PROPERTY_TRACE_SWITCH,
            PROPERTY_CONSUME_FAILURE_REASON,
            PROPERTY_CONSUME_FAILURE_EXCEPTION,
            PROPERTY_CONSUME_FAILURE_STAGE,
            PROPERTY_CONSUME_FAILURE_QUERY_ID,
            PROPERTY_CONSUME_FAILURE_BATCH_ID,
            PROPERTY_SINK_TRANSACTION,
            PROPERTY_TRANSACTION_ID,
        }
    )
    # what the broker sets on a message it sends back (so not for a consumer's reason to set)
    SEND_BACK_PROPERTIES = frozenset(
        {
            PROPERTY_RETRY_TOPIC,
            PROPERTY_ORIGIN_MESSAGE_ID,
            PROPERTY_DELAY_TIME_LEVEL,
            PROPERTY_REAL_TOPIC,
            PROPERTY_REAL_QUEUE_ID,
            PROPERTY_RECONSUME_TIME,
            PROPERTY_MAX_RECONSUME_TIMES,
            PROPERTY_DLQ_ORIGIN_TOPIC,
            PROPERTY_DLQ_ORIGIN_MESSAGE_ID,
            PROPERTY_WAIT_STORE_MSG_OK,
        }
    )
    # RocketMQ's STRING_HASH_SET (Message.putUserProperty refuses these names), with the ones
    # pymq's broker reads too: a user property of one of these names changes what the broker
    # does with the message (TRAN_MSG=true makes it a half message no one ends...).
    STRING_HASH_SET = frozenset(
        {
            PROPERTY_TRACE_SWITCH, PROPERTY_MSG_REGION, PROPERTY_KEYS, PROPERTY_TAGS,
            PROPERTY_WAIT_STORE_MSG_OK, PROPERTY_DELAY_TIME_LEVEL, PROPERTY_RETRY_TOPIC,
            PROPERTY_REAL_TOPIC, PROPERTY_REAL_QUEUE_ID, PROPERTY_TRANSACTION_PREPARED,
            PROPERTY_PRODUCER_GROUP, "MIN_OFFSET", "MAX_OFFSET", "BUYER_ID", PROPERTY_ORIGIN_MESSAGE_ID,
            "TRANSFER_FLAG", "CORRECTION_FLAG", "MQ2_FLAG", PROPERTY_RECONSUME_TIME,
            PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX, PROPERTY_MAX_RECONSUME_TIMES, "CONSUME_START_TIME",
            "POP_CK", "POP_CK_OFFSET", "1ST_POP_TIME", "TRAN_PREPARED_QUEUE_OFFSET", "DUP_INFO",
            "EXTEND_UNIQ_INFO", "INSTANCE_ID", "CORRELATION_ID", "REPLY_TO_CLIENT", "TTL", "ARRIVE_TIME",
            "PUSH_REPLY_TIME", PROPERTY_CLUSTER, "MSG_TYPE", "INNER_MULTI_QUEUE_OFFSET", "TIMER_DELAY_SEC",
            PROPERTY_TIMER_DELIVER_MS, "TIMER_ENQUEUE_MS", "TIMER_DEQUEUE_MS", "TIMER_ROLL_TIMES",
            "TIMER_OUT_MS", "TIMER_DEL_UNIQKEY", "TIMER_DELAY_LEVEL", "__BORNHOST", "BORN_TIMESTAMP",
            "TIMER_DELAY_MS", "__CRC32#",
            # pymq's broker sets or reads these as well
            PROPERTY_SHARDING_KEY, PROPERTY_TRANSACTION_CHECK_TIMES, PROPERTY_DLQ_ORIGIN_TOPIC,
            PROPERTY_DLQ_ORIGIN_MESSAGE_ID, PROPERTY_SINK_TRANSACTION,
        }
    )
    # what is never a user's property when read (MessageExt.user_properties, the v2 service's
    # user_properties): RocketMQ's STRING_HASH_SET (GrpcConverter.buildUserAttributes), pymq's
    # system properties, and the v2 trace context and batch count, which have fields of their own
    NOT_USER_PROPERTIES = frozenset({*STRING_HASH_SET, *SYSTEM_PROPERTIES, "TRACE_CONTEXT", "INNER_NUM"})


def encode_properties(props: Mapping[str, str]) -> bytes:
    """RocketMQ's messageProperties2String, as utf-8 bytes."""
    if not props:
        return b""
    return "".join(
        f"{k}{NAME_VALUE_SEPARATOR}{v}{PROPERTY_SEPARATOR}" for k, v in props.items()
    ).encode()


def decode_properties(raw: bytes) -> dict[str, str]:
    """RocketMQ's string2messageProperties.

    Bytes that are not UTF-8 become U+FFFD, as Java's ``new String(bytes, UTF_8)``: the
    broker refuses them at send, but a record stored before must not fail its readers.
    """
    if not raw:
        return {}
    out: dict[str, str] = {}
    for item in raw.decode("utf-8", "replace").split(PROPERTY_SEPARATOR):
        if item:
            name, _, value = item.partition(NAME_VALUE_SEPARATOR)
            out[name] = value
    return out


def property_key(name: str) -> bytes:
    """How ``name``'s entry begins (``name 0x01``): what byte searches of encoded properties look for."""
    return (name + NAME_VALUE_SEPARATOR).encode()


def find_property(raw: bytes, name: bytes) -> bytes | None:
    """One property's value without decoding the rest (the broker's hot path).

    ``name`` is the encoded property name, e.g. ``b"TAGS"``. Of a name given twice the last
    entry is the value, as :func:`decode_properties` and RocketMQ's string2messageProperties
    (a HashMap) read it: whatever reads a property (an authorization check, the store, a
    check-back) reads the same value.
    """
    if not raw:
        return None
    needle = name + b"\x01"
    i = raw.rfind(needle)
    while i > 0 and raw[i - 1] != 2:  # must start an entry, not end a value
        i = raw.rfind(needle, 0, i)  # (two hits never overlap: 0x01 ends the needle only)
    if i < 0:
        return None
    start = i + len(needle)
    end = raw.find(b"\x02", start)
    return raw[start:] if end < 0 else raw[start:end]


def remove_property(raw: bytes, name: bytes) -> bytes:
    """``raw`` without the property ``name`` (the broker's hot path: no decoding)."""
    needle = name + b"\x01"
    i = raw.find(needle)
    while i > 0 and raw[i - 1] != 2:
        i = raw.find(needle, i + 1)
    if i < 0:
        return raw
    end = raw.find(b"\x02", i)
    return raw[:i] + (raw[end + 1 :] if end >= 0 else b"")


@dataclass(frozen=True, slots=True)
class NamedEntries:
    """The entries of encoded properties called one of some names (see :func:`entries_named`).

    For the broker's rewrites of stored properties: :meth:`values` reads them and
    :meth:`cut` removes them, one C call each, the rest left undecoded. The
    pattern begins with the separator \\x02 so that the regex engine jumps from
    one entry to the next; the properties are searched with one put in front.
    """

    pattern: re.Pattern[bytes]

    def values(self, raw: bytes) -> dict[bytes, bytes]:
        """name -> value of the entries found (the last one of a repeated name)."""
        return dict(self.pattern.findall(b"\x02" + raw))

    def cut(self, raw: bytes) -> bytes:
        """``raw`` without those entries."""
        return self.pattern.sub(b"", b"\x02" + raw)[1:]


@functools.lru_cache(maxsize=64)
def entries_named(names: tuple[str, ...]) -> NamedEntries:
    """The :class:`NamedEntries` of ``names`` (compiled once per set of names)."""
    alternatives = b"|".join(re.escape(n.encode()) for n in names)
    return NamedEntries(re.compile(rb"\x02(" + alternatives + rb")\x01([^\x02]*)(?=\x02|$)"))


def tag_hash(tags: bytes | None) -> int:
    """The consume queue's tag hash code (stable across processes)."""
    return crc32(tags) if tags else 0


def store_host_bytes(host: str, port: int) -> bytes:
    """STOREHOST: 4 bytes of IPv4 address and the port."""
    try:
        ip = socket.inet_aton(socket.gethostbyname(host))
    except OSError:
        ip = b"\x7f\x00\x00\x01"
    return ip + struct.pack(">i", port)


def offset_msg_id(store_host: bytes, physical_offset: int) -> str:
    """RocketMQ's offsetMsgId: store host and physical offset, as 32 hex digits."""
    return (store_host + struct.pack(">q", physical_offset)).hex().upper()


def parse_offset_msg_id(msg_id: str) -> tuple[str, int, int]:
    """(ip, port, physical offset) of an offsetMsgId; ValueError if it is not one."""
    try:
        raw = bytes.fromhex(msg_id)
    except ValueError:
        raw = b""
    if len(raw) != 16:
        raise ValueError(
            f"msg id {msg_id!r} is not an offsetMsgId (expected 32 hex digits: "
            "store host and physical offset)"
        )
    ip = socket.inet_ntoa(raw[:4])
    (port,) = struct.unpack(">i", raw[4:8])
    (phy,) = struct.unpack(">q", raw[8:])
    return ip, port, phy


def encode_record(
    *,
    topic: bytes,
    queue_id: int,
    flag: int,
    body: bytes,
    properties: bytes,
    queue_offset: int,
    physical_offset: int,
    sys_flag: int,
    born_timestamp: int,
    store_timestamp: int,
    store_host: bytes,
    reconsume_times: int,
    prepared_tx_offset: int = 0,
) -> bytes:
    """One stored record (the broker's single-message path; batches inline this)."""
    tail = b"".join(
        (body, _U16.pack(len(topic)), topic, _U16.pack(len(properties)), properties)
    )
    return (
        HEADER.pack(
            HEADER_SIZE + len(tail),
            MESSAGE_MAGIC_CODE,
            crc32(tail),
            queue_id,
            flag,
            queue_offset,
            physical_offset,
            sys_flag,
            born_timestamp,
            store_timestamp,
            store_host,
            reconsume_times,
            prepared_tx_offset,
            len(body),
        )
        + tail
    )


def split_tail(record: bytes | memoryview, pos: int, total: int, body_len: int) -> tuple[int, int, int, int]:
    """(topic start, topic end, properties start, properties end) inside ``record``."""
    t = pos + HEADER_SIZE + body_len
    (tlen,) = _U16.unpack_from(record, t)
    p = t + 2 + tlen
    (plen,) = _U16.unpack_from(record, p)
    return t + 2, t + 2 + tlen, p + 2, p + 2 + plen


def record_is_valid(buf: bytes | memoryview, pos: int, expected_physical_offset: int) -> int:
    """Size of the good record at ``pos``, 0 for a blank end-of-file marker, -1 if torn/corrupt."""
    if pos + 8 > len(buf):
        return -1
    # a segment's blank end-of-file record may be 8 bytes only (RocketMQ's END_FILE_MIN_BLANK_LENGTH)
    total, magic = _BLANK_HEAD.unpack_from(buf, pos)
    if magic == BLANK_MAGIC_CODE:
        return 0
    if pos + HEADER_SIZE > len(buf):
        return -1
    h = HEADER.unpack_from(buf, pos)
    if magic != MESSAGE_MAGIC_CODE or total < HEADER_SIZE + 4 or pos + total > len(buf):
        return -1
    if h[PHYSICALOFFSET] != expected_physical_offset or h[BODYLEN] < 0:
        return -1
    if HEADER_SIZE + h[BODYLEN] + 4 > total:
        return -1
    if crc32(buf[pos + HEADER_SIZE : pos + total]) != h[BODYCRC]:
        return -1
    return int(total)

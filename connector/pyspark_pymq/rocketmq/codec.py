"""RocketMQ's message record (``MessageDecoder``): pulled messages in, batch bodies out.

Everything here follows ``org.apache.rocketmq.common.message.MessageDecoder``
of RocketMQ 5.3.3, not pymq's own layout (``pymq_proto.record``): a real broker
answers a PULL_MESSAGE with its commit-log records copied back to back, and the
Java client decodes them with ``MessageDecoder.decodes``. All integers are
big-endian and signed (Java's ``ByteBuffer``).

The stored record (``BH``/``SH`` = 8 for an IPv4 born/store host, 20 for IPv6):

=========  =========================  =========================================
offset     field                      notes
=========  =========================  =========================================
0          TOTALSIZE        int32     the whole record
4          MAGICCODE        int32     V1 ``0xDAA320A7`` (topic length 1 byte) or
                                      V2 ``0xDAA320AB`` (2 bytes; topics > 127)
8          BODYCRC          int32     crc32(body) & 0x7FFFFFFF, of the stored body
12         QUEUEID          int32
16         FLAG             int32     the producer's ``Message.flag``
20         QUEUEOFFSET      int64     index in the consume queue
28         PHYSICALOFFSET   int64     position in the commit log
36         SYSFLAG          int32     bits below
40         BORNTIMESTAMP    int64     ms, the producer's clock
48         BORNHOST         BH        IPv4 (4) or IPv6 (16) address + int32 port
48+BH      STORETIMESTAMP   int64     ms, the broker's clock
56+BH      STOREHOST        SH        address + int32 port
56+BH+SH   RECONSUMETIMES   int32
60+BH+SH   PREPAREDTXOFFSET int64
68+BH+SH   BODYLEN          int32     then the body (maybe compressed)
...        TOPICLEN         int8/16   by MAGICCODE; then the topic (UTF-8)
...        PROPERTIESLEN    int16     then ``name 0x01 value 0x02`` ... (UTF-8)
=========  =========================  =========================================

SYSFLAG bits used here: ``0x1`` COMPRESSED, ``0x10`` BORNHOST_V6, ``0x20``
STOREHOSTADDRESS_V6, ``0x40`` NEED_UNWRAP and ``0x80`` INNER_BATCH (a record
whose body is a whole batch, see below), bits ``0x700`` the compression type
(0 or 3 zlib, 1 LZ4 frame, 2 zstd frame). Like the Java client, decoding
inflates a compressed body and clears COMPRESSED (the type bits stay).

``offsetMsgId`` is ``MessageDecoder.createMessageId``: store address, port and
commit-log offset in upper-case hex (32 digits for IPv4, 56 for IPv6). The
``msgId`` a consumer sees is the UNIQ_KEY property, else the offsetMsgId
(``MessageClientExt.getMsgId``).

The body of SEND_BATCH_MESSAGE (``MessageDecoder.encodeMessages``) is a
different, shorter layout, one per message: TOTALSIZE int32, MAGICCODE int32
(0), BODYCRC int32 (0), FLAG int32, BODYLEN int32 + body, PROPERTIESLENGTH
int16 + properties. Records of an "inner batch" topic carry such a body and
are unwrapped into their messages, as ``PullAPIWrapper.processPullResult`` does.

Two decoders give the same result: :func:`decode_messages` (one
``MessageExt`` per message, the reference) and :func:`decode_to_arrow` (the
source's hot path: straight into the Arrow rows of
``pyspark_pymq.spark.schema.arrow_schema``, vectorised like
:mod:`pyspark_pymq.backend.pymq_arrow`; odd input falls back to the reference).

Where the Java client silently drops the rest of a pull after a record it cannot
decode, these decoders raise ``ValueError``: a gap in a stream is worse than a
failed task.
"""

from __future__ import annotations

import binascii
import gc
import ipaddress
import struct
import zlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from ..arrow_arrays import binaries, binary_scalar, booleans, from_numpy, to_numpy
from ..backend.base import filter_batch_by_tags, filter_by_tags
from ..client.message import MessageExt
from ..spark.rows import empty_batch, messages_to_batch
from ..spark.schema import arrow_schema, needs_properties, wants

__all__ = [
    "BLANK_MAGIC_CODE",
    "MESSAGE_MAGIC_CODE",
    "MESSAGE_MAGIC_CODE_V2",
    "MessageSysFlag",
    "RocketMQMessageExt",
    "create_message_id",
    "decode_batch",
    "decode_message_id",
    "decode_messages",
    "decode_to_arrow",
    "encode_batch",
    "encode_batch_columns",
    "filter_batch_by_tags",
    "filter_by_tags",
    "message_properties_to_string",
    "string_to_message_properties",
]

MESSAGE_MAGIC_CODE = -626843481  # 0xDAA320A7
MESSAGE_MAGIC_CODE_V2 = -626843477  # 0xDAA320AB
BLANK_MAGIC_CODE = -875286124  # 0xCBD43194: the padding at a commit-log file's end

NAME_VALUE_SEPARATOR = "\x01"
PROPERTY_SEPARATOR = "\x02"

_UNIQ_KEY = "UNIQ_KEY"
_TAGS = "TAGS"
_KEYS = "KEYS"
_RETRY_TOPIC = "RETRY_TOPIC"
_KEY_SEPARATOR = " "


class MessageSysFlag:
    """``org.apache.rocketmq.common.sysflag.MessageSysFlag``."""

    COMPRESSED_FLAG = 0x1
    MULTI_TAGS_FLAG = 0x1 << 1
    TRANSACTION_NOT_TYPE = 0
    TRANSACTION_PREPARED_TYPE = 0x1 << 2
    TRANSACTION_COMMIT_TYPE = 0x2 << 2
    TRANSACTION_ROLLBACK_TYPE = 0x3 << 2
    BORNHOST_V6_FLAG = 0x1 << 4
    STOREHOSTADDRESS_V6_FLAG = 0x1 << 5
    NEED_UNWRAP_FLAG = 0x1 << 6
    INNER_BATCH_FLAG = 0x1 << 7
    COMPRESSION_LZ4_TYPE = 0x1 << 8
    COMPRESSION_ZSTD_TYPE = 0x2 << 8
    COMPRESSION_ZLIB_TYPE = 0x3 << 8
    COMPRESSION_TYPE_COMPARATOR = 0x7 << 8


_COMPRESSED = MessageSysFlag.COMPRESSED_FLAG
_BORN_V6 = MessageSysFlag.BORNHOST_V6_FLAG
_STORE_V6 = MessageSysFlag.STOREHOSTADDRESS_V6_FLAG
_UNWRAP = MessageSysFlag.INNER_BATCH_FLAG | MessageSysFlag.NEED_UNWRAP_FLAG


@dataclass(slots=True)
class RocketMQMessageExt(MessageExt):
    """A ``MessageExt`` pulled from a RocketMQ broker, with the record fields pymq's lacks.

    ``sys_flag`` is as the Java client leaves it: COMPRESSED cleared once the
    body is inflated. Hosts are ``"ip:port"`` (``"[ipv6]:port"``).
    """

    sys_flag: int = 0
    body_crc: int = 0
    born_host: str = ""
    store_host: str = ""
    prepared_transaction_offset: int = 0


# --------------------------------------------------------------------------- properties


def message_properties_to_string(properties: Mapping[str, str | None]) -> str:
    """``MessageDecoder.messageProperties2String``: ``name\\x01value\\x02`` per entry.

    Entries whose value is None are left out, as in Java. Unlike Java, a name or
    value holding ``\\x01``/``\\x02`` is refused: it would not decode back.
    """
    parts: list[str] = []
    for name, value in properties.items():
        if value is None:
            continue
        if "\x01" in name or "\x02" in name or "\x01" in value or "\x02" in value:
            raise ValueError(f"message property {name!r} contains a reserved \\x01/\\x02 character")
        parts.append(f"{name}\x01{value}\x02")
    return "".join(parts)


def string_to_message_properties(text: str | bytes | None) -> dict[str, str]:
    """``MessageDecoder.string2messageProperties``, entry for entry.

    Java keeps an entry only if its name and its value are both non-empty
    (``k\\x01\\x02`` and ``\\x01v\\x02`` vanish); the value runs from the first
    ``\\x01`` to the next ``\\x02`` (so it may hold further ``\\x01``); the last
    entry needs no closing ``\\x02``; a repeated name keeps its last value.
    Bytes are decoded as Java's ``new String(bytes, UTF_8)`` does (malformed
    sequences become U+FFFD).
    """
    if text is None:
        return {}
    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    out: dict[str, str] = {}
    length = len(text)
    index = 0
    find = text.find
    while index < length:
        end = find("\x02", index)
        if end < 0:
            end = length
        if end - index >= 3:
            kv = find("\x01", index)
            if index < kv < end - 1:
                out[text[index:kv]] = text[kv + 1 : end]
        index = end + 1
    return out


# --------------------------------------------------------------------------- message ids


def create_message_id(store_host: bytes, commit_log_offset: int) -> str:
    """``MessageDecoder.createMessageId``: the offsetMsgId of a stored message.

    ``store_host`` is ``MessageExt.getStoreHostBytes()``: the IPv4 (4) or IPv6
    (16) address and the port as a big-endian int32.
    """
    if len(store_host) not in (8, 20):
        raise ValueError(
            f"store host must be 8 (IPv4 + port) or 20 (IPv6 + port) bytes, got {len(store_host)}"
        )
    return (bytes(store_host) + struct.pack(">q", commit_log_offset)).hex().upper()


def decode_message_id(msg_id: str) -> tuple[str, int, int]:
    """``MessageDecoder.decodeMessageId``: (host, port, commit-log offset) of an offsetMsgId.

    32 hex digits hold an IPv4 store host, 56 an IPv6 one. The host is printed
    as Python's ``ipaddress`` does (``::1``, not Java's ``0:0:0:0:0:0:0:1``).
    """
    try:
        raw = bytes.fromhex(msg_id)
    except (ValueError, TypeError):
        raw = b""
    if len(raw) not in (16, 28):
        raise ValueError(
            f"{msg_id!r} is not an offsetMsgId (32 hex digits for an IPv4 store host, 56 for IPv6)"
        )
    ip_len = len(raw) - 12
    (port,) = struct.unpack_from(">i", raw, ip_len)
    (offset,) = struct.unpack_from(">q", raw, ip_len + 4)
    return _ip_text(raw[:ip_len]), port, offset


def _is_v4_mapped(ip: bytes) -> bool:
    return len(ip) == 16 and ip[:10] == bytes(10) and ip[10:12] == b"\xff\xff"


def _ip_text(ip: bytes) -> str:
    # Java's InetAddress.getByAddress turns ::ffff:a.b.c.d into an Inet4Address
    if _is_v4_mapped(ip):
        ip = ip[12:]
    return str(ipaddress.ip_address(ip))


def _host_text(ip: bytes, port: int) -> str:
    text = _ip_text(ip)
    return f"[{text}]:{port}" if ":" in text else f"{text}:{port}"


def _offset_msg_id(ip: bytes, port: int, commit_log_offset: int) -> str:
    """The offsetMsgId ``MessageDecoder.decode`` gives a record whose store host is ``ip``.

    Java sizes the id buffer by the record's IPv6 flag (28 bytes) but fills it
    from the decoded address, which is an Inet4Address for ``::ffff:a.b.c.d``
    (8 bytes): such an id is the IPv4 one followed by 12 zero bytes.
    """
    if _is_v4_mapped(ip):
        return create_message_id(ip[12:] + struct.pack(">i", port), commit_log_offset) + "0" * 24
    return create_message_id(ip + struct.pack(">i", port), commit_log_offset)


# --------------------------------------------------------------------------- compression


def _decompress(raw: bytes, sys_flag: int, where: str) -> bytes:
    """The body of a compressed record (``CompressorFactory`` by the SYSFLAG type bits)."""
    kind = (sys_flag & MessageSysFlag.COMPRESSION_TYPE_COMPARATOR) >> 8
    try:
        if kind in (0, 3):  # 0: written before 5.x had compression types
            inflater = zlib.decompressobj()
            out = inflater.decompress(raw) + inflater.flush()
            if not inflater.eof:
                raise ValueError("the zlib stream is truncated")
            return out  # Java's InflaterInputStream ignores bytes after the stream too
        if kind in (1, 2):
            codec = "lz4" if kind == 1 else "zstd"  # Arrow's lz4 stream is the LZ4 frame format
            if not pa.Codec.is_available(codec):
                raise ValueError(f"this pyarrow build has no {codec} codec")
            with pa.CompressedInputStream(pa.BufferReader(raw), codec) as stream:
                data: bytes = stream.read()
            return data
    except (zlib.error, pa.ArrowException, OSError, ValueError) as err:
        name = {0: "zlib", 1: "LZ4", 2: "zstd", 3: "zlib"}[kind]
        raise ValueError(f"{where}: cannot inflate its {name}-compressed body: {err}") from None
    raise ValueError(
        f"{where}: unknown compression type {kind} in sysFlag {sys_flag:#x} "
        "(RocketMQ 5.3 knows 1 LZ4, 2 zstd, 3 zlib)"
    )


# --------------------------------------------------------------------------- per message

_PREFIX = struct.Struct(">iiiiiqqiq")  # TOTALSIZE .. BORNTIMESTAMP, 48 bytes
_PREFIX_SIZE = _PREFIX.size


@lru_cache(maxsize=4)
def _middle(born_ip: int, store_ip: int) -> struct.Struct:
    """BORNHOST .. BODYLEN for address sizes ``born_ip`` and ``store_ip`` (4 or 16)."""
    return struct.Struct(f">{born_ip}siq{store_ip}siiqi")


_I8 = struct.Struct(">b")
_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")


def decode_messages(data: bytes, broker_name: str) -> list[MessageExt]:
    """The messages of a PULL_MESSAGE answer's body, as the Java client decodes them.

    ``MessageDecoder.decodes`` (records read field by field, TOTALSIZE only
    recorded), then ``PullAPIWrapper.processPullResult``'s unwrapping of inner
    batches. Each message is a :class:`RocketMQMessageExt`: a compressed body is
    inflated, ``msg_id`` is UNIQ_KEY else ``offset_msg_id``, ``keys`` is KEYS
    split on spaces. Raises ``ValueError`` on a record it cannot decode.
    """
    was_enabled = gc.isenabled()
    gc.disable()  # thousands of new objects and no cycle: no collection passes meanwhile
    try:
        return _decode(bytes(data), broker_name)
    finally:
        if was_enabled:
            gc.enable()


def _decode(data: bytes, broker_name: str) -> list[MessageExt]:
    out: list[MessageExt] = []
    append = out.append
    end = len(data)
    hosts: dict[tuple[bytes, int], str] = {}
    topics: dict[bytes, str] = {}
    pos = 0
    while pos < end:
        start = pos
        where = f"record at byte {start} of the pull"
        try:
            (total, magic, crc, queue_id, flag, queue_offset, phy, sys_flag,
             born) = _PREFIX.unpack_from(data, pos)
            pos += _PREFIX_SIZE
            if magic == MESSAGE_MAGIC_CODE:
                topic_len_of = _I8
            elif magic == MESSAGE_MAGIC_CODE_V2:
                topic_len_of = _I16
            else:
                raise ValueError(f"{where}: invalid magic code {magic & 0xFFFFFFFF:#010x}")
            middle = _middle(16 if sys_flag & _BORN_V6 else 4, 16 if sys_flag & _STORE_V6 else 4)
            (born_ip, born_port, stored, store_ip, store_port, reconsume, prepared,
             body_len) = middle.unpack_from(data, pos)
            pos += middle.size
            if body_len < 0 or pos + body_len > end:
                raise ValueError(f"{where}: body length {body_len} runs past the pull")
            body = data[pos : pos + body_len]
            pos += body_len
            if body_len > 0 and sys_flag & _COMPRESSED:
                body = _decompress(body, sys_flag, where)
                sys_flag &= ~_COMPRESSED
            (topic_len,) = topic_len_of.unpack_from(data, pos)
            pos += topic_len_of.size
            if topic_len < 0 or pos + topic_len > end:
                raise ValueError(f"{where}: topic length {topic_len} is invalid")
            raw_topic = data[pos : pos + topic_len]
            pos += topic_len
            (props_len,) = _I16.unpack_from(data, pos)
            pos += 2
            if props_len < 0 or pos + props_len > end:
                raise ValueError(f"{where}: properties length {props_len} is invalid")
            raw_props = data[pos : pos + props_len]
            props = string_to_message_properties(raw_props) if props_len else {}
            if raw_props.count(_UNIQ_ENTRY) > 1:
                _keep_own_uniq_key(props, raw_props)
            pos += props_len
        except struct.error:
            raise ValueError(f"{where}: the record is truncated") from None
        topic = topics.get(raw_topic)
        if topic is None:
            topic = topics[raw_topic] = raw_topic.decode("utf-8", "replace")
        born_host = hosts.get((born_ip, born_port))
        if born_host is None:
            born_host = hosts[born_ip, born_port] = _host_text(born_ip, born_port)
        store_host = hosts.get((store_ip, store_port))
        if store_host is None:
            store_host = hosts[store_ip, store_port] = _host_text(store_ip, store_port)
        offset_id = _offset_msg_id(store_ip, store_port, phy)
        if sys_flag & _UNWRAP == _UNWRAP:
            _unwrap(out, body, topic, queue_id, broker_name, queue_offset, offset_id, phy, born, stored,
                    sys_flag, born_host, store_host, where)
            continue
        tags = props.get(_TAGS)
        keys = props.get(_KEYS)
        append(RocketMQMessageExt(
            topic=topic, queue_id=queue_id, broker_name=broker_name, queue_offset=queue_offset,
            msg_id=props.get(_UNIQ_KEY, offset_id), offset_msg_id=offset_id, commit_log_offset=phy,
            body=body, tags=tags, keys=tuple(keys.split(_KEY_SEPARATOR)) if keys else (),
            properties=props, born_timestamp=born, store_timestamp=stored, reconsume_times=reconsume,
            store_size=total, flag=flag, sys_flag=sys_flag, body_crc=crc, born_host=born_host,
            store_host=store_host, prepared_transaction_offset=prepared,
        ))
    return out


_UNIQ_ENTRY = b"UNIQ_KEY\x01"


def _keep_own_uniq_key(props: dict[str, str], raw: bytes) -> None:
    """A message's own UNIQ_KEY where its record names one twice.

    A batch sent by RocketMQ's Java client carries a UNIQ_KEY of its own, and the
    broker appends the batch's properties to each message's: Java's decoder keeps
    the last value, so every message of the batch shows the same msgId
    (apache/rocketmq#9416). The first is the message's own, the one its
    producer's SendResult reported: that one is kept.
    """
    at = 0 if raw.startswith(_UNIQ_ENTRY) else raw.find(b"\x02" + _UNIQ_ENTRY) + 1
    if at <= 0 and not raw.startswith(_UNIQ_ENTRY):
        return
    start = at + len(_UNIQ_ENTRY)
    end = raw.find(b"\x02", start)
    value = raw[start : end if end >= 0 else len(raw)].decode("utf-8", "replace")
    if value:
        props[_UNIQ_KEY] = value


def _unwrap(out: list[MessageExt], body: bytes, topic: str, queue_id: int, broker_name: str,
            queue_offset: int, offset_id: str, phy: int, born: int, stored: int, sys_flag: int,
            born_host: str, store_host: str, where: str) -> None:
    """``MessageDecoder.decodeMessage(MessageExt, List)``: an inner batch's messages.

    As in Java they share the record's topic, queue, hosts, times, sysFlag and
    commit-log offset, take queue offsets ``queue_offset + i`` and their own
    flag, body and properties; reconsume times and store size stay 0. Java
    leaves their offsetMsgId null; here it is the record's.
    """
    try:
        inner = decode_batch(body)
    except ValueError as err:
        raise ValueError(f"{where}: its inner batch does not decode: {err}") from None
    for i, (inner_body, inner_flag, props) in enumerate(inner):
        keys = props.get(_KEYS)
        out.append(RocketMQMessageExt(
            topic=topic, queue_id=queue_id, broker_name=broker_name, queue_offset=queue_offset + i,
            msg_id=props.get(_UNIQ_KEY, offset_id), offset_msg_id=offset_id, commit_log_offset=phy,
            body=inner_body, tags=props.get(_TAGS), keys=tuple(keys.split(_KEY_SEPARATOR)) if keys else (),
            properties=props, born_timestamp=born, store_timestamp=stored, reconsume_times=0,
            flag=inner_flag, sys_flag=sys_flag, born_host=born_host, store_host=store_host,
        ))


# --------------------------------------------------------------------------- batch bodies

_BATCH_HEAD = struct.Struct(">iiiii")  # TOTALSIZE, MAGICCODE, BODYCRC, FLAG, BODYLEN
_BATCH_FIXED = _BATCH_HEAD.size + 2
_MAX_PROPERTIES = 32767  # Java casts the length to a short


#: The properties of a batch message: encoded (``str`` or UTF-8 ``bytes``), or a mapping to encode.
BatchProperties = str | bytes | Mapping[str, str | None] | None


def _properties_bytes(properties: BatchProperties) -> bytes:
    if properties is None:
        return b""
    if isinstance(properties, bytes):
        return properties
    if isinstance(properties, str):
        return properties.encode()
    return message_properties_to_string(properties).encode()


def encode_batch(messages: Iterable[tuple[bytes, int, BatchProperties]]) -> bytes:
    """``MessageDecoder.encodeMessages``: the body of a SEND_BATCH_MESSAGE.

    ``messages`` are ``(body, flag, properties)``; properties as the encoded
    string (``str`` or UTF-8 ``bytes``) or a mapping to encode. MAGICCODE and
    BODYCRC are 0, as Java writes them (the broker computes the CRC).
    """
    parts: list[bytes] = []
    pack = _BATCH_HEAD.pack
    for i, (body, flag, properties) in enumerate(messages):
        props = _properties_bytes(properties)
        if len(props) > _MAX_PROPERTIES:
            raise ValueError(
                f"message {i} of the batch: properties are {len(props)} bytes, RocketMQ allows "
                f"{_MAX_PROPERTIES}"
            )
        size = _BATCH_FIXED + len(body) + len(props)
        if size > 0x7FFFFFFF:
            raise ValueError(f"message {i} of the batch is larger than 2 GiB")
        if not -0x80000000 <= flag <= 0x7FFFFFFF:
            raise ValueError(f"message {i} of the batch: flag {flag} is not a Java int")
        parts += (pack(size, 0, 0, flag, len(body)), body, len(props).to_bytes(2, "big"), props)
    return b"".join(parts)


def decode_batch(data: bytes) -> list[tuple[bytes, int, dict[str, str]]]:
    """``MessageDecoder.decodeMessages``: ``(body, flag, properties)`` of a batch body."""
    out: list[tuple[bytes, int, dict[str, str]]] = []
    pos, end = 0, len(data)
    try:
        while pos < end:
            _total, _magic, _crc, flag, body_len = _BATCH_HEAD.unpack_from(data, pos)
            pos += _BATCH_HEAD.size
            if body_len < 0 or pos + body_len > end:
                raise ValueError(f"message at byte {pos - _BATCH_HEAD.size}: body length {body_len}")
            body = data[pos : pos + body_len]
            pos += body_len
            (props_len,) = _I16.unpack_from(data, pos)
            pos += 2
            if props_len < 0 or pos + props_len > end:
                raise ValueError(f"message ending at byte {pos}: properties length {props_len}")
            out.append((body, flag, string_to_message_properties(data[pos : pos + props_len])))
            pos += props_len
    except struct.error:
        raise ValueError(f"batch truncated at byte {pos}") from None
    return out


_BATCH_HEAD_DTYPE = np.dtype(
    [("total", ">i4"), ("magic", ">i4"), ("crc", ">i4"), ("flag", ">i4"), ("body_len", ">i4")]
)


def _as_binary(column: pa.Array | pa.ChunkedArray, what: str) -> pa.Array:
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    if not pa.types.is_binary(column.type):
        try:
            column = column.cast(pa.binary())
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as err:
            raise TypeError(f"{what} must be a binary or string column, got {column.type}") from err
    return column


def _fixed_width(mat: npt.NDArray[np.uint8]) -> pa.Array:
    """A binary array whose i-th value is row i of ``mat`` (no per-row object)."""
    n, width = mat.shape
    offsets = np.arange(0, n * width + 1, width, dtype=np.int32)
    return pa.Array.from_buffers(pa.binary(), n, [None, pa.py_buffer(offsets), pa.py_buffer(mat)])


def encode_batch_columns(
    bodies: pa.Array | pa.ChunkedArray,
    properties: pa.Array | pa.ChunkedArray | bytes | str,
    flag: int | Sequence[int] | npt.NDArray[np.integer[Any]] = 0,
) -> bytes:
    """:func:`encode_batch` of whole columns at once (the Spark sink's path).

    ``properties`` are the encoded properties of each row (a null row has
    none), or one encoded string for every row; ``flag`` is one for all rows
    or one per row. Byte for byte what :func:`encode_batch` gives for the
    same rows.
    """
    body = _as_binary(bodies, "bodies")
    n = len(body)
    if n == 0:
        return b""
    if body.null_count:
        i = int(pc.index(pc.is_null(body), True).as_py())
        raise ValueError(f"row {i} has a null body")
    body_lens = to_numpy(pc.binary_length(body)).astype(np.int64)
    props: pa.Array | pa.Scalar
    if isinstance(properties, (bytes, str)):
        raw = properties.encode() if isinstance(properties, str) else properties
        props = binary_scalar(raw)
        props_lens = np.full(n, len(raw), dtype=np.int64)
    else:
        props = _as_binary(properties, "properties")
        if len(props) != n:
            raise ValueError(f"{len(props)} properties for {n} bodies")
        if props.null_count:
            props = props.fill_null(binary_scalar(b""))
        props_lens = to_numpy(pc.binary_length(props)).astype(np.int64)
    if int(props_lens.max()) > _MAX_PROPERTIES:
        i = int(np.argmax(props_lens > _MAX_PROPERTIES))
        raise ValueError(
            f"row {i}: properties are {int(props_lens[i])} bytes, RocketMQ allows {_MAX_PROPERTIES}"
        )
    sizes = _BATCH_FIXED + body_lens + props_lens
    if int(sizes.sum()) > 0x7FFFFFFF:
        raise ValueError("a batch body must be smaller than 2 GiB")
    head = np.zeros(n, dtype=_BATCH_HEAD_DTYPE)
    head["total"] = sizes
    flags = np.asarray(flag, dtype=np.int64)
    if flags.ndim and len(flags) != n:
        raise ValueError(f"{len(flags)} flags for {n} bodies")
    if flags.size and (int(flags.min()) < -0x80000000 or int(flags.max()) > 0x7FFFFFFF):
        raise ValueError("a flag is not a Java int (32-bit signed)")
    head["flag"] = flags
    head["body_len"] = body_lens
    props_len_be = props_lens.astype(">i2").view(np.uint8).reshape(n, 2)
    joined = pc.binary_join_element_wise(
        _fixed_width(head.view(np.uint8).reshape(n, _BATCH_HEAD.size)), body,
        _fixed_width(props_len_be), props, binary_scalar(b""),
    )
    offsets = np.frombuffer(joined.buffers()[1], dtype=np.int32)[joined.offset : joined.offset + n + 1]
    values = joined.buffers()[2]
    first, last = int(offsets[0]), int(offsets[-1])
    return b"" if values is None else values.to_pybytes()[first:last]


# --------------------------------------------------------------------------- tag filtering


# --------------------------------------------------------------------------- Arrow

_MIN_HEADER = 72 + 8 + 8  # both hosts IPv4, BODYLEN included
_MIN_RECORD = _MIN_HEADER + 1 + 2  # + V1 topic length + properties length
_SIZE_BYTES = np.arange(4, dtype=np.int64)
_I32_MAX = np.iinfo(np.int32).max

_PREFIX_DTYPE = np.dtype(
    {
        "names": ["total", "magic", "queue_id", "flag", "queue_offset", "phy", "sys_flag", "born"],
        "formats": [">i4", ">i4", ">i4", ">i4", ">i8", ">i8", ">i4", ">i8"],
        "offsets": [0, 4, 12, 16, 20, 28, 36, 40],
        "itemsize": _MIN_HEADER,
    }
)


@lru_cache(maxsize=4)
def _tail_dtype(born_len: int, store_len: int) -> np.dtype[Any]:
    """STORETIMESTAMP .. BODYLEN of a header whose hosts are ``born_len``/``store_len`` bytes."""
    at = 48 + born_len
    return np.dtype(
        {
            "names": ["stored", "reconsume", "body_len"],
            "formats": [">i8", ">i4", ">i4"],
            "offsets": [at, at + 8 + store_len, at + 8 + store_len + 12],
            "itemsize": at + 8 + store_len + 16,
        }
    )


class _Fallback(Exception):
    """The fast path cannot decode this pull exactly; the reference decoder will."""


def _record_starts(data: bytes) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """Where each record starts and its TOTALSIZE, following TOTALSIZE from byte 0.

    Records follow each other, so each start depends on the previous size.
    When all records have the same size (fixed-size bodies and properties,
    common for telemetry) one vectorised check proves it: if every multiple of
    the first size holds that same size, the chain is exactly those multiples.
    Otherwise a tight Python loop follows the sizes.
    """
    end = len(data)
    if end < _MIN_RECORD:
        raise _Fallback
    (first,) = _I32.unpack_from(data, 0)
    if first >= _MIN_RECORD and end % first == 0:
        starts = np.arange(0, end, first, dtype=np.int64)
        sizes = np.frombuffer(data, dtype=np.uint8)[starts[:, None] + _SIZE_BYTES]
        if bool(np.all(sizes.view(">i4").reshape(-1) == first)):
            return starts, np.full(len(starts), first, dtype=np.int64)
    out: list[int] = []
    totals: list[int] = []
    append, append_total = out.append, totals.append
    unpack = _I32.unpack_from
    pos = 0
    limit = end - 4
    while pos < end:
        if pos > limit:
            raise _Fallback
        (total,) = unpack(data, pos)
        if total < _MIN_RECORD:
            raise _Fallback
        append(pos)
        append_total(total)
        pos += total
    if pos != end:
        raise _Fallback
    return np.asarray(out, dtype=np.int64), np.asarray(totals, dtype=np.int64)


def _spans(data: pa.Buffer, bounds: npt.NDArray[np.int64], count: int, stride: int,
           pick: Sequence[int], as_type: pa.DataType) -> list[pa.Array]:
    """Arrays of the spans ``pick`` (indexes within each group of ``stride``
    spans) of a binary view over ``data`` cut at ``bounds`` (increasing)."""
    cut = pa.Array.from_buffers(
        as_type, len(bounds) - 1, [None, pa.py_buffer(bounds.astype(np.int32)), data]
    )
    return [cut.take(from_numpy(np.arange(k, count * stride, stride))) for k in pick]


def _gather(data: pa.Buffer, starts: npt.NDArray[np.int64], width: int) -> npt.NDArray[np.uint8]:
    """``width`` bytes at each start, as one ``(n, width)`` array (one Arrow take)."""
    n = len(starts)
    bounds = np.empty(2 * n, dtype=np.int64)
    bounds[0::2] = starts
    bounds[1::2] = starts + width
    (spans,) = _spans(data, bounds, n, 2, (0,), pa.binary())
    values = spans.buffers()[2]
    if values is None:
        return np.zeros((0, width), dtype=np.uint8)
    return np.frombuffer(values, dtype=np.uint8, count=n * width).reshape(n, width)


def _constant_strings(value: str, n: int) -> pa.Array:
    raw = value.encode()
    offsets = np.arange(n + 1, dtype=np.int32) * len(raw)
    return pa.StringArray.from_buffers(n, pa.py_buffer(offsets), pa.py_buffer(raw * n))


def _is_utf8(values: pa.Buffer | None, size: int) -> bool:
    """Whether ``values[:size]`` is valid UTF-8 (Arrow's fast validation)."""
    if values is None or size == 0:
        return True
    try:
        pa.StringArray.from_buffers(
            1, pa.py_buffer(np.array([0, size], dtype=np.int32)), values
        ).validate(full=True)
    except pa.ArrowInvalid:
        return False
    return True


def _be16(buf: npt.NDArray[np.uint8], at: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    value = (buf[at].astype(np.int64) << 8) | buf[at + 1]
    return np.where(value >= 0x8000, value - 0x10000, value)


def decode_to_arrow(
    data: bytes,
    *,
    topic: str,
    broker_name: str,
    retry: bool,
    end_offset: int | None = None,
    columns: tuple[str, ...] | None = None,
) -> pa.RecordBatch:
    """The source's rows of a PULL_MESSAGE answer's body (all from one queue of ``topic``).

    The same rows as ``messages_to_batch(decode_messages(data, broker_name))``
    (see :func:`pyspark_pymq.spark.rows.messages_to_batch`), without a Python object per message: the only
    per-record Python work is following TOTALSIZE, and inflating compressed
    bodies. Anything the fast path does not cover exactly (inner batches,
    repeated or malformed property entries, invalid UTF-8, records whose
    fields disagree with TOTALSIZE) falls back to :func:`decode_messages`.

    Args:
        data: the records, back to back.
        topic: the topic they were read from.
        broker_name: the broker that stores the queue.
        retry: whether ``topic`` is a ``%RETRY%`` topic: then the ``topic``
            column holds each message's original topic (RETRY_TOPIC) and
            ``retry_topic`` the retry topic.
        end_offset: rows at or beyond this queue offset are left out.
        columns: the columns the caller keeps (None: all); the others are left null
            (bodies are not inflated, properties not parsed, unless a kept column needs them).
    """
    if not data:
        return empty_batch()
    if len(data) > _I32_MAX:
        raise ValueError("a pull answered with more than 2 GiB of records")
    data = bytes(data)
    try:
        return _fast(data, topic, broker_name, retry, end_offset, columns)
    except _Fallback:
        messages = decode_messages(data, broker_name)
        if end_offset is not None:
            messages = [m for m in messages if m.queue_offset < end_offset]
        return messages_to_batch(messages, read_from=topic, retry=retry)


def _fast(data: bytes, topic: str, broker_name: str, retry: bool,
          end_offset: int | None, columns: tuple[str, ...] | None) -> pa.RecordBatch:
    schema = arrow_schema()
    buf = np.frombuffer(data, dtype=np.uint8)
    buffer = pa.py_buffer(data)
    starts, totals = _record_starts(data)
    n = len(starts)

    # The first 88 bytes are inside every record (TOTALSIZE >= 91 was checked);
    # with IPv4 hosts they are the whole header.
    head = _gather(buffer, starts, _MIN_HEADER)
    prefix = head.view(_PREFIX_DTYPE).reshape(-1)
    magic = prefix["magic"]
    v2 = magic == MESSAGE_MAGIC_CODE_V2
    sys_flag = prefix["sys_flag"].astype(np.int64)
    if not bool(np.all(v2 | (magic == MESSAGE_MAGIC_CODE))):
        raise _Fallback
    if bool(np.any((sys_flag & _UNWRAP) == _UNWRAP)):
        raise _Fallback

    # The tail of the header moves with the host sizes: one gather per kind present.
    stored = np.empty(n, dtype=np.int64)
    reconsume = np.empty(n, dtype=np.int32)
    body_len = np.empty(n, dtype=np.int64)
    header_len = np.empty(n, dtype=np.int64)
    store_host = np.zeros((n, 20), dtype=np.uint8)
    hosts = sys_flag & (_BORN_V6 | _STORE_V6)
    kinds = np.unique(hosts)
    for kind in kinds.tolist():
        born_len = 20 if kind & _BORN_V6 else 8
        store_len = 20 if kind & _STORE_V6 else 8
        tail = _tail_dtype(born_len, store_len)
        pick: slice | npt.NDArray[np.int64] = (
            slice(None) if len(kinds) == 1 else np.flatnonzero(hosts == kind)
        )
        if tail.itemsize == _MIN_HEADER:
            rows = head[pick]
        else:
            if bool(np.any(totals[pick] < tail.itemsize + 3)):
                raise _Fallback
            rows = _gather(buffer, starts[pick], tail.itemsize)
        fields = rows.view(tail).reshape(-1)
        stored[pick] = fields["stored"]
        reconsume[pick] = fields["reconsume"]
        body_len[pick] = fields["body_len"]
        header_len[pick] = tail.itemsize
        at = 56 + born_len
        store_host[pick, :store_len] = rows[:, at : at + store_len]

    # Where body, topic and properties lie; each record must end exactly at TOTALSIZE
    # (the Java decoder reads fields, not TOTALSIZE: the reference path does the same).
    last = len(data) - 2
    rec_end = starts + totals
    body_start = starts + header_len
    body_end = body_start + body_len
    topic_len_size = np.where(v2, 2, 1)
    ok = (body_len >= 0) & (body_end + topic_len_size + 2 <= rec_end)
    at = np.clip(body_end, 0, last)
    topic_len = np.where(v2, _be16(buf, at), buf[at].astype(np.int8).astype(np.int64))
    topic_start = body_end + topic_len_size
    topic_end = topic_start + topic_len
    ok &= (topic_len >= 0) & (topic_end + 2 <= rec_end)
    props_len = _be16(buf, np.clip(topic_end, 0, last))
    props_start = topic_end + 2
    props_end = props_start + props_len
    ok &= (props_len >= 0) & (props_end == rec_end)
    if not bool(np.all(ok)):
        raise _Fallback

    queue_offset = prefix["queue_offset"].astype(np.int64)
    if end_offset is not None:
        keep = queue_offset < end_offset
        if not bool(keep.all()):
            sel = np.flatnonzero(keep)
            n = len(sel)
            if n == 0:
                return empty_batch()
            starts, prefix, head = starts[sel], prefix[sel], head[sel]
            sys_flag, queue_offset = sys_flag[sel], queue_offset[sel]
            stored, reconsume, store_host = stored[sel], reconsume[sel], store_host[sel]
            hosts, body_len = hosts[sel], body_len[sel]
            body_start, body_end = body_start[sel], body_end[sel]
            topic_start, topic_end = topic_start[sel], topic_end[sel]
            props_start, props_end = props_start[sel], props_end[sel]

    want_body = wants(columns, "body")
    want_topic = wants(columns, "topic")
    want_props = needs_properties(columns, retry=retry)
    # One binary view over the whole pull: body_i, gap, topic_i, gap, props_i, gap ...
    bounds = np.empty(6 * n, dtype=np.int64)
    bounds[0::6] = body_start
    bounds[1::6] = body_end
    bounds[2::6] = topic_start
    bounds[3::6] = topic_end
    bounds[4::6] = props_start
    bounds[5::6] = props_end
    picks = tuple(k for k, wanted in ((0, want_body), (2, want_topic), (4, want_props)) if wanted)
    spans = dict(zip(picks, _spans(buffer, bounds, n, 6, picks, pa.binary()), strict=True))

    string = pa.string()
    body = spans.get(0, pa.nulls(n, pa.binary()))
    compressed = np.flatnonzero((sys_flag & _COMPRESSED != 0) & (body_len > 0) & want_body)
    if len(compressed):
        raw_bodies = body.take(from_numpy(compressed)).to_pylist()
        inflated = [
            _decompress(raw, int(sys_flag[i]), f"record at byte {int(starts[i])} of the pull")
            for raw, i in zip(raw_bodies, compressed.tolist(), strict=True)
        ]
        mask = np.zeros(n, dtype=bool)
        mask[compressed] = True
        body = pc.replace_with_mask(body, booleans(mask), binaries(inflated))

    topic_col = _topic_column(spans[2], topic, n) if want_topic else pa.nulls(n, string)
    properties: pa.Array = pa.nulls(n, schema.field("properties").type)
    tags: pa.Array = pa.nulls(n, string)
    keys: pa.Array = pa.nulls(n, schema.field("keys").type)
    msg_id: pa.Array = pa.nulls(n, string)
    uniq: pa.Array | None = None  # UNIQ_KEY, null where absent
    all_uniq = False
    if want_props:
        properties, entry_keys, entry_values, entry_record, key_codes = _properties(spans[4], n, schema)

        def lookup(name: str) -> tuple[pa.Array, npt.NDArray[np.bool_]]:
            """Per record, the value of property ``name`` (null if absent), and a presence mask."""
            code = key_codes.get(name)
            if code is None:
                return pa.nulls(n, string), np.zeros(n, dtype=bool)
            hits = np.flatnonzero(entry_keys == code)
            index = np.full(n, -1, dtype=np.int64)
            index[entry_record[hits]] = hits
            present = index >= 0
            taken = entry_values.take(from_numpy(index, mask=None if present.all() else ~present))
            return taken, present

        if wants(columns, "tags"):
            tags, _ = lookup(_TAGS)
        if wants(columns, "msg_id"):
            uniq, has_uniq = lookup(_UNIQ_KEY)
            all_uniq = bool(has_uniq.all())
        if wants(columns, "keys"):
            keys_value, has_keys = lookup(_KEYS)
            keys = _keys_column(keys_value, has_keys, n, schema.field("keys").type)
        if retry and want_topic:
            original, _ = lookup(_RETRY_TOPIC)
            topic_col = pc.coalesce(original, topic_col)
    offset_msg_id: pa.Array = pa.nulls(n, string)
    if wants(columns, "offset_msg_id") or (uniq is not None and not all_uniq):
        offset_msg_id = _offset_msg_ids(store_host, hosts, head[:, 28:36], n)
    if uniq is not None:
        msg_id = uniq if all_uniq else pc.coalesce(uniq, offset_msg_id)
    retry_col = _constant_strings(topic, n) if retry else pa.nulls(n, string)

    ts_type = schema.field("born_timestamp").type
    out: list[Any] = [
        topic_col,
        from_numpy(prefix["queue_id"], pa.int32()),
        _constant_strings(broker_name, n),
        from_numpy(queue_offset),
        msg_id,
        offset_msg_id,
        from_numpy(prefix["phy"]),
        tags,
        keys,
        body,
        properties,
        from_numpy(prefix["born"].astype(np.int64) * 1000, ts_type),
        from_numpy(stored * 1000, ts_type),
        from_numpy(reconsume, pa.int32()),
        retry_col,
    ]
    return pa.RecordBatch.from_arrays(out, schema=schema)


def _topic_column(topics: pa.Array, topic: str, n: int) -> pa.Array:
    """The records' own topics: one constant column when all are ``topic`` (a pull's usual case)."""
    if pc.all(pc.equal(topics, binary_scalar(topic.encode()))).as_py():
        return _constant_strings(topic, n)
    offsets = np.frombuffer(topics.buffers()[1], dtype=np.int32, count=n + 1)
    if not _is_utf8(topics.buffers()[2], int(offsets[-1])):
        raise _Fallback
    return topics.cast(pa.string())


def _properties(
    props: pa.Array, n: int, schema: pa.Schema
) -> tuple[pa.Array, npt.NDArray[np.int32], pa.Array, npt.NDArray[np.int64], dict[str, int]]:
    """The ``properties`` map column, parsed as ``string2messageProperties`` does.

    Also per entry its key's code (see ``codes``), value and record, for look-ups.
    Entries end at each ``\\x02`` and at the end of a record's properties; an
    entry is kept when it has a non-empty name before its first ``\\x01`` and a
    non-empty value after it. Repeated names in one record fall back (a Python
    dict keeps the first position and the last value).
    """
    offsets = np.frombuffer(props.buffers()[1], dtype=np.int32, count=n + 1).astype(np.int64)
    size = int(offsets[-1])
    values = props.buffers()[2]
    flat = (
        np.frombuffer(values, dtype=np.uint8, count=size)
        if values is not None and size
        else np.zeros(0, dtype=np.uint8)
    )
    if not _is_utf8(values, size):
        raise _Fallback  # Java and the reference put U+FFFD for malformed bytes
    seps = np.flatnonzero(flat == 2)
    name_seps = np.flatnonzero(flat == 1)
    lengths = offsets[1:] - offsets[:-1]
    # Records whose properties do not end with \x02 end their last entry at their end.
    is_open = (
        (lengths > 0) & (flat[np.maximum(offsets[1:] - 1, 0)] != 2) if size else np.zeros(n, dtype=bool)
    )
    per_record = np.diff(np.searchsorted(seps, offsets, side="left"))
    ends = seps
    begins = np.empty(len(ends), dtype=np.int64)
    if len(ends):
        begins[0] = 0
        begins[1:] = seps[:-1] + 1
    if (len(name_seps) == len(seps) and not is_open.any()
            and bool(np.all(name_seps > begins)) and bool(np.all(name_seps < ends - 1))):
        # As every encoder writes them: each entry closed by \x02, one \x01 in it, a name and a
        # value. Entries are then exactly the \x02-terminated runs, each split at its \x01.
        kv = name_seps
        entry_record = np.repeat(np.arange(n, dtype=np.int64), per_record)
        per_map = per_record
    else:
        begins, kv, ends, entry_record = _java_entries(flat, offsets, seps, name_seps, is_open, per_record, n)
        per_map = np.bincount(entry_record, minlength=n)
    entries = len(begins)
    map_offsets = np.zeros(n + 1, dtype=np.int32)
    np.cumsum(per_map, out=map_offsets[1:])
    map_type = schema.field("properties").type
    if entries == 0:
        empty = pa.nulls(0, pa.string())
        return (
            pa.MapArray.from_arrays(from_numpy(map_offsets, pa.int32()), empty, empty, type=map_type),
            np.zeros(0, dtype=np.int32), empty, entry_record, {},
        )
    cuts = np.empty(4 * entries + 1, dtype=np.int64)
    cuts[0:-1:4] = begins
    cuts[1::4] = kv
    cuts[2::4] = kv + 1
    cuts[3::4] = ends
    cuts[-1] = size
    assert values is not None
    entry_names, entry_values = _spans(values, cuts, entries, 4, (0, 2), pa.string())
    encoded = pc.dictionary_encode(entry_names)
    codes = to_numpy(encoded.indices).astype(np.int32)
    names = encoded.dictionary.to_pylist()
    if _has_repeats(entry_record, codes, len(names), n):
        raise _Fallback
    properties = pa.MapArray.from_arrays(
        from_numpy(map_offsets, pa.int32()), entry_names, entry_values, type=map_type
    )
    return properties, codes, entry_values, entry_record, {name: i for i, name in enumerate(names)}


def _java_entries(
    flat: npt.NDArray[np.uint8], offsets: npt.NDArray[np.int64], seps: npt.NDArray[np.int64],
    name_seps: npt.NDArray[np.int64], is_open: npt.NDArray[np.bool_], per_record: npt.NDArray[np.int64],
    n: int,
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64], npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """(begin, first \x01, end, record) of every entry ``string2messageProperties`` keeps.

    For any bytes: an open last entry, an entry without \x01 or with several, empty
    names or values (dropped, as Java drops them).
    """
    open_end = offsets[1:][is_open]
    if len(open_end):
        # an open end ends its entry before a \x02 at the same place starts the next record's
        ends = np.concatenate([seps, open_end])
        nexts = np.concatenate([seps + 1, open_end])
        order = np.argsort(np.concatenate([seps * 2 + 1, open_end * 2]), kind="stable")
        ends, nexts = ends[order], nexts[order]
    else:
        ends, nexts = seps, seps + 1
    begins = np.empty(len(ends), dtype=np.int64)
    if len(ends):
        begins[0] = 0
        begins[1:] = nexts[:-1]
    # In that order, entries come record by record: count each record's entry ends.
    entry_record = np.repeat(np.arange(n, dtype=np.int64), per_record + is_open)
    # The first \x01 at or after each entry's start (anywhere, as Java's indexOf). When
    # every entry holds exactly one, as encoders write them, that is simply each \x01.
    if len(name_seps) == len(begins) and bool(np.all(name_seps >= begins)) and bool(np.all(name_seps < ends)):
        kv = name_seps
    elif len(name_seps):
        at = np.searchsorted(name_seps, begins, side="left")
        kv = np.where(at < len(name_seps), name_seps[np.minimum(at, len(name_seps) - 1)], -1)
    else:
        kv = np.full(len(begins), -1, dtype=np.int64)
    good = (kv > begins) & (kv < ends - 1)
    if not bool(good.all()):
        return begins[good], kv[good], ends[good], entry_record[good]
    return begins, kv, ends, entry_record


def _has_repeats(entry_record: npt.NDArray[np.int64], codes: npt.NDArray[np.int32], distinct: int,
                 n: int) -> bool:
    """Whether some record has two entries of the same name."""
    pairs = entry_record * distinct + codes
    if n * distinct <= 4 * len(pairs) + (1 << 20):
        return bool(np.bincount(pairs, minlength=1).max() > 1)
    return len(pc.unique(from_numpy(pairs))) != len(pairs)


def _offset_msg_ids(store_host: npt.NDArray[np.uint8], hosts: npt.NDArray[np.int64],
                    phy_be: npt.NDArray[np.uint8], n: int) -> pa.Array:
    """``offset_msg_id`` of every record, as :func:`_offset_msg_id` makes one."""
    v6 = (hosts & _STORE_V6) != 0
    if not v6.any():
        raw = np.empty((n, 16), dtype=np.uint8)
        raw[:, :8] = store_host[:, :8]
        raw[:, 8:] = phy_be
        width = 32
    else:
        raw = np.zeros((n, 28), dtype=np.uint8)
        mapped = v6 & np.all(store_host[:, :10] == 0, axis=1) & np.all(store_host[:, 10:12] == 0xFF, axis=1)
        as_v4 = ~v6 | mapped
        plain = ~as_v4
        raw[plain, :20] = store_host[plain]
        raw[plain, 20:] = phy_be[plain]
        raw[~v6, :8] = store_host[~v6, :8]
        raw[mapped, :4] = store_host[mapped, 12:16]
        raw[mapped, 4:8] = store_host[mapped, 16:20]
        raw[as_v4, 8:16] = phy_be[as_v4]
        width = 56
    ids = pa.StringArray.from_buffers(
        n, pa.py_buffer(np.arange(n + 1, dtype=np.int32) * width),
        pa.py_buffer(binascii.hexlify(np.ascontiguousarray(raw).data).upper()),
    )
    if width == 56 and not bool(np.all(v6)):
        ids = pc.if_else(booleans(~v6), pc.utf8_slice_codeunits(ids, 0, 32), ids)
    return ids


def _keys_column(values: pa.Array, present: npt.NDArray[np.bool_], n: int,
                 list_type: pa.DataType) -> pa.Array:
    """KEYS ("k1 k2") split on spaces into a list per record; an empty list where absent."""
    hits = np.flatnonzero(present)
    if not len(hits):
        return pa.ListArray.from_arrays(
            from_numpy(np.zeros(n + 1), pa.int32()), pa.nulls(0, pa.string()), type=list_type
        )
    split = pc.split_pattern(values.take(from_numpy(hits)), pattern=_KEY_SEPARATOR)
    lengths = np.zeros(n, dtype=np.int32)
    lengths[hits] = to_numpy(pc.list_value_length(split))
    offsets = np.zeros(n + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    return pa.ListArray.from_arrays(from_numpy(offsets, pa.int32()), split.flatten(), type=list_type)

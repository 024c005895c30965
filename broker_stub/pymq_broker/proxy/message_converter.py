"""apache.rocketmq.v2 messages <-> the broker's stored records, as RocketMQ's proxy maps them.

A v2 ``Message`` has user properties and typed system properties; a stored
record has one property map. The proxy's mapping (``SendMessageActivity`` /
``GrpcConverter``), kept here in one place so that a message sent through v2
reads the same in the pymq clients and the Spark source, and the other way:

=========================  ===============================================
v2 system property         stored property
=========================  ===============================================
tag                        TAGS
keys                       KEYS (joined with a space)
message_id                 UNIQ_KEY
message_group              __SHARDINGKEY (FIFO)
delivery_timestamp         TIMER_DELIVER_MS (the broker's timer delivers it then)
message_type TRANSACTION   TRAN_MSG=true, PGROUP
trace_context              TRACE_CONTEXT
born_timestamp             the record's born timestamp
=========================  ===============================================

User properties are stored as they are; a user property that names one of
the broker's own properties is refused (ILLEGAL_MESSAGE_PROPERTY_KEY). Read
back, every property that is not the broker's is a user property again.

Delays: a delivery timestamp is kept in TIMER_DELIVER_MS; the store's
TimerMessageStore delivers the message at that time (RocketMQ 5's timer), at most
``max_delay_time_mills`` ahead, and it reads back as the message's delivery timestamp.
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import time
import zlib
from dataclasses import dataclass

from google.protobuf.timestamp_pb2 import Timestamp
from pymq_proto.record import (
    HEADER,
    HEADER_SIZE,
    MAX_PROPERTIES_SIZE,
    MessageConst,
    decode_properties,
    encode_properties,
    offset_msg_id,
    split_tail,
)
from pymq_proto.rocketmq_v2 import definition_pb2 as v2
from pymq_proto.topics import is_retry_topic

from ..common.mix_all import topic_name_problem
from .proxy_config import ProxyConfig
from .status import ProxyException

MC = MessageConst
PROPERTY_TIMER_DELIVER_MS = "TIMER_DELIVER_MS"
PROPERTY_TRACE_CONTEXT = "TRACE_CONTEXT"
PROPERTY_BORN_HOST = "__BORNHOST"
# the broker's properties: never a user property, in either direction
RESERVED_PROPERTIES = MC.NOT_USER_PROPERTIES


@dataclass(frozen=True, slots=True)
class MessageToSend:
    """A v2 message as the broker's send takes it."""

    topic: str
    body: bytes
    properties: bytes
    born_timestamp: int
    message_id: str
    message_type: int
    message_group: str


def check_topic(name: str) -> None:
    """ILLEGAL_TOPIC for a name RocketMQ refuses."""
    problem = topic_name_problem(name)
    if problem:
        raise ProxyException(v2.ILLEGAL_TOPIC, problem)


def to_message_to_send(
    msg: v2.Message, *, config: ProxyConfig, max_body_size: int,
    producer_group: str = "", now_ms: int | None = None, remote_address: str = "",
) -> MessageToSend:
    """The checks of RocketMQ's proxy (``validateMessage``), then the stored properties.

    ``remote_address``: the sender's ``host:port``, its born host when the message has none."""
    sp = msg.system_properties
    topic = msg.topic.name
    check_topic(topic)
    if not msg.body:
        raise ProxyException(
            v2.MESSAGE_BODY_EMPTY, f"message {sp.message_id!r} to {topic!r} has an empty body"
        )
    body = _decoded_body(msg)
    if len(body) > max_body_size:
        raise ProxyException(
            v2.MESSAGE_BODY_TOO_LARGE,
            f"message body of {len(body)} bytes to {topic!r} is over the limit of {max_body_size} bytes",
        )
    if not sp.message_id:
        raise ProxyException(v2.ILLEGAL_MESSAGE_ID, f"message to {topic!r} has no message_id")
    props: dict[str, str] = {}
    for key, value in msg.user_properties.items():
        if key in RESERVED_PROPERTIES:
            raise ProxyException(
                v2.ILLEGAL_MESSAGE_PROPERTY_KEY,
                f"user property {key!r} is one of the broker's own properties; rename it",
            )
        if not key or _has_separator(key) or _has_separator(value):
            raise ProxyException(
                v2.ILLEGAL_MESSAGE_PROPERTY_KEY,
                f"user property {key!r}={value[:80]!r} is empty or contains \\x01 / \\x02",
            )
        props[key] = value
    if len(props) > config.max_user_property_count:
        raise ProxyException(
            v2.MESSAGE_PROPERTIES_TOO_LARGE,
            f"{len(props)} user properties, over the limit of {config.max_user_property_count}",
        )
    if sp.HasField("tag"):
        tag = sp.tag
        if not tag.strip() or "|" in tag or _has_separator(tag):
            raise ProxyException(v2.ILLEGAL_MESSAGE_TAG, f"tag {tag!r} is blank or contains '|'")
        props[MC.PROPERTY_TAGS] = tag
    if sp.keys:
        for key in sp.keys:
            if not key.strip() or _has_separator(key):
                raise ProxyException(v2.ILLEGAL_MESSAGE_KEY, f"message key {key!r} is blank")
        props[MC.PROPERTY_KEYS] = MC.KEY_SEPARATOR.join(sp.keys)
    props[MC.PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX] = sp.message_id
    group = sp.message_group if sp.HasField("message_group") else ""
    kind = sp.message_type
    if group:
        if len(group.encode()) > config.max_message_group_size or _has_separator(group) or not group.strip():
            raise ProxyException(
                v2.ILLEGAL_MESSAGE_GROUP,
                f"message group {group[:80]!r} is blank or over {config.max_message_group_size} bytes",
            )
        props[MC.PROPERTY_SHARDING_KEY] = group
    if sp.HasField("delivery_timestamp"):
        deliver_ms = timestamp_ms(sp.delivery_timestamp)
        check_delivery_time(deliver_ms, config, now_ms)
        props[PROPERTY_TIMER_DELIVER_MS] = str(deliver_ms)
    if sp.HasField("trace_context") and sp.trace_context:
        props[PROPERTY_TRACE_CONTEXT] = sp.trace_context
    # SendMessageActivity: __BORNHOST, read back as born_host; a blank one is the sender's address
    born_host = sp.born_host if sp.born_host.strip() else remote_address
    if born_host.strip():
        props[PROPERTY_BORN_HOST] = born_host
    if kind == v2.TRANSACTION:
        props[MC.PROPERTY_TRANSACTION_PREPARED] = "true"
        if producer_group:
            props[MC.PROPERTY_PRODUCER_GROUP] = producer_group
    _check_type_properties(kind, group, sp.HasField("delivery_timestamp"), sp.message_id)
    encoded = encode_properties(props)
    limit = min(config.max_user_property_size, MAX_PROPERTIES_SIZE)
    if len(encoded) > limit:
        raise ProxyException(
            v2.MESSAGE_PROPERTIES_TOO_LARGE,
            f"message {sp.message_id!r}: properties of {len(encoded)} bytes, over the limit of {limit}",
        )
    born = timestamp_ms(sp.born_timestamp) if sp.HasField("born_timestamp") else _now_ms()
    return MessageToSend(topic, body, encoded, born, sp.message_id, kind, group)


def _check_type_properties(kind: int, group: str, delayed: bool, message_id: str) -> None:
    """MESSAGE_PROPERTY_CONFLICT_WITH_TYPE: a message group only on FIFO, a delivery time only on DELAY."""
    if kind == v2.FIFO and not group:
        raise ProxyException(
            v2.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE, f"FIFO message {message_id!r} has no message group"
        )
    if group and kind != v2.FIFO:
        raise ProxyException(
            v2.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE,
            f"message {message_id!r} has a message group but type {v2.MessageType.Name(kind)}",  # type: ignore[arg-type]
        )
    if delayed and kind not in (v2.DELAY, v2.MESSAGE_TYPE_UNSPECIFIED):
        raise ProxyException(
            v2.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE,
            f"message {message_id!r} has a delivery timestamp but type {v2.MessageType.Name(kind)}",  # type: ignore[arg-type]
        )


_RECALL_V1 = "v1"


def recall_handle(topic: str, broker_name: str, deliver_ms: int, message_id: str) -> str:
    """RocketMQ 5.3's RecallMessageHandle (v1): base64url of "v1 topic brokerName timestamp messageId"."""
    raw = " ".join((_RECALL_V1, topic, broker_name, str(deliver_ms), message_id))
    return base64.urlsafe_b64encode(raw.encode()).decode()


def parse_recall_handle(handle: str) -> tuple[str, str, str]:
    """(topic, broker name, message id) of a recall handle; BAD_REQUEST naming it if it is not one."""
    try:
        parts = base64.urlsafe_b64decode(handle.encode()).decode().split(" ")
    except (ValueError, UnicodeError):
        parts = []
    if len(parts) != 5 or parts[0] != _RECALL_V1 or not all(parts):
        raise ProxyException(v2.BAD_REQUEST, f"recall handle {handle[:64]!r} is not one this broker gave")
    return parts[1], parts[2], parts[4]


def check_delivery_time(deliver_ms: int, config: ProxyConfig, now_ms: int | None = None) -> None:
    """ILLEGAL_DELIVERY_TIME for a delivery time further ahead than ``max_delay_time_mills`` (the
    proxy's check); a time already past delivers at once."""
    wait = deliver_ms - (_now_ms() if now_ms is None else now_ms)
    if wait > config.max_delay_time_mills:
        raise ProxyException(
            v2.ILLEGAL_DELIVERY_TIME,
            f"delivery timestamp {deliver_ms} is {wait} ms ahead, over maxDelayTimeMills "
            f"{config.max_delay_time_mills} ms",
        )


def _decoded_body(msg: v2.Message) -> bytes:
    """The body as it is stored: a GZIP body is inflated (pymq readers expect the payload)."""
    if msg.system_properties.body_encoding == v2.GZIP:
        try:
            return gzip.decompress(msg.body)
        except (OSError, EOFError, zlib.error):
            try:
                return zlib.decompress(msg.body)
            except zlib.error as err:
                raise ProxyException(
                    v2.MESSAGE_CORRUPTED, f"message body says GZIP but does not inflate: {err}"
                ) from None
    return msg.body


def timestamp_ms(ts: Timestamp) -> int:
    """A Timestamp in ms, unchecked: protobuf's ToMilliseconds raises for one past year 9999, and such
    a delivery time is ILLEGAL_DELIVERY_TIME, not a failure (rocketmq-python-client 5.1.2 sends
    ``delivery_timestamp`` milliseconds as seconds)."""
    return int(ts.seconds) * 1000 + int(ts.nanos) // 1_000_000


def _has_separator(text: str) -> bool:
    return "\x01" in text or "\x02" in text


def _now_ms() -> int:
    return int(time.time() * 1000)


@dataclass(frozen=True, slots=True)
class StoredMessage:
    """The fields of one stored record the proxy needs (see :func:`parse_record`)."""

    topic: str
    queue_id: int
    queue_offset: int
    commit_log_offset: int
    body: bytes
    properties: dict[str, str]
    born_timestamp: int
    store_timestamp: int
    store_host: bytes
    reconsume_times: int

    @property
    def message_id(self) -> str:
        """UNIQ_KEY (the client's id), else the offsetMsgId."""
        return (self.properties.get(MC.PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX)
                or offset_msg_id(self.store_host, self.commit_log_offset))

    @property
    def tag(self) -> str:
        return self.properties.get(MC.PROPERTY_TAGS, "")


def parse_record(record: bytes | memoryview) -> StoredMessage:
    """One record image (``pymq_proto.record``) as a :class:`StoredMessage`."""
    h = HEADER.unpack_from(record)
    total, body_len = h[0], h[13]
    t0, t1, p0, p1 = split_tail(record, 0, total, body_len)
    return StoredMessage(
        topic=bytes(record[t0:t1]).decode(), queue_id=h[3], queue_offset=h[5], commit_log_offset=h[6],
        body=bytes(record[HEADER_SIZE:HEADER_SIZE + body_len]),
        properties=decode_properties(bytes(record[p0:p1])), born_timestamp=h[8], store_timestamp=h[9],
        store_host=h[10], reconsume_times=h[11],
    )


def split_records(records: bytes) -> list[StoredMessage]:
    """Records back to back (a pull's answer) as :class:`StoredMessage` s."""
    out = []
    view = memoryview(records)
    pos = 0
    while pos < len(records):
        (total,) = HEADER.unpack_from(view, pos)[:1]
        out.append(parse_record(view[pos:pos + total]))
        pos += total
    return out


def _host(store_host: bytes) -> str:
    ip = ".".join(str(b) for b in store_host[:4])
    return f"{ip}:{int.from_bytes(store_host[4:8], 'big')}"


def to_v2_message(
    m: StoredMessage, *, receipt_handle: str = "", delivery_attempt: int = 0, invisible_ms: int = 0,
    topic: str = "",
) -> v2.Message:
    """A stored message as the proxy answers it (GrpcConverter.buildMessage).

    ``topic``: the topic to show instead of the stored one (a half message's real topic).
    """
    props = m.properties
    topic = topic or m.topic
    if is_retry_topic(topic) and props.get(MC.PROPERTY_RETRY_TOPIC):
        topic = props[MC.PROPERTY_RETRY_TOPIC]
    out = v2.Message(body=m.body)
    out.topic.name = topic
    for key, value in props.items():
        if key not in RESERVED_PROPERTIES:
            out.user_properties[key] = value
    sp = out.system_properties
    if MC.PROPERTY_TAGS in props:
        sp.tag = props[MC.PROPERTY_TAGS]
    if props.get(MC.PROPERTY_KEYS):
        sp.keys.extend(k for k in props[MC.PROPERTY_KEYS].split(MC.KEY_SEPARATOR) if k)
    sp.message_id = m.message_id
    # GrpcConverter.buildSystemProperties: MD5, uppercase hex (BinaryUtil.generateMd5). Not CRC32:
    # the Java client writes a CRC32 without leading zeros, the Python client with them, so one of
    # the two took every 16th message for corrupted (a push consumer dead-letters those unread)
    sp.body_digest.type = v2.MD5
    sp.body_digest.checksum = hashlib.md5(m.body).hexdigest().upper()
    sp.body_encoding = v2.IDENTITY
    sp.message_type = message_type_of(props)
    sp.born_timestamp.FromMilliseconds(m.born_timestamp)
    sp.store_timestamp.FromMilliseconds(m.store_timestamp)
    sp.store_host = _host(m.store_host)
    if props.get(PROPERTY_TIMER_DELIVER_MS, "").isdigit():
        sp.delivery_timestamp.FromMilliseconds(int(props[PROPERTY_TIMER_DELIVER_MS]))
    sp.queue_id = m.queue_id
    sp.queue_offset = m.queue_offset
    if props.get(MC.PROPERTY_SHARDING_KEY):
        sp.message_group = props[MC.PROPERTY_SHARDING_KEY]
    if props.get(PROPERTY_TRACE_CONTEXT):
        sp.trace_context = props[PROPERTY_TRACE_CONTEXT]
    if props.get(PROPERTY_BORN_HOST, "").strip():
        sp.born_host = props[PROPERTY_BORN_HOST]
    if receipt_handle:
        sp.receipt_handle = receipt_handle
        sp.invisible_duration.FromMilliseconds(invisible_ms)
    sp.delivery_attempt = delivery_attempt or m.reconsume_times + 1
    origin_topic = props.get(MC.PROPERTY_DLQ_ORIGIN_TOPIC)
    origin_id = props.get(MC.PROPERTY_DLQ_ORIGIN_MESSAGE_ID)
    if origin_topic is not None and origin_id is not None:  # GrpcConverter: a dead letter's origin
        sp.dead_letter_queue.topic = origin_topic
        sp.dead_letter_queue.message_id = origin_id
    return out


def message_type_of(props: dict[str, str]) -> v2.MessageType.ValueType:
    """What a stored message is, from its properties (the proxy's rule)."""
    if props.get(MC.PROPERTY_TRANSACTION_PREPARED) == "true":
        return v2.TRANSACTION
    if props.get(MC.PROPERTY_SHARDING_KEY):
        return v2.FIFO
    if PROPERTY_TIMER_DELIVER_MS in props or props.get(MC.PROPERTY_DELAY_TIME_LEVEL, "0") not in ("0", "-1"):
        return v2.DELAY
    return v2.NORMAL

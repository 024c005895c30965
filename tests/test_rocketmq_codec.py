"""RocketMQ's record codec (pyspark_pymq.rocketmq.codec), checked without a broker.

Three independent sources of truth:

- records and batch bodies produced by RocketMQ 5.3.3's own Java code
  (``MessageDecoder.encode`` with its LZ4/zstd/zlib compressors,
  ``encodeMessages``, ``createMessageId``, ``string2messageProperties``) and
  what ``MessageDecoder.decodes`` made of them, pasted below as constants;
- a per-record reference encoder written here straight from
  ``MessageDecoder.encode`` / ``MessageExtEncoder.encode`` (both magic codes,
  IPv4 and IPv6 hosts, which the Java ``encode`` cannot all produce), with the
  decoded message each record must give;
- a reference reader of ``encodeMessages``' layout for batch bodies.

Both decoders are checked against the expectations, and ``decode_to_arrow``
against rows built here from those expectations; tests also pin whether the
fast path or the fallback ran.
"""

from __future__ import annotations

import ipaddress
import struct
import time
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any

import pyarrow as pa
import pytest
from column_subsets import SUBSETS
from pyspark_pymq.client.message import MessageExt
from pyspark_pymq.rocketmq import codec
from pyspark_pymq.rocketmq.api import parse_offset_msg_ids
from pyspark_pymq.rocketmq.codec import (
    MessageSysFlag,
    RocketMQMessageExt,
    create_message_id,
    decode_batch,
    decode_message_id,
    decode_messages,
    decode_to_arrow,
    encode_batch,
    encode_batch_columns,
    filter_batch_by_tags,
    filter_by_tags,
    message_properties_to_string,
    string_to_message_properties,
)
from pyspark_pymq.spark.rows import messages_to_batch
from pyspark_pymq.spark.schema import arrow_schema, project

V1 = -626843481  # MessageDecoder.MESSAGE_MAGIC_CODE
V2 = -626843477  # MessageDecoder.MESSAGE_MAGIC_CODE_V2
COMPRESSED = MessageSysFlag.COMPRESSED_FLAG
BORN_V6 = 0x10
STORE_V6 = 0x20
BROKER = "broker-a"

# --------------------------------------------------------------------------- Java golden data
# Made by RocketMQ 5.3.3's jars (rocketmq-common, lz4-java, zstd-jni) on JDK 17:
# MessageDecoder.encode(msgExt, needCompress=true) of nine MessageExt, then
# MessageDecoder.decodes (the client's decoder) of their concatenation.

BIG = b"abcdefgh" * 375
RU_KEY = "\u043a\u043b\u044e\u0447"  # Cyrillic, spelt out for the linter
RU_VALUE = "\u0437\u043d\u0430\u0447\u0435\u043d\u0438\u0435 ✓"
JAVA_BODIES = [b"hello", b"v6 body", BIG, BIG, BIG, BIG, b"", "körper ✓".encode(), b"x"]
JAVA_RECORDS: list[tuple[str, dict[str, Any]]] = [
    # TopicTest q3@42 sysFlag 0
    (
        "000000CCDAA320A73610A6860000000300000007000000000000002A00000000075BCD15000000000000018BCFE5687B"
        "C0A801140000D4310000018BCFE569C87F00000100002A9F0000000200000000000000000000000568656C6C6F09546F"
        "706963546573740063554E49515F4B455901374630303030303130303031423441413043384131463242334334443030"
        "303002544147530154616741024B455953016B31206B32206B330257414954017472756502434C555354455201446566"
        "61756C74436C757374657202",
        {"topic": "TopicTest",
         "queue_id": 3,
         "flag": 7,
         "queue_offset": 42,
         "commit_log_offset": 123456789,
         "sys_flag": 0,
         "born_timestamp": 1700000000123,
         "store_timestamp": 1700000000456,
         "reconsume_times": 2,
         "prepared_transaction_offset": 0,
         "body_crc": 907060870,
         "store_size": 204,
         "body_len": 5,
         "properties": {"CLUSTER": "DefaultCluster",
                        "KEYS": "k1 k2 k3",
                        "TAGS": "TagA",
                        "UNIQ_KEY": "7F0000010001B4AA0C8A1F2B3C4D0000",
                        "WAIT": "true"},
         "msg_id": "7F0000010001B4AA0C8A1F2B3C4D0000",
         "offset_msg_id": "7F00000100002A9F00000000075BCD15",
         "born_host": "/192.168.1.20:54321",
         "store_host": "/127.0.0.1:10911"},
    ),
    # TopicTest q3@43 sysFlag 48
    (
        "00000094DAA320A77BDA25750000000300000000000000000000002B00000000075BCDE7000000300000018BCFE56BE8"
        "FE80000000000000000100020003000400009C400000018BCFE56BE920010DB800000000000000000000000700002A9F"
        "00000000000000000000000000000007763620626F647909546F70696354657374001154414753015461674202757365"
        "72017602",
        {"topic": "TopicTest",
         "queue_id": 3,
         "flag": 0,
         "queue_offset": 43,
         "commit_log_offset": 123456999,
         "sys_flag": 48,
         "born_timestamp": 1700000001000,
         "store_timestamp": 1700000001001,
         "reconsume_times": 0,
         "prepared_transaction_offset": 0,
         "body_crc": 2077894005,
         "store_size": 148,
         "body_len": 7,
         "properties": {"TAGS": "TagB", "user": "v"},
         "msg_id": "20010DB800000000000000000000000700002A9F00000000075BCDE7",
         "offset_msg_id": "20010DB800000000000000000000000700002A9F00000000075BCDE7",
         "born_host": "/[fe80:0:0:0:1:2:3:4]:40000",
         "store_host": "/[2001:db8:0:0:0:0:0:7]:10911"},
    ),
    # TopicTest q1@44 sysFlag 0
    (
        "000000B9DAA320A74FD4987A0000000100000000000000000000002C000000000BEBC200000000010000018BCFE56FD0"
        "C0A801140000D4310000018BCFE571C47F00000100002A9F00000000000000000000000000000024785EEDC531010020"
        "0800B0AC0808FD1358C3637B1627ABEF6CD8B66DDBFEF607792899F909546F706963546573740031554E49515F4B4559"
        "014143313130303031303030303030303030303030303030303030303030300254414753015A697002",
        {"topic": "TopicTest",
         "queue_id": 1,
         "flag": 0,
         "queue_offset": 44,
         "commit_log_offset": 200000000,
         "sys_flag": 0,
         "born_timestamp": 1700000002000,
         "store_timestamp": 1700000002500,
         "reconsume_times": 0,
         "prepared_transaction_offset": 0,
         "body_crc": 1339332730,
         "store_size": 185,
         "body_len": 3000,
         "properties": {"TAGS": "Zip", "UNIQ_KEY": "AC1100010000000000000000000000"},
         "msg_id": "AC1100010000000000000000000000",
         "offset_msg_id": "7F00000100002A9F000000000BEBC200",
         "born_host": "/192.168.1.20:54321",
         "store_host": "/127.0.0.1:10911"},
    ),
    # TopicTest q1@45 sysFlag 768
    (
        "000000B9DAA320A74FD4987A0000000100000000000000000000002D000000000BEBD1A0000003010000018BCFE56FD1"
        "C0A801140000D4310000018BCFE571C57F00000100002A9F00000000000000000000000000000024785EEDC531010020"
        "0800B0AC0808FD1358C3637B1627ABEF6CD8B66DDBFEF607792899F909546F706963546573740031554E49515F4B4559"
        "014143313130303031303030303030303030303030303030303030303030310254414753015A697002",
        {"topic": "TopicTest",
         "queue_id": 1,
         "flag": 0,
         "queue_offset": 45,
         "commit_log_offset": 200004000,
         "sys_flag": 768,
         "born_timestamp": 1700000002001,
         "store_timestamp": 1700000002501,
         "reconsume_times": 0,
         "prepared_transaction_offset": 0,
         "body_crc": 1339332730,
         "store_size": 185,
         "body_len": 3000,
         "properties": {"TAGS": "Zip", "UNIQ_KEY": "AC1100010000000000000000000001"},
         "msg_id": "AC1100010000000000000000000001",
         "offset_msg_id": "7F00000100002A9F000000000BEBD1A0",
         "born_host": "/192.168.1.20:54321",
         "store_host": "/127.0.0.1:10911"},
    ),
    # TopicTest q1@46 sysFlag 256
    (
        "000000C1DAA320A74FD4987A0000000100000000000000000000002E000000000BEBE140000001010000018BCFE56FD2"
        "C0A801140000D4310000018BCFE571C67F00000100002A9F0000000000000000000000000000002C04224D186070731D"
        "0000008F61626364656667680800FFFFFFFFFFFFFFFFFFFFFFA35064656667680000000009546F706963546573740031"
        "554E49515F4B4559014143313130303031303030303030303030303030303030303030303030320254414753015A6970"
        "02",
        {"topic": "TopicTest",
         "queue_id": 1,
         "flag": 0,
         "queue_offset": 46,
         "commit_log_offset": 200008000,
         "sys_flag": 256,
         "born_timestamp": 1700000002002,
         "store_timestamp": 1700000002502,
         "reconsume_times": 0,
         "prepared_transaction_offset": 0,
         "body_crc": 1339332730,
         "store_size": 193,
         "body_len": 3000,
         "properties": {"TAGS": "Zip", "UNIQ_KEY": "AC1100010000000000000000000002"},
         "msg_id": "AC1100010000000000000000000002",
         "offset_msg_id": "7F00000100002A9F000000000BEBE140",
         "born_host": "/192.168.1.20:54321",
         "store_host": "/127.0.0.1:10911"},
    ),
    # TopicTest q1@47 sysFlag 512
    (
        "000000B0DAA320A74FD4987A0000000100000000000000000000002F000000000BEBF0E0000002010000018BCFE56FD3"
        "C0A801140000D4310000018BCFE571C77F00000100002A9F0000000000000000000000000000001B28B52FFD00587C00"
        "004061626364656667680100AD9B5FB801000009546F706963546573740031554E49515F4B4559014143313130303031"
        "303030303030303030303030303030303030303030330254414753015A697002",
        {"topic": "TopicTest",
         "queue_id": 1,
         "flag": 0,
         "queue_offset": 47,
         "commit_log_offset": 200012000,
         "sys_flag": 512,
         "born_timestamp": 1700000002003,
         "store_timestamp": 1700000002503,
         "reconsume_times": 0,
         "prepared_transaction_offset": 0,
         "body_crc": 1339332730,
         "store_size": 176,
         "body_len": 3000,
         "properties": {"TAGS": "Zip", "UNIQ_KEY": "AC1100010000000000000000000003"},
         "msg_id": "AC1100010000000000000000000003",
         "offset_msg_id": "7F00000100002A9F000000000BEBF0E0",
         "born_host": "/192.168.1.20:54321",
         "store_host": "/127.0.0.1:10911"},
    ),
    # %RETRY%GroupA q0@9 sysFlag 0
    (
        "000000D2DAA320A70000000000000000000000000000000000000009000000000BEC0080000000000000018BCFE573B8"
        "C0A801140000D4310000018BCFE573B97F00000100002A9F000000030000000000000000000000000D25524554525925"
        "47726F757041006A52455452595F544F50494301546F70696354657374024F524947494E5F4D4553534147455F494401"
        "3746303030303031303030303241394630303030303030303037354243443135025245414C5F544F5049430125524554"
        "52592547726F7570410244454C4159013502",
        {"topic": "%RETRY%GroupA",
         "queue_id": 0,
         "flag": 0,
         "queue_offset": 9,
         "commit_log_offset": 200016000,
         "sys_flag": 0,
         "born_timestamp": 1700000003000,
         "store_timestamp": 1700000003001,
         "reconsume_times": 3,
         "prepared_transaction_offset": 0,
         "body_crc": 0,
         "store_size": 210,
         "body_len": 0,
         "properties": {"DELAY": "5",
                        "ORIGIN_MESSAGE_ID": "7F00000100002A9F00000000075BCD15",
                        "REAL_TOPIC": "%RETRY%GroupA",
                        "RETRY_TOPIC": "TopicTest"},
         "msg_id": "7F00000100002A9F000000000BEC0080",
         "offset_msg_id": "7F00000100002A9F000000000BEC0080",
         "born_host": "/192.168.1.20:54321",
         "store_host": "/127.0.0.1:10911"},
    ),
    # 主题 q0@10 sysFlag 0
    (
        "0000006CDAA320A757146BBD0000000000000000000000000000000A000000000BEC0274000000000000018BCFE577A0"
        "C0A801140000D4310000018BCFE577A17F00000100002A9F0000000000000000000000000000000B6BC3B67270657220"
        "E29C9306E4B8BBE9A2980000",
        {"topic": "主题",
         "queue_id": 0,
         "flag": 0,
         "queue_offset": 10,
         "commit_log_offset": 200016500,
         "sys_flag": 0,
         "born_timestamp": 1700000004000,
         "store_timestamp": 1700000004001,
         "reconsume_times": 0,
         "prepared_transaction_offset": 0,
         "body_crc": 1460956093,
         "store_size": 108,
         "body_len": 11,
         "properties": {},
         "msg_id": "7F00000100002A9F000000000BEC0274",
         "offset_msg_id": "7F00000100002A9F000000000BEC0274",
         "born_host": "/192.168.1.20:54321",
         "store_host": "/127.0.0.1:10911"},
    ),
    # T q0@11 sysFlag 0
    (
        "00000087DAA320A70CDC16830000000000000000000000000000000B000000000BEC0468000000000000018BCFE577A0"
        "C0A801140000D4310000018BCFE577A17F00000100002A9F00000000000000000000000500000001780154002AD0BAD0"
        "BBD18ED18701D0B7D0BDD0B0D187D0B5D0BDD0B8D0B520E29C93025441475301E6A087E7ADBE02",
        {"topic": "T",
         "queue_id": 0,
         "flag": 0,
         "queue_offset": 11,
         "commit_log_offset": 200017000,
         "sys_flag": 0,
         "born_timestamp": 1700000004000,
         "store_timestamp": 1700000004001,
         "reconsume_times": 0,
         "prepared_transaction_offset": 5,
         "body_crc": 215750275,
         "store_size": 135,
         "body_len": 1,
         "properties": {"TAGS": "标签", RU_KEY: RU_VALUE},
         "msg_id": "7F00000100002A9F000000000BEC0468",
         "offset_msg_id": "7F00000100002A9F000000000BEC0468",
         "born_host": "/192.168.1.20:54321",
         "store_host": "/127.0.0.1:10911"},
    ),
]

# MessageDecoder.encodeMessages of three Message: (body, flag, messageProperties2String).
JAVA_BATCH_MESSAGES = [
    (b"body-1", 0,
     "KEYS\x01k1 k2\x02UNIQ_KEY\x010123456789ABCDEF0123456789ABCDEF\x02WAIT\x01true\x02TAGS\x01TagA\x02"),
    ("ünï ✓".encode(), 9, "WAIT\x01true\x02"),
    (b"", 0, ""),
]
JAVA_BATCH = (
    "0000006500000000000000000000000000000006626F64792D3100494B455953016B31206B3202554E49515F4B4559"
    "0130313233343536373839414243444546303132333435363738394142434445460257414954017472756502544147"
    "530154616741020000002900000000000000000000000900000009C3BC6EC3AF20E29C93000A574149540174727565"
    "0200000016000000000000000000000000000000000000"
)

# string2messageProperties of each string, as Java returned it.
JAVA_PROPERTIES: list[tuple[bytes, dict[str, str]]] = [
    (b"", {}),
    (b"a\x01b\x02", {"a": "b"}),
    (b"a\x01b", {"a": "b"}),
    (b"k\x01\x02", {}),
    (b"\x01v\x02", {}),
    (b"a\x01b\x01c\x02", {"a": "b\x01c"}),
    (b"noval\x02x\x01y\x02", {"x": "y"}),
    (b"a\x011\x02a\x012\x02", {"a": "2"}),
    (b"\x02\x02a\x01b\x02\x02", {"a": "b"}),
    (b"ab\x02c\x01d", {"c": "d"}),
    (b"k\x01v\x02kk", {"k": "v"}),
    (f"{RU_KEY}\x01{RU_VALUE}\x02标签\x01值\x02".encode(),
     {RU_KEY: RU_VALUE, "标签": "值"}),
    (b"k\x01\xff\xfev\x02x\x01\xe2\x82\x02", {"k": "\ufffd\ufffdv", "x": "\ufffd"}),
    (b"x\x01\x02y\x01z", {"y": "z"}),
    (b"a\x01", {}),
    (b"\x01\x02", {}),
    (b"a\x01\x01\x02", {"a": "\x01"}),
    (b"a", {}),
    ("😀\x01🎉\x02".encode(), {"😀": "🎉"}),
    (b"k\x01\xf0\x9f\x98\x02", {"k": "\ufffd"}),
    (b"ab\x01\x02", {}),
    (b"abc\x01\x02d\x01e", {"d": "e"}),
    (b"\x01ab\x02c\x01\x01", {"c": "\x01"}),
]


def rmq(messages: Sequence[MessageExt]) -> list[RocketMQMessageExt]:
    """The messages as the RocketMQ decoder's own type (it promises ``MessageExt`` only)."""
    assert all(isinstance(m, RocketMQMessageExt) for m in messages)
    return [m for m in messages if isinstance(m, RocketMQMessageExt)]


def java_host(text: str) -> tuple[Any, int]:
    """(address, port) of Java's InetSocketAddress.toString(), e.g. ``/[fe80:0:0:0:1:2:3:4]:40000``."""
    host, _, port = text.lstrip("/").rpartition(":")
    return ipaddress.ip_address(host.strip("[]")), int(port)


def our_host(text: str) -> tuple[Any, int]:
    host, _, port = text.rpartition(":")
    return ipaddress.ip_address(host.strip("[]")), int(port)


def test_java_records_decode_as_java_decoded_them() -> None:
    data = bytes.fromhex("".join(h for h, _ in JAVA_RECORDS))
    messages = rmq(decode_messages(data, BROKER))
    assert len(messages) == len(JAVA_RECORDS) == len(JAVA_BODIES)
    for m, (_, java), body in zip(messages, JAVA_RECORDS, JAVA_BODIES, strict=True):
        assert isinstance(m, RocketMQMessageExt)
        assert m.body == body and len(body) == java["body_len"]
        for name in ("topic", "queue_id", "flag", "queue_offset", "commit_log_offset", "sys_flag",
                     "born_timestamp", "store_timestamp", "reconsume_times", "prepared_transaction_offset",
                     "body_crc", "store_size", "properties", "msg_id", "offset_msg_id"):
            assert getattr(m, name) == java[name], name
        assert our_host(m.born_host) == java_host(java["born_host"])
        assert our_host(m.store_host) == java_host(java["store_host"])
        assert m.broker_name == BROKER
        assert m.tags == java["properties"].get("TAGS")
    # the compressed ones: zlib (type 0 and 3), LZ4 and zstd, inflated and COMPRESSED cleared
    assert [m.sys_flag for m in messages[2:6]] == [0, 0x300, 0x100, 0x200]
    assert messages[0].keys == ("k1", "k2", "k3")
    assert messages[1].offset_msg_id == "20010DB800000000000000000000000700002A9F00000000075BCDE7"


def test_java_records_to_arrow_on_the_fast_path(monkeypatch: pytest.MonkeyPatch) -> None:
    data = bytes.fromhex("".join(h for h, _ in JAVA_RECORDS))
    reference = decode_messages(data, BROKER)
    no_fallback(monkeypatch)
    # one queue's pull holds one topic: read the TopicTest records alone, then all of them
    topic_test = bytes.fromhex("".join(h for h, j in JAVA_RECORDS if j["topic"] == "TopicTest"))
    batch = decode_to_arrow(topic_test, topic="TopicTest", broker_name=BROKER, retry=False)
    assert batch.num_rows == 6
    assert batch.equals(messages_to_batch(reference[:6], read_from="TopicTest", retry=False))
    assert batch.column("body").to_pylist() == JAVA_BODIES[:6]
    everything = decode_to_arrow(data, topic="TopicTest", broker_name=BROKER, retry=False)
    assert everything.column("topic").to_pylist() == [j["topic"] for _, j in JAVA_RECORDS]
    assert everything.equals(messages_to_batch(reference, read_from="TopicTest", retry=False))


def test_java_batch_body() -> None:
    body = encode_batch(JAVA_BATCH_MESSAGES)
    assert body.hex().upper() == JAVA_BATCH
    columns = encode_batch_columns(
        pa.array([b for b, _, _ in JAVA_BATCH_MESSAGES]),
        pa.array([p for _, _, p in JAVA_BATCH_MESSAGES]),
        [f for _, f, _ in JAVA_BATCH_MESSAGES],
    )
    assert columns == body
    assert read_batch(body) == [(b, f, p.encode()) for b, f, p in JAVA_BATCH_MESSAGES]


def test_java_message_ids() -> None:
    # MessageDecoder.createMessageId(new InetSocketAddress(ip, port), offset)
    v4 = bytes([127, 0, 0, 1]) + struct.pack(">i", 10911)
    v6 = ipaddress.ip_address("2001:db8::7").packed + struct.pack(">i", 10911)
    assert create_message_id(v4, 123456789) == "7F00000100002A9F00000000075BCD15"
    assert create_message_id(v6, 123456789) == "20010DB800000000000000000000000700002A9F00000000075BCD15"
    assert create_message_id(bytes([10, 0, 0, 255]) + struct.pack(">i", 65535), 2**63 - 1) == (
        "0A0000FF0000FFFF7FFFFFFFFFFFFFFF"
    )
    # MessageDecoder.decodeMessageId
    assert decode_message_id("7F00000100002A9F00000000075BCD15") == ("127.0.0.1", 10911, 123456789)
    assert decode_message_id("7f00000100002a9f00000000075bcd15") == ("127.0.0.1", 10911, 123456789)
    assert decode_message_id(create_message_id(v6, 99)) == ("2001:db8::7", 10911, 99)
    for host, port, offset in [("10.1.2.3", 1, 0), ("255.255.255.255", 2**31 - 1, 2**63 - 1),
                               ("::1", 8080, 5), ("fe80::1:2:3:4", 40000, 2**40)]:
        raw = ipaddress.ip_address(host).packed + struct.pack(">i", port)
        assert decode_message_id(create_message_id(raw, offset)) == (host, port, offset)
    for bad in ("", "7F00", "XYZ", "7F00000100002A9F00000000075BCD1"):
        with pytest.raises(ValueError, match="offsetMsgId"):
            decode_message_id(bad)
    with pytest.raises(ValueError, match=r"8 .* or 20"):
        create_message_id(b"\x7f\x00\x00\x01", 1)


def test_send_answers_offset_msg_ids_decode_at_once_or_one_by_one() -> None:
    # SendMessageResponseHeader.msgId: the offsetMsgId of each stored message, comma-joined
    v4 = bytes([10, 0, 0, 7]) + struct.pack(">i", 10911)
    v6 = ipaddress.ip_address("2001:db8::7").packed + struct.pack(">i", 10911)
    for host in (v4, v6):
        offsets = (*range(0, 300 * 40, 300), 2**63 - 1)
        joined = ",".join(create_message_id(host, o) for o in offsets)
        assert parse_offset_msg_ids(joined) == (host, offsets)
        assert parse_offset_msg_ids(joined.lower()) == (host, offsets)
    one = create_message_id(v4, 5)
    assert parse_offset_msg_ids(one) == (v4, (5,))
    assert parse_offset_msg_ids("") == (b"", ())
    # ids the batch decode cannot take are read one by one; what is not an id is left out
    mixed = f"{one},{create_message_id(v6, 6)}"
    assert parse_offset_msg_ids(mixed) == (v6, (5, 6))
    assert parse_offset_msg_ids(f"ZZ{one[2:]},{create_message_id(v4, 7)}") == (v4, (7,))
    assert parse_offset_msg_ids(f" {one[1:]},{one}") == (v4, (5,))  # fromhex's whitespace: not an id
    assert parse_offset_msg_ids(f"{one},") == (v4, (5,))
    assert parse_offset_msg_ids("7F00,ABCD") == (b"", ())


@pytest.mark.parametrize(("text", "expected"), JAVA_PROPERTIES)
def test_java_string2message_properties(text: bytes, expected: dict[str, str]) -> None:
    assert string_to_message_properties(text) == expected
    if b"\xff" not in text and b"\xe2\x82\x02" not in text and b"\xf0\x9f\x98\x02" not in text:
        assert string_to_message_properties(text.decode()) == expected


def test_properties_keep_first_position_and_last_value() -> None:
    assert list(string_to_message_properties("a\x011\x02b\x012\x02a\x013\x02").items()) == [
        ("a", "3"), ("b", "2"),
    ]


def test_message_properties_to_string() -> None:
    assert message_properties_to_string({}) == ""
    assert message_properties_to_string({"TAGS": "A", "skip": None, "KEYS": "k1 k2"}) == (
        "TAGS\x01A\x02KEYS\x01k1 k2\x02"
    )
    props = {RU_KEY: RU_VALUE, "UNIQ_KEY": "ABC", "e": ""}
    assert string_to_message_properties(message_properties_to_string(props)) == {
        RU_KEY: RU_VALUE, "UNIQ_KEY": "ABC",  # Java drops the empty value when decoding
    }
    for bad in ({"a\x01": "v"}, {"a": "v\x02"}):
        with pytest.raises(ValueError, match="reserved"):
            message_properties_to_string(bad)


# --------------------------------------------------------------------------- reference encoder


@dataclass
class Rec:
    """One stored message, and (by construction) what decoding it must give."""

    topic: str = "TopicTest"
    body: bytes = b"body"
    properties: dict[str, str] = field(default_factory=dict)
    raw_properties: bytes | None = None  # stored instead of encoding ``properties``
    queue_id: int = 1
    flag: int = 0
    queue_offset: int = 0
    commit_log_offset: int = 0
    sys_flag: int = 0
    born_timestamp: int = 1_700_000_000_000
    born_host: tuple[str, int] = ("192.168.0.10", 50000)
    store_timestamp: int = 1_700_000_000_500
    store_host: tuple[str, int] = ("127.0.0.1", 10911)
    reconsume_times: int = 0
    prepared_transaction_offset: int = 0
    version: int = 1
    stored_body: bytes | None = None  # the compressed body, when COMPRESSED
    total_size_delta: int = 0  # a wrong TOTALSIZE (the Java decoder never reads it)


def encode_stored(r: Rec) -> bytes:
    """MessageExtEncoder.encode / MessageDecoder.encode, field by field (big-endian)."""
    born_ip = ipaddress.ip_address(r.born_host[0]).packed
    store_ip = ipaddress.ip_address(r.store_host[0]).packed
    sys_flag = r.sys_flag | (BORN_V6 if len(born_ip) == 16 else 0) | (STORE_V6 if len(store_ip) == 16 else 0)
    body = r.body if r.stored_body is None else r.stored_body
    topic = r.topic.encode()
    props = r.raw_properties if r.raw_properties is not None else "".join(
        f"{k}\x01{v}\x02" for k, v in r.properties.items()
    ).encode()
    # (byte) / (short) topicLength, as Java casts it
    topic_len = struct.pack(">B", len(topic) & 0xFF) if r.version == 1 else struct.pack(">H", len(topic))
    rest = b"".join([
        struct.pack(">iiiqqiq", zlib.crc32(body) & 0x7FFFFFFF, r.queue_id, r.flag, r.queue_offset,
                    r.commit_log_offset, sys_flag, r.born_timestamp),
        born_ip, struct.pack(">i", r.born_host[1]),
        struct.pack(">q", r.store_timestamp),
        store_ip, struct.pack(">i", r.store_host[1]),
        struct.pack(">iqi", r.reconsume_times, r.prepared_transaction_offset, len(body)), body,
        topic_len, topic,
        struct.pack(">h", len(props)), props,
    ])
    total = 8 + len(rest)
    assert total == 4 + 4 + 4 + 4 + 4 + 8 + 8 + 4 + 8 + len(born_ip) + 4 + 8 + len(store_ip) + 4 + 4 + 8 + (
        4 + len(body)) + len(topic_len) + len(topic) + 2 + len(props)
    return struct.pack(">ii", total + r.total_size_delta, V1 if r.version == 1 else V2) + rest


def expected_offset_msg_id(r: Rec) -> str:
    """What MessageDecoder.decode sets as msgId (createMessageId into a buffer sized by the flag)."""
    ip = ipaddress.ip_address(r.store_host[0])
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        # InetAddress.getByAddress gives an Inet4Address: 16 bytes written of 28
        return (ip.ipv4_mapped.packed + struct.pack(">iq", r.store_host[1], r.commit_log_offset)
                + bytes(12)).hex().upper()
    return (ip.packed + struct.pack(">iq", r.store_host[1], r.commit_log_offset)).hex().upper()


def expected_sys_flag(r: Rec) -> int:
    flag = r.sys_flag
    flag |= BORN_V6 if ":" in r.born_host[0] else 0
    flag |= STORE_V6 if ":" in r.store_host[0] else 0
    if r.body and r.sys_flag & COMPRESSED:
        flag &= ~COMPRESSED
    return flag


def host_text(host: tuple[str, int]) -> str:
    ip = ipaddress.ip_address(host[0])
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return f"[{ip}]:{host[1]}" if ip.version == 6 else f"{ip}:{host[1]}"


def expected_message(r: Rec) -> RocketMQMessageExt:
    offset_id = expected_offset_msg_id(r)
    keys = r.properties.get("KEYS")
    return RocketMQMessageExt(
        topic=r.topic, queue_id=r.queue_id, broker_name=BROKER, queue_offset=r.queue_offset,
        msg_id=r.properties.get("UNIQ_KEY", offset_id), offset_msg_id=offset_id,
        commit_log_offset=r.commit_log_offset, body=r.body, tags=r.properties.get("TAGS"),
        keys=tuple(keys.split(" ")) if keys else (), properties=dict(r.properties),
        born_timestamp=r.born_timestamp, store_timestamp=r.store_timestamp,
        reconsume_times=r.reconsume_times, store_size=len(encode_stored(r)) + r.total_size_delta,
        flag=r.flag, sys_flag=expected_sys_flag(r),
        body_crc=zlib.crc32(r.body if r.stored_body is None else r.stored_body) & 0x7FFFFFFF,
        born_host=host_text(r.born_host), store_host=host_text(r.store_host),
        prepared_transaction_offset=r.prepared_transaction_offset,
    )


def expected_rows(messages: Sequence[MessageExt], read_from: str, retry: bool) -> pa.RecordBatch:
    """The source's rows, from the schema's column meanings (not from the codec)."""
    schema = arrow_schema()
    columns: dict[str, list[Any]] = {f.name: [] for f in schema}
    for m in messages:
        columns["topic"].append(m.properties.get("RETRY_TOPIC", m.topic) if retry else m.topic)
        columns["queue_id"].append(m.queue_id)
        columns["broker_name"].append(m.broker_name)
        columns["queue_offset"].append(m.queue_offset)
        columns["msg_id"].append(m.properties.get("UNIQ_KEY", m.offset_msg_id))
        columns["offset_msg_id"].append(m.offset_msg_id)
        columns["commit_log_offset"].append(m.commit_log_offset)
        columns["tags"].append(m.properties.get("TAGS"))
        keys = m.properties.get("KEYS")
        columns["keys"].append(keys.split(" ") if keys else [])
        columns["body"].append(m.body)
        columns["properties"].append(list(m.properties.items()))
        columns["born_timestamp"].append(m.born_timestamp * 1000)
        columns["store_timestamp"].append(m.store_timestamp * 1000)
        columns["reconsume_times"].append(m.reconsume_times)
        columns["retry_topic"].append(read_from if retry else None)
    return pa.RecordBatch.from_arrays([pa.array(columns[f.name], f.type) for f in schema], schema=schema)


def no_fallback(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make decode_to_arrow fail if it leaves its fast path."""

    def refuse(data: bytes, broker_name: str) -> list[MessageExt]:
        raise AssertionError("decode_to_arrow fell back to decode_messages")

    monkeypatch.setattr(codec, "decode_messages", refuse)


def count_fallbacks(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    calls: list[int] = []
    original = codec.decode_messages

    def counting(data: bytes, broker_name: str) -> list[MessageExt]:
        calls.append(len(data))
        return original(data, broker_name)

    monkeypatch.setattr(codec, "decode_messages", counting)
    return calls


def with_offsets(recs: Sequence[Rec], first_offset: int = 100, first_phy: int = 5_000_000) -> list[Rec]:
    """The records as one queue stores them: consecutive queue offsets, rising commit-log offsets."""
    out, phy = [], first_phy
    for i, r in enumerate(recs):
        r = replace(r, queue_offset=first_offset + i, commit_log_offset=phy)
        out.append(r)
        phy += len(encode_stored(r)) + 1000
    return out


def deflate(body: bytes) -> bytes:
    return zlib.compress(body, 5)  # Java's Deflater(5) + DeflaterOutputStream: a zlib stream


def java_stored_body(index: int) -> bytes:
    """The body as stored (compressed) in ``JAVA_RECORDS[index]`` (IPv4 hosts: BODYLEN at 84)."""
    record = bytes.fromhex(JAVA_RECORDS[index][0])
    (length,) = struct.unpack_from(">i", record, 84)
    return record[88 : 88 + length]


# lz4-java's frame reader refuses Arrow's linked-block frames: store what Java wrote
JAVA_LZ4_BIG = java_stored_body(4)


def arrow_compress(body: bytes, codec_name: str) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.CompressedOutputStream(sink, codec_name) as stream:
        stream.write(body)
    out: bytes = sink.getvalue().to_pybytes()
    return out


def plain(i: int, **kw: Any) -> Rec:
    props = {"UNIQ_KEY": f"AC11000100{i:022X}", "TAGS": f"Tag{i % 3}", "KEYS": f"order-{i} user-{i % 7}",
             "WAIT": "true", "CLUSTER": "DefaultCluster"}
    defaults: dict[str, Any] = {"body": f"payload {i} ".encode() * (1 + i % 4), "properties": props,
                                "reconsume_times": i % 2, "flag": i % 5, "queue_id": 2}
    return Rec(**{**defaults, **kw})


LONG_TOPIC = "T" * 200  # over 127 bytes: stored with MESSAGE_MAGIC_CODE_V2
CASES: dict[str, tuple[list[Rec], str, bool]] = {
    # name: (records, topic read from, retry)
    "v1_ipv4": ([plain(i) for i in range(5)], "TopicTest", False),
    "v2_long_topic": ([plain(i, topic=LONG_TOPIC, version=2) for i in range(4)], LONG_TOPIC, False),
    "v2_short_topic": ([plain(i, version=2) for i in range(3)], "TopicTest", False),
    "v1_and_v2_mixed": ([plain(i, version=1 + i % 2) for i in range(6)], "TopicTest", False),
    "born_ipv6": ([plain(i, born_host=("fe80::1:2:3:4", 40000 + i)) for i in range(3)], "TopicTest", False),
    "store_ipv6": ([plain(i, store_host=("2001:db8::7", 10911)) for i in range(3)], "TopicTest", False),
    "both_ipv6": ([plain(i, born_host=("::1", 1), store_host=("2001:db8::8", 10921)) for i in range(3)],
                  "TopicTest", False),
    "hosts_mixed": ([plain(0), plain(1, born_host=("::2", 5)), plain(2, store_host=("2001:db8::9", 7)),
                     plain(3, born_host=("fe80::9", 6), store_host=("2001:db8::a", 8)), plain(4)],
                    "TopicTest", False),
    "store_ipv4_mapped": ([plain(0, store_host=("::ffff:10.1.2.3", 10911)), plain(1)], "TopicTest", False),
    "empty_properties": ([Rec(body=b"a"), Rec(body=b"bb", properties={}), plain(2)], "TopicTest", False),
    "empty_body": ([Rec(body=b"", properties={"TAGS": "T"}), Rec(body=b"")], "TopicTest", False),
    "unicode": ([Rec(topic="主题", body="körper ✓ 😀".encode(),
                     properties={RU_KEY: RU_VALUE, "TAGS": "标签", "KEYS": f"{RU_KEY}1 😀"})] * 3,
                "主题", False),
    "retry_topic": ([Rec(topic="%RETRY%G",
                         properties={"RETRY_TOPIC": "Orders", "UNIQ_KEY": "AA",
                                     "ORIGIN_MESSAGE_ID": "7F00000100002A9F0000000000000001",
                                     "REAL_TOPIC": "%RETRY%G", "DELAY": "3"},
                         reconsume_times=2),
                     Rec(topic="%RETRY%G", properties={"UNIQ_KEY": "BB"}, reconsume_times=1)],
                    "%RETRY%G", True),
    "retry_flag_on_a_plain_topic": ([plain(0), Rec(properties={"RETRY_TOPIC": "X"})], "TopicTest", True),
    "keys": ([Rec(properties={"KEYS": "k1 k2 k3"}), Rec(properties={"KEYS": "one"}),
              Rec(properties={"KEYS": "a  b "}), Rec(properties={"TAGS": "no keys"})], "TopicTest", False),
    "no_uniq_key": ([Rec(properties={"TAGS": "A"}), plain(1), Rec()], "TopicTest", False),
    "zlib_legacy_type": (
        [plain(i, sys_flag=COMPRESSED, stored_body=deflate(plain(i).body)) for i in range(3)],
        "TopicTest", False,
    ),
    "zlib": ([plain(0, sys_flag=COMPRESSED | 0x300, body=BIG, stored_body=deflate(BIG)), plain(1)],
             "TopicTest", False),
    "lz4": ([plain(0),
             plain(1, sys_flag=COMPRESSED | 0x100, body=BIG, stored_body=JAVA_LZ4_BIG),
             plain(2, sys_flag=COMPRESSED | 0x100, body=BIG, stored_body=arrow_compress(BIG, "lz4"))],
            "TopicTest", False),
    "zstd": ([plain(0, sys_flag=COMPRESSED | 0x200, body=BIG, stored_body=arrow_compress(BIG, "zstd"))],
             "TopicTest", False),
    "compressed_empty_body": (
        [Rec(body=b"", sys_flag=COMPRESSED | 0x300, properties={"TAGS": "x"}), plain(1)], "TopicTest", False
    ),
    "type_bits_without_compression": (
        [plain(0, sys_flag=0x300), plain(1, sys_flag=0x100)], "TopicTest", False
    ),
    "equal_size_many": ([replace(plain(7), properties={**plain(7).properties, "UNIQ_KEY": f"{i:032X}"})
                         for i in range(300)], "TopicTest", False),
    "varying_many": (
        [plain(i, body=bytes(range(256))[: (i * 37) % 256]) for i in range(300)], "TopicTest", False
    ),
    "open_last_entry": ([Rec(raw_properties=b"TAGS\x01A\x02KEYS\x01k1 k2",
                             properties={"TAGS": "A", "KEYS": "k1 k2"}),
                         Rec(raw_properties=b"\x02TAGS\x01B\x02", properties={"TAGS": "B"}),
                         Rec(raw_properties=b"UNIQ_KEY\x01CC", properties={"UNIQ_KEY": "CC"})],
                        "TopicTest", False),
    "dropped_entries": ([Rec(raw_properties=b"k\x01\x02\x01v\x02noval\x02\x02TAGS\x01T\x02x\x01\x02y\x01z",
                             properties={"TAGS": "T", "y": "z"}),
                         Rec(raw_properties=b"a\x01\x02", properties={}),
                         Rec(raw_properties=b"a\x01b\x01c\x02a2\x01\x01\x02",
                             properties={"a": "b\x01c", "a2": "\x01"})],
                        "TopicTest", False),
    "crc_property": ([Rec(raw_properties=b"TAGS\x01A\x02__CRC32#\x014206159850\x02",
                          properties={"TAGS": "A", "__CRC32#": "4206159850"})], "TopicTest", False),
    "topic_differs": (
        [Rec(topic="Other", properties={"TAGS": "A"}), Rec(topic="TopicTest")], "TopicTest", False
    ),
    "prepared_offset": (
        [Rec(prepared_transaction_offset=123456, sys_flag=0x8), plain(1)], "TopicTest", False
    ),
}
# cases the fast path hands to decode_messages on purpose
FALLBACK_CASES: dict[str, tuple[list[Rec], str, bool]] = {
    "duplicate_names": ([Rec(raw_properties=b"a\x011\x02b\x012\x02a\x013\x02",
                             properties={"a": "3", "b": "2"}),
                         plain(1)], "TopicTest", False),
    "invalid_utf8_properties": (
        [Rec(raw_properties=b"k\x01\xff\xfev\x02", properties={"k": "\ufffd\ufffdv"})], "TopicTest", False
    ),
    "invalid_utf8_topic": ([Rec(topic="x", properties={})], "x", False),  # patched below
    "wrong_total_size": ([plain(0, total_size_delta=3), plain(1), plain(2)], "TopicTest", False),
}


def encode_case(recs: Sequence[Rec]) -> bytes:
    return b"".join(encode_stored(r) for r in recs)


def case_data(name: str, recs: list[Rec]) -> bytes:
    data = encode_case(recs)
    if name == "wrong_total_size":  # Java reads fields, not TOTALSIZE: the records still follow each other
        assert struct.unpack_from(">i", data)[0] == len(encode_stored(recs[0])) + 3
    if name == "invalid_utf8_topic":
        at = data.index(b"\x01x\x00\x00")  # V1 topic length 1, "x", no properties
        data = data[:at + 1] + b"\xff" + data[at + 2:]
    return data


def expected_messages(name: str, recs: Sequence[Rec]) -> list[RocketMQMessageExt]:
    out = [expected_message(r) for r in recs]
    if name == "invalid_utf8_topic":
        out = [replace(m, topic="\ufffd") for m in out]
    return out


@pytest.mark.parametrize("name", list(CASES))
def test_decoders_give_the_expected_messages(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    recs, topic, retry = CASES[name]
    recs = with_offsets(recs)
    data = case_data(name, recs)
    expected = expected_messages(name, recs)
    got = decode_messages(data, BROKER)
    assert got == expected
    no_fallback(monkeypatch)
    batch = decode_to_arrow(data, topic=topic, broker_name=BROKER, retry=retry)
    assert batch.schema.equals(arrow_schema())
    assert batch.equals(expected_rows(expected, topic, retry))
    assert batch.equals(messages_to_batch(got, read_from=topic, retry=retry))
    # the cut a bounded read makes: rows at or past end_offset are left out
    for end_offset in (100, 101, 100 + len(recs) // 2, 100 + len(recs), 10**12, -1):
        cut = decode_to_arrow(data, topic=topic, broker_name=BROKER, retry=retry, end_offset=end_offset)
        assert cut.equals(expected_rows([m for m in expected if m.queue_offset < end_offset], topic, retry))
    # a .schema(...) of some columns: those columns as in the whole schema
    for columns in SUBSETS:
        kept = decode_to_arrow(data, topic=topic, broker_name=BROKER, retry=retry, columns=columns)
        assert project(kept, columns).equals(project(batch, columns)), columns


@pytest.mark.parametrize("name", list(FALLBACK_CASES))
def test_fallback_cases(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    recs, topic, retry = FALLBACK_CASES[name]
    recs = with_offsets(recs)
    data = case_data(name, recs)
    expected = expected_messages(name, recs)
    assert decode_messages(data, BROKER) == expected
    calls = count_fallbacks(monkeypatch)
    batch = decode_to_arrow(data, topic=topic, broker_name=BROKER, retry=retry)
    assert calls == [len(data)]
    assert batch.equals(expected_rows(expected, topic, retry))
    cut = decode_to_arrow(data, topic=topic, broker_name=BROKER, retry=retry, end_offset=101)
    assert cut.equals(expected_rows(expected[:1], topic, retry))


def test_columns_that_need_no_properties_do_not_parse_them(monkeypatch: pytest.MonkeyPatch) -> None:
    recs = with_offsets(FALLBACK_CASES["invalid_utf8_properties"][0] + [plain(1)])
    data = encode_case(recs)
    no_fallback(monkeypatch)  # the properties that are not UTF-8 are never looked at

    def refuse(*args: object) -> None:
        raise AssertionError("properties parsed")

    monkeypatch.setattr(codec, "_properties", refuse)
    columns = ("body", "queue_offset", "topic", "offset_msg_id")
    got = decode_to_arrow(data, topic="TopicTest", broker_name=BROKER, retry=False, columns=columns)
    assert got.column("body").to_pylist() == [m.body for m in expected_messages("", recs)]
    assert got.column("queue_offset").to_pylist() == [100, 101]
    assert got.column("offset_msg_id").to_pylist() == [expected_offset_msg_id(r) for r in recs]
    for needs_them in ("tags", "keys", "msg_id", "properties"):
        with pytest.raises(AssertionError, match="properties parsed"):
            decode_to_arrow(data, topic="TopicTest", broker_name=BROKER, retry=False, columns=(needs_them,))


def test_ipv4_mapped_store_host_gives_javas_56_digit_id() -> None:
    recs = with_offsets([plain(0, store_host=("::ffff:10.1.2.3", 10911))])
    (m,) = rmq(decode_messages(encode_case(recs), BROKER))
    assert m.offset_msg_id == "0A01020300002A9F" + f"{recs[0].commit_log_offset:016X}" + "0" * 24
    assert m.store_host == "10.1.2.3:10911"
    assert m.sys_flag & STORE_V6


def test_retry_rows_show_the_original_topic(monkeypatch: pytest.MonkeyPatch) -> None:
    recs, topic, _ = CASES["retry_topic"]
    no_fallback(monkeypatch)
    batch = decode_to_arrow(encode_case(with_offsets(recs)), topic=topic, broker_name=BROKER, retry=True)
    assert batch.column("topic").to_pylist() == ["Orders", "%RETRY%G"]
    assert batch.column("retry_topic").to_pylist() == ["%RETRY%G", "%RETRY%G"]
    assert batch.column("msg_id").to_pylist() == ["AA", "BB"]
    assert batch.column("reconsume_times").to_pylist() == [2, 1]
    data = encode_case(with_offsets(recs))
    plain_read = decode_to_arrow(data, topic=topic, broker_name=BROKER, retry=False)
    assert plain_read.column("topic").to_pylist() == ["%RETRY%G", "%RETRY%G"]
    assert plain_read.column("retry_topic").null_count == 2


def test_columns_hold_what_the_records_say(monkeypatch: pytest.MonkeyPatch) -> None:
    recs = with_offsets([plain(i) for i in range(3)] + [Rec(properties={"TAGS": "x"})], first_offset=7,
                        first_phy=2**40)
    no_fallback(monkeypatch)
    rows = decode_to_arrow(encode_case(recs), topic="TopicTest", broker_name=BROKER, retry=False).to_pylist()
    assert [r["queue_offset"] for r in rows] == [7, 8, 9, 10]
    assert rows[0]["commit_log_offset"] == 2**40
    assert rows[0]["offset_msg_id"] == f"7F00000100002A9F{2**40:016X}"
    assert rows[3]["msg_id"] == rows[3]["offset_msg_id"]
    assert rows[0]["msg_id"] == "AC11000100" + "0" * 22
    assert rows[1]["keys"] == ["order-1", "user-1"]
    assert rows[3]["keys"] == [] and rows[3]["tags"] == "x"
    assert rows[2]["tags"] == "Tag2"
    assert rows[0]["born_timestamp"].timestamp() == 1_700_000_000.0
    assert rows[0]["store_timestamp"].timestamp() == 1_700_000_000.5
    assert rows[1]["body"] == b"payload 1 payload 1 "
    assert dict(rows[1]["properties"])["CLUSTER"] == "DefaultCluster"
    assert all(r["broker_name"] == BROKER and r["queue_id"] == 2 for r in rows[:3])


def test_inner_batch_is_unwrapped(monkeypatch: pytest.MonkeyPatch) -> None:
    inner = encode_batch([(b"one", 1, {"UNIQ_KEY": "U1", "TAGS": "A", "KEYS": "k"}),
                          (b"two", 2, {"TAGS": "B"}), (b"", 3, "")])
    outer = with_offsets([Rec(body=inner, sys_flag=0xC0, properties={"INNER_NUM": "3"}, reconsume_times=4),
                          plain(9)])
    outer[1] = replace(outer[1], queue_offset=outer[0].queue_offset + 3)
    data = encode_case(outer)
    messages = decode_messages(data, BROKER)
    offset_id = expected_offset_msg_id(outer[0])
    seen = [(m.queue_offset, m.body, m.flag, m.msg_id, m.tags, m.keys, m.reconsume_times) for m in messages]
    assert seen == [
        (100, b"one", 1, "U1", "A", ("k",), 0),
        (101, b"two", 2, offset_id, "B", (), 0),
        (102, b"", 3, offset_id, None, (), 0),
        (103, outer[1].body, outer[1].flag, outer[1].properties["UNIQ_KEY"], "Tag0",
         ("order-9", "user-2"), 1),
    ]
    assert all(m.commit_log_offset == outer[0].commit_log_offset for m in messages[:3])
    calls = count_fallbacks(monkeypatch)
    batch = decode_to_arrow(data, topic="TopicTest", broker_name=BROKER, retry=False, end_offset=102)
    assert calls
    assert batch.column("body").to_pylist() == [b"one", b"two"]


def test_compressed_pull_decompresses_only_those_records(monkeypatch: pytest.MonkeyPatch) -> None:
    recs = with_offsets([plain(i, sys_flag=COMPRESSED, stored_body=deflate(plain(i).body)) if i % 3 == 0
                         else plain(i) for i in range(30)])
    data = encode_case(recs)
    inflated: list[int] = []
    original = codec._decompress

    def counting(raw: bytes, sys_flag: int, where: str) -> bytes:
        inflated.append(sys_flag)
        return original(raw, sys_flag, where)

    monkeypatch.setattr(codec, "_decompress", counting)
    no_fallback(monkeypatch)
    batch = decode_to_arrow(data, topic="TopicTest", broker_name=BROKER, retry=False)
    assert len(inflated) == 10
    assert batch.column("body").to_pylist() == [plain(i).body for i in range(30)]


# --------------------------------------------------------------------------- errors


def test_errors_name_the_record() -> None:
    good = encode_case(with_offsets([plain(0), plain(1)]))
    first = len(encode_stored(with_offsets([plain(0)])[0]))
    bad_magic = good[:first + 4] + b"\x00\x00\x00\x01" + good[first + 8:]
    unknown_type = encode_case(with_offsets([plain(0), plain(1, sys_flag=COMPRESSED | 0x500,
                                                            stored_body=deflate(b"x"))]))
    corrupt_zlib = encode_case(with_offsets([plain(0, sys_flag=COMPRESSED, stored_body=b"not zlib")]))
    truncated_zlib = encode_case(with_offsets([plain(0, sys_flag=COMPRESSED, stored_body=deflate(BIG)[:-9])]))
    # a V1 record of a topic over 127 bytes (a broker with autoMessageVersionOnTopicLen=false):
    # Java reads the length as a signed byte and fails
    v1_long_topic = encode_case(with_offsets([plain(0, topic="T" * 200, version=1)]))
    # TOTALSIZE 4 bytes longer than the fields, padded: Java reads the padding as the next record
    padded = encode_case(with_offsets([plain(0, total_size_delta=4)])) + bytes(4)
    for data, message in [
        (good[:-1], "record at byte"),
        (good[:first + 50], f"record at byte {first}"),
        (good + b"\x00\x00", f"record at byte {len(good)}"),
        (bad_magic, f"record at byte {first} .*magic code 0x00000001"),
        (unknown_type, "unknown compression type 5"),
        (corrupt_zlib, "cannot inflate its zlib-compressed body"),
        (truncated_zlib, "cannot inflate its zlib-compressed body"),
        (v1_long_topic, "topic length -56"),
        (padded, f"record at byte {len(padded) - 4}"),
    ]:
        with pytest.raises(ValueError, match=message):
            decode_messages(data, BROKER)
        with pytest.raises(ValueError, match=message):
            decode_to_arrow(data, topic="TopicTest", broker_name=BROKER, retry=False)


def test_empty_pull() -> None:
    assert decode_messages(b"", BROKER) == []
    batch = decode_to_arrow(b"", topic="T", broker_name=BROKER, retry=False)
    assert batch.num_rows == 0 and batch.schema.equals(arrow_schema())


# --------------------------------------------------------------------------- batch bodies


def read_batch(data: bytes) -> list[tuple[bytes, int, bytes]]:
    """Reference reader of MessageDecoder.encodeMessages' layout: (body, flag, raw properties)."""
    out, pos = [], 0
    while pos < len(data):
        total, magic, crc, flag, body_len = struct.unpack_from(">iiiii", data, pos)
        assert (magic, crc) == (0, 0)
        body = data[pos + 20 : pos + 20 + body_len]
        (props_len,) = struct.unpack_from(">h", data, pos + 20 + body_len)
        props = data[pos + 22 + body_len : pos + 22 + body_len + props_len]
        assert total == 22 + body_len + props_len
        out.append((body, flag, props))
        pos += total
    assert pos == len(data)
    return out


BATCH_ROWS: list[tuple[bytes, int, str]] = [
    (b"a", 0, "UNIQ_KEY\x01A1\x02TAGS\x01T\x02"),
    (b"", 7, ""),
    ("ü✓ 😀".encode(), -1, f"{RU_KEY}\x01{RU_VALUE}\x02"),
    (bytes(range(256)) * 3, 2**31 - 1, "KEYS\x01k1 k2\x02" * 50),
    (b"x" * 10_000, 0, "p\x01" + "v" * 32_000 + "\x02"),
]


def test_encode_batch_both_ways() -> None:
    body = encode_batch(BATCH_ROWS)
    assert read_batch(body) == [(b, f, p.encode()) for b, f, p in BATCH_ROWS]
    assert decode_batch(body) == [(b, f, string_to_message_properties(p)) for b, f, p in BATCH_ROWS]
    bodies = pa.array([b for b, _, _ in BATCH_ROWS], pa.binary())
    props = pa.array([p for _, _, p in BATCH_ROWS], pa.string())
    flags = [f for _, f, _ in BATCH_ROWS]
    assert encode_batch_columns(bodies, props, flags) == body
    assert encode_batch_columns(bodies.cast(pa.large_binary()), props.cast(pa.binary()), flags) == body
    chunked = pa.chunked_array([bodies[:2], bodies[2:]])
    assert encode_batch_columns(chunked, props, pa.array(flags).to_numpy()) == body
    # one flag and one properties string for all rows
    shared = "UNIQ_KEY\x01S\x02"
    same = encode_batch([(b, 5, shared) for b, _, _ in BATCH_ROWS])
    assert encode_batch_columns(bodies, shared, 5) == same
    assert encode_batch_columns(bodies, shared.encode(), 5) == same
    assert encode_batch_columns(bodies, pa.array([shared] * len(BATCH_ROWS)), 5) == same
    # mappings are encoded; a null properties row has none
    mapped = encode_batch([(b"m", 0, {"TAGS": "A", "gone": None})])
    assert mapped == encode_batch([(b"m", 0, "TAGS\x01A\x02")])
    assert encode_batch_columns(pa.array([b"m", b"n"]), pa.array([None, "T\x01v\x02"]), 0) == encode_batch(
        [(b"m", 0, ""), (b"n", 0, "T\x01v\x02")]
    )
    assert encode_batch([]) == b"" == encode_batch_columns(pa.array([], pa.binary()), b"")


def test_encode_batch_refuses_what_java_would_corrupt() -> None:
    too_long = "p\x01" + "v" * 32_766 + "\x02"
    with pytest.raises(ValueError, match="32767"):
        encode_batch([(b"x", 0, too_long)])
    with pytest.raises(ValueError, match="32767"):
        encode_batch_columns(pa.array([b"x"]), pa.array([too_long]))
    with pytest.raises(ValueError, match="row 1 has a null body"):
        encode_batch_columns(pa.array([b"x", None]), b"")
    with pytest.raises(ValueError, match="3 properties for 2 bodies"):
        encode_batch_columns(pa.array([b"x", b"y"]), pa.array(["", "", ""]))
    with pytest.raises(ValueError, match="flags"):
        encode_batch_columns(pa.array([b"x", b"y"]), b"", [1, 2, 3])
    with pytest.raises(ValueError, match="Java int"):
        encode_batch([(b"x", 2**31, "")])
    with pytest.raises(ValueError, match="Java int"):
        encode_batch_columns(pa.array([b"x"]), b"", [-(2**31) - 1])


# --------------------------------------------------------------------------- tag filtering


def test_tag_filters_follow_the_java_client() -> None:
    recs = with_offsets([Rec(properties={"TAGS": "A"}), Rec(properties={"TAGS": "B"}), Rec(),
                         Rec(properties={"TAGS": "A || B"})])
    data = encode_case(recs)
    messages = decode_messages(data, BROKER)
    assert [m.tags for m in filter_by_tags(messages, {"A", "C"})] == ["A"]
    assert filter_by_tags(messages, ()) == messages
    batch = decode_to_arrow(data, topic="TopicTest", broker_name=BROKER, retry=False)
    assert filter_batch_by_tags(batch, ["B", "A"]).column("tags").to_pylist() == ["A", "B"]
    assert filter_batch_by_tags(batch, []).num_rows == 4


# --------------------------------------------------------------------------- micro-benchmark


def pull_of(n: int, body_size: int, *, vary: bool = False) -> bytes:
    recs = [plain(i, body=bytes([65 + i % 26]) * (body_size + (i % 17 if vary else 0))) for i in range(n)]
    if not vary:  # equal sizes: keep every property the same length
        recs = [replace(r, properties={**r.properties, "UNIQ_KEY": f"{i:032X}", "TAGS": "TagA",
                                       "KEYS": f"order-{i:08d}"}) for i, r in enumerate(recs)]
    return encode_case(with_offsets(recs))


def run_benchmark(n: int = 100_000, body_size: int = 200, repeat: int = 3) -> dict[str, float]:
    """Microseconds per record of each decoder on a pull of ``n`` records of ``body_size`` bytes."""
    out: dict[str, float] = {}
    for label, vary in (("equal sizes", False), ("varying sizes", True)):
        data = pull_of(n, body_size, vary=vary)
        runs: dict[str, Callable[[bytes], object]] = {
            "decode_to_arrow": partial(decode_to_arrow, topic="TopicTest", broker_name=BROKER, retry=False),
            "decode_messages": partial(decode_messages, broker_name=BROKER),
            "decode_messages + rows": lambda d: messages_to_batch(
                decode_messages(d, BROKER), read_from="TopicTest", retry=False
            ),
        }
        for name, fn in runs.items():
            best = min(_timed(fn, data) for _ in range(repeat))
            out[f"{name}, {label}"] = best / n * 1e6
    return out


def _timed(fn: Callable[[bytes], object], data: bytes) -> float:
    start = time.perf_counter()
    fn(data)
    return time.perf_counter() - start


def test_benchmark_pull_decodes_the_same_both_ways(monkeypatch: pytest.MonkeyPatch) -> None:
    for vary in (False, True):
        data = pull_of(2_000, 200, vary=vary)
        reference = messages_to_batch(decode_messages(data, BROKER), read_from="TopicTest", retry=False)
        with monkeypatch.context() as patch:
            no_fallback(patch)
            assert decode_to_arrow(data, topic="TopicTest", broker_name=BROKER, retry=False).equals(reference)


if __name__ == "__main__":
    for key, us in run_benchmark().items():
        print(f"{key:40s} {us:7.3f} us/record")


def test_a_java_batch_message_keeps_its_own_uniq_key() -> None:
    """The broker appends a Java batch's own UNIQ_KEY to each message's properties (apache/rocketmq#9416)."""
    raw = "UNIQ_KEY\x01OWN{}\x02TAGS\x01T\x02UNIQ_KEY\x01BATCH\x02CLUSTER\x01C\x02"
    recs = [plain(i, raw_properties=raw.format(i).encode()) for i in range(3)]
    data = encode_case(with_offsets(recs))
    messages = decode_messages(data, BROKER)
    assert [m.msg_id for m in messages] == ["OWN0", "OWN1", "OWN2"]
    assert [m.properties["UNIQ_KEY"] for m in messages] == ["OWN0", "OWN1", "OWN2"]
    batch = decode_to_arrow(data, topic="TopicTest", broker_name=BROKER, retry=False)
    assert batch.column("msg_id").to_pylist() == ["OWN0", "OWN1", "OWN2"]
    assert batch.column("tags").to_pylist() == ["T", "T", "T"]

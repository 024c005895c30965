"""Pre-encoded batches (EncodedBatch): what the broker stores, and what it refuses."""

from __future__ import annotations

import struct
import sys
from collections.abc import Callable
from pathlib import Path

import grpc
import pyarrow as pa
import pytest
from broker_process import BrokerProcess
from helpers import read_all, unique
from pymq_broker.store import encoded_batch
from pymq_broker.store.encoded_batch import parse_encoded
from pymq_proto.record import HEADER, HEADER_SIZE, MESSAGE_MAGIC_CODE
from pymq_proto.v1 import pymq_pb2, pymq_pb2_grpc
from pyspark_pymq import Admin, Producer, PullConsumer
from pyspark_pymq.backend import BackendConfig
from pyspark_pymq.backend.pymq import PymqBackend
from pyspark_pymq.client.codec import encode_records
from pyspark_pymq.spark.writer import _encode_properties, encode_plain_batch

KEYS = [f"{i:032X}" for i in range(4)]
PYMQ = PymqBackend(BackendConfig("127.0.0.1:1"))  # frames records; never connects


def _records(topic: str, n: int = 4, extra: bytes = b"") -> tuple[bytearray, list[int]]:
    props = [b"UNIQ_KEY\x01" + KEYS[i].encode() + b"\x02" + extra for i in range(n)]
    raw, sizes = encode_records(topic, [b"body-%d" % i for i in range(n)], props)
    return bytearray(raw), list(sizes)


def _set(buf: bytearray, record_start: int, field: int, value: object) -> None:
    fields = list(HEADER.unpack_from(buf, record_start))
    fields[field] = value
    HEADER.pack_into(buf, record_start, *fields)


def _pack(sizes: list[int]) -> bytes:
    return struct.pack(f"<{len(sizes)}i", *sizes)


# Each case breaks a well-formed batch of 4 records of topic "t" in one way and
# names the words the error must contain.
def _bad_sizes_bytes(buf: bytearray, sizes: list[int]) -> tuple[bytes, bytes]:
    return bytes(buf), _pack(sizes)[:-1]


def _sizes_do_not_add_up(buf: bytearray, sizes: list[int]) -> tuple[bytes, bytes]:
    return bytes(buf) + b"\0", _pack(sizes)


def _size_too_small(buf: bytearray, sizes: list[int]) -> tuple[bytes, bytes]:
    return bytes(buf), _pack([10, sizes[1] + sizes[0] - 10, *sizes[2:]])


def _totalsize_differs(buf: bytearray, sizes: list[int]) -> tuple[bytes, bytes]:
    _set(buf, sizes[0], 0, sizes[1] + 1)
    return bytes(buf), _pack(sizes)


def _bad_magic(buf: bytearray, sizes: list[int]) -> tuple[bytes, bytes]:
    _set(buf, sizes[0] + sizes[1], 1, 12345)
    return bytes(buf), _pack(sizes)


def _body_len_too_big(buf: bytearray, sizes: list[int]) -> tuple[bytes, bytes]:
    _set(buf, 0, 13, 10_000)
    return bytes(buf), _pack(sizes)


def _body_len_shifted(buf: bytearray, sizes: list[int]) -> tuple[bytes, bytes]:
    _set(buf, 0, 13, 7)  # "body-0" is 6 bytes: the topic length is read one byte late
    return bytes(buf), _pack(sizes)


def _other_topic(buf: bytearray, sizes: list[int]) -> tuple[bytes, bytes]:
    raw, other = encode_records("u", [b"x"], [b"UNIQ_KEY\x01" + KEYS[0].encode() + b"\x02"])
    return bytes(buf) + raw, _pack([*sizes, *other])


def _no_uniq_first(buf: bytearray, sizes: list[int]) -> tuple[bytes, bytes]:
    raw, one = encode_records("t", [b"x"], [b"TAGS\x01a\x02UNIQ_KEY\x01" + KEYS[0].encode() + b"\x02"])
    return raw + bytes(buf), _pack([*one, *sizes])


def _uniq_not_ended(buf: bytearray, sizes: list[int]) -> tuple[bytes, bytes]:
    raw, one = encode_records("t", [b"x"], [b"UNIQ_KEY\x01" + b"A" * 200])
    return bytes(buf) + raw, _pack([*sizes, *one])


def _props_len_wrong(buf: bytearray, sizes: list[int]) -> tuple[bytes, bytes]:
    end = sizes[0]
    plen_at = end - (9 + 32 + 1) - 2
    struct.pack_into("<H", buf, plen_at, 9 + 32)
    return bytes(buf), _pack(sizes)


BAD_CASES: list[tuple[Callable[[bytearray, list[int]], tuple[bytes, bytes]], str]] = [
    (_bad_sizes_bytes, "packed little-endian int32"),
    (_sizes_do_not_add_up, "add up to"),
    (_size_too_small, r"sizes\[0\] = 10 is below"),
    (_totalsize_differs, "record 1 of 4 .*TOTALSIZE"),
    (_bad_magic, "record 2 of 4 .*MAGICCODE 12345"),
    (_body_len_too_big, "record 0 of 4 .*BODYLEN 10000"),
    (_body_len_shifted, "record 0 of 4 .*topic"),
    (_other_topic, "record 4 of 5 .*not the request's topic 't'"),
    (_no_uniq_first, "record 0 of 5 .*must begin with UNIQ_KEY"),
    (_uniq_not_ended, "record 4 of 5 .*UNIQ_KEY value does not end"),
    (_props_len_wrong, "record 0 of 4 .*do not add up to TOTALSIZE"),
]


@pytest.mark.parametrize(("breaker", "match"), BAD_CASES, ids=[c[0].__name__ for c in BAD_CASES])
def test_parse_refuses_malformed_batches_naming_the_fault(
    breaker: Callable[[bytearray, list[int]], tuple[bytes, bytes]], match: str
) -> None:
    buf, sizes = _records("t")
    records, packed = breaker(buf, sizes)
    with pytest.raises(ValueError, match=match):
        parse_encoded(records, packed, "t")


def test_parse_locates_each_record_and_its_uniq_key() -> None:
    buf, sizes = _records("t", extra=b"TAGS\x01a\x02")
    parsed = parse_encoded(bytes(buf), _pack(sizes), "t")
    assert list(parsed.sizes) == sizes and not parsed.plain
    assert parsed.uniq_keys() == [k.encode() for k in KEYS]
    assert parsed.properties(1) == b"UNIQ_KEY\x01" + KEYS[1].encode() + b"\x02TAGS\x01a\x02"
    assert parsed.message(2)[0] == b"body-2"
    plain = parse_encoded(bytes(_records("t")[0]), _pack(_records("t")[1]), "t")
    assert plain.plain and not plain.contains(b"TAGS\x01")


def test_broker_refuses_a_malformed_batch_and_stores_nothing(broker: BrokerProcess) -> None:
    endpoint = broker.endpoint
    topic = unique("enc")
    Admin(endpoint).create_topic(topic, queues=1)
    stub = pymq_pb2_grpc.BrokerStub(grpc.insecure_channel(endpoint))
    good, sizes = _records(topic)
    for breaker, _match in BAD_CASES:
        buf, sz = _records(topic)
        records, packed = breaker(buf, sz)
        with pytest.raises(grpc.RpcError) as info:
            stub.SendMessage(pymq_pb2.SendMessageRequest(
                topic=topic, queue_id=0, batch=True,
                encoded=pymq_pb2.EncodedBatch(records=records, sizes=packed)))
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "encoded batch: " in (info.value.details() or "")
    with pytest.raises(grpc.RpcError) as info:  # both forms at once
        stub.SendMessage(pymq_pb2.SendMessageRequest(
            topic=topic, queue_id=0, batch=True, messages=[pymq_pb2.MessageData(body=b"x")],
            encoded=pymq_pb2.EncodedBatch(records=bytes(good), sizes=_pack(sizes))))
    assert "both messages and an encoded batch" in (info.value.details() or "")
    assert sum(Admin(endpoint).topic_stats(topic)["messages"]) == 0
    # the store is intact: a good batch lands first in the queue and survives a crash
    resp = stub.SendMessage(pymq_pb2.SendMessageRequest(
        topic=topic, queue_id=0, batch=True, born_timestamp=1234,
        encoded=pymq_pb2.EncodedBatch(records=bytes(good), sizes=_pack(sizes))))
    assert resp.queue_offset == 0 and len(resp.commit_log_offsets) == 4
    broker.restart(crash=True)
    got = read_all(broker.endpoint, topic)
    assert [m.body for m in got] == [b"body-%d" % i for i in range(4)]
    assert [m.msg_id for m in got] == KEYS
    assert [m.queue_offset for m in got] == [0, 1, 2, 3]
    assert [m.commit_log_offset for m in got] == list(resp.commit_log_offsets)
    assert all(m.born_timestamp == 1234 and m.store_timestamp > 0 for m in got)


def test_encoded_batches_keep_tags_keys_dedup_and_recover(tmp_path: Path) -> None:
    with BrokerProcess(tmp_path / "b") as broker:
        topic = unique("enc")
        admin = Admin(broker.endpoint)
        admin.create_topic(topic, queues=1, dedup_window_ms=60_000)
        with Producer(broker.endpoint) as producer:
            props = [b"TAGS\x01" + (b"A" if i % 2 else b"B") + b"\x02KEYS\x01k%d all\x02" % i
                     for i in range(10)]
            keys = [f"{i:032X}" for i in range(10)]
            first = producer.send_encoded(topic, [b"m%d" % i for i in range(10)], props, keys, queue_id=0)
            assert len(first[0].commit_log_offsets) == 10
            # a replay of 5 of them plus 5 new: only the new ones are stored, in order
            again = producer.send_encoded(
                topic, [b"m%d" % i for i in range(5, 15)],
                [b"UNIQ_KEY\x01" + f"{i:032X}".encode() + b"\x02" for i in range(5, 15)],
                [f"{i:032X}" for i in range(5, 15)], queue_id=0,
            )
            assert len(again[0].commit_log_offsets) == 5
        assert [m.body for m in admin.query_message(topic, "k4")] == [b"m4"]
        assert len(admin.query_message(topic, "all", max_num=32)) == 10
        assert [m.body for m in admin.query_message(topic, f"{12:032X}")] == [b"m12"]
        broker.restart(crash=True)  # the records' headers and CRCs pass recovery
        consumer = PullConsumer(broker.endpoint, "g")
        mq = consumer.queues(topic)[0]
        tagged = consumer.pull(mq, 0, 100, subscription="A")
        assert [m.body for m in tagged.messages] == [b"m1", b"m3", b"m5", b"m7", b"m9"]
        everything = consumer.pull(mq, 0, 100).messages
        assert [m.body for m in everything] == [b"m%d" % i for i in [*range(10), *range(10, 15)]]
        assert everything[3].keys == ("k3", "all") and everything[3].msg_id == keys[3]


def test_row_keys_are_the_row_indexes_in_hex_made_when_read() -> None:
    from pyspark_pymq.client.message import RowKeys

    keys = RowKeys("P", 14, 18)
    assert list(keys) == ["P000000000000000E", "P000000000000000F", "P0000000000000010", "P0000000000000011"]
    assert len(keys) == 4 and keys[0] == "P000000000000000E" and keys[-1] == "P0000000000000011"
    assert keys[1:3] == ("P000000000000000F", "P0000000000000010") and isinstance(keys[1:3], RowKeys)
    assert keys[::2] == ("P000000000000000E", "P0000000000000010") and keys[5:] == ()
    assert keys == tuple(keys) and hash(keys) == hash(tuple(keys)) and keys != RowKeys("Q", 14, 18)
    with pytest.raises(IndexError, match="row key 4 is out of range for 4 keys"):
        keys[4]
    with pytest.raises(TypeError, match=r"integers or slices, not float 1\.0"):
        keys[1.0]  # type: ignore[index]


def test_row_keys_of_8_digits_are_the_msg_ids_new_uniq_keys_makes() -> None:
    from pyspark_pymq.client.message import RowKeys, new_uniq_keys

    keys = RowKeys("P", 255, 257, digits=8)
    assert list(keys) == ["P000000FF", "P00000100"] and keys[1:] == ("P00000100",)
    assert repr(keys) == "RowKeys('P', 255, 257, digits=8)"
    made = new_uniq_keys(3)
    assert isinstance(made, RowKeys) and len(set(made)) == 3
    assert all(len(k) == 32 and int(k, 16) >= 0 for k in made)
    assert int(made[2][-8:], 16) - int(made[0][-8:], 16) == 2  # the counter is the row


def test_send_batch_frames_plain_messages_as_columns_byte_for_byte(monkeypatch: pytest.MonkeyPatch) -> None:
    """The column path of Producer.send_batch makes the very records of the per-message loop."""
    from pyspark_pymq.client import producer as producer_mod
    from pyspark_pymq.client.message import Message, RowKeys

    producer = Producer("127.0.0.1:1")
    messages = [Message("t", bytes([i % 251]) * (i % 300)) for i in range(200)]
    keys = RowKeys("0000ABCD000012345678", 7, 207, digits=8)
    monkeypatch.setattr(producer_mod, "new_uniq_keys", lambda n: keys[:n])
    columns = producer._prepare(messages)
    assert producer._prepare_plain("t", messages, keys) is not None  # the path taken above
    monkeypatch.setattr(producer_mod, "_COLUMNS_MIN", 10**9)
    loop = producer._prepare(messages)
    assert columns.records == loop.records and list(columns.sizes) == list(loop.sizes)
    assert columns.uniq_keys == loop.uniq_keys == tuple(keys)
    tagged = [*messages[:100], Message("t", b"x", tags="A"), *messages[100:]]
    assert producer._prepare_plain("t", tagged, RowKeys("P", 0, len(tagged), digits=8)) is None
    other = [*messages, Message("u", b"x")]
    assert producer._prepare_plain("t", other, RowKeys("P", 0, len(other), digits=8)) is None


def test_header_template_matches_record_layout() -> None:
    raw, sizes = encode_records("t", [b"abc"], [b"UNIQ_KEY\x01K\x02"], born_timestamp=5)
    h = HEADER.unpack_from(raw)
    assert h[0] == sizes[0] == len(raw) and h[1] == MESSAGE_MAGIC_CODE and h[8] == 5 and h[13] == 3
    assert raw[HEADER_SIZE : HEADER_SIZE + 3] == b"abc"


def test_spark_plain_batches_are_encoded_as_the_per_row_path_would() -> None:
    prefix = "0123456789ABCDEF"
    bodies = ["a", "bcd", "", "é"]
    tags = ["x", None, "", "t2"]
    batch = pa.RecordBatch.from_pydict({"body": pa.array(bodies), "tags": pa.array(tags),
                                        "keys": pa.array([None] * 4, pa.list_(pa.string()))})
    encoded = encode_plain_batch(batch, "top", prefix, 7, "here", 1000, b"", PYMQ)
    assert encoded is not None
    records, sizes, keys = encoded
    assert list(keys) == [f"{prefix}{row:016X}" for row in range(7, 11)]
    props = [_encode_properties(None, t, None, None, None, k) for t, k in zip(tags, keys, strict=True)]
    expected, expected_sizes = encode_records("top", [b.encode() for b in bodies], props)
    assert records == expected and list(sizes) == list(expected_sizes)
    assert parse_encoded(records, sizes.tobytes(), "top").uniq_keys() == [k.encode() for k in keys]
    # the exactly-once sink's transaction properties go on every row, as on the per-row path
    extra = b"TRAN_MSG\x01true\x02PGROUP\x01g\x02"
    with_tx = encode_plain_batch(batch, "top", prefix, 7, "here", 1000, extra, PYMQ)
    assert with_tx is not None
    assert with_tx[0] == encode_records("top", [b.encode() for b in bodies], [p + extra for p in props])[0]
    # rows that need more than a body and tags take the per-row path; bad rows are named
    with_delay = batch.append_column("delay_level", pa.array([None, 1, None, None], pa.int32()))
    assert encode_plain_batch(with_delay, "top", prefix, 0, "here", 1000, b"", PYMQ) is None
    assert encode_plain_batch(batch, None, prefix, 0, "here", 1000, b"", PYMQ) is None
    assert encode_plain_batch(batch, "top", prefix, 0, "here", 2, b"", PYMQ) is None  # a body over the limit
    with pytest.raises(ValueError, match="row 8 of here has a null body"):
        encode_plain_batch(pa.RecordBatch.from_pydict({"body": pa.array([b"x", None])}), "t", prefix, 7,
                           "here", 1000, b"", PYMQ)
    bad = pa.RecordBatch.from_pydict({"body": pa.array([b"x", b"y"]), "tags": pa.array(["ok", "a\x02b"])})
    with pytest.raises(ValueError, match=r"row 1 of here: .*reserved characters"):
        encode_plain_batch(bad, "t", prefix, 0, "here", 1000, b"", PYMQ)


# -- the scalar path (a few records) against the vector path (many) ------------------------


def _one_record_cases() -> list[tuple[str, bytes, bytes]]:
    """Malformed batches of ONE record, each broken in one way (the scalar path's usual input)."""
    cases: list[tuple[str, bytes, bytes]] = []
    for breaker, _ in BAD_CASES:
        buf, sizes = _records("t", n=1)
        if breaker in (_totalsize_differs, _bad_magic, _size_too_small):
            continue  # these break records 1 and 2: below, by hand for one record
        try:
            cases.append((breaker.__name__, *breaker(buf, sizes)))
        except IndexError:
            continue
    buf, sizes = _records("t", n=1)
    _set(buf, 0, 0, sizes[0] + 1)
    cases.append(("totalsize", bytes(buf), _pack(sizes)))
    buf, sizes = _records("t", n=1)
    _set(buf, 0, 1, 777)
    cases.append(("magic", bytes(buf), _pack(sizes)))
    buf, sizes = _records("t", n=1)
    _set(buf, 0, 13, -1)
    cases.append(("negative body length", bytes(buf), _pack(sizes)))
    raw, one = encode_records("t", [b"b"], [b"UNIQ_KEY\x01\x02"])
    cases.append(("empty uniq key", raw, bytes(one)))
    raw, one = encode_records("t", [b"b"], [b"UNIQ_KEY\x01" + b"A" * 200 + b"\x02"])
    cases.append(("long uniq key", raw, bytes(one)))
    raw, one = encode_records("t", [b"b"], [b"UNIQ_KEY\x01" + b"A" * 100 + b"\x02"])
    cases.append(("a 100-digit uniq key is fine", raw, bytes(one)))
    return cases


def _parse_outcome(records: bytes, sizes: bytes, scalar: bool) -> object:
    try:
        parsed = parse_encoded(records, sizes, "t", scalar=scalar)
    except ValueError as err:
        return str(err)
    return (bytes(parsed.buf), parsed.offsets.tolist(), parsed.sizes.tolist(), parsed.headers.tobytes(),
            parsed.props_start.tolist(), parsed.props_end.tolist(), parsed.uniq_keys(), parsed.plain)


def _binary_records(n: int, last_props: bytes | None = None) -> tuple[str, bytes, bytes]:
    """``n`` records with 1 KB bodies full of 0x02 (as binary payloads have), the last one's
    properties ``last_props`` if given."""
    bodies = [bytes([2, 65 + i % 26]) * 512 for i in range(n)]
    props = [b"UNIQ_KEY\x01" + f"{i:032X}".encode() + b"\x02" for i in range(n)]
    if last_props is not None:
        props[-1] = last_props
    raw, sizes = encode_records("t", bodies, props)
    return f"{n} binary records ending {props[-1][-12:]!r}", raw, _pack(list(sizes))


@pytest.mark.parametrize("scan_below", [0, 10**9], ids=["windows", "scan"])
def test_scalar_parse_accepts_and_refuses_as_the_vector_parse(
    monkeypatch: pytest.MonkeyPatch, scan_below: int
) -> None:
    """Same records located, same malformed inputs refused with the same message, whichever
    way the vector parse searches for the UNIQ_KEY ends."""
    monkeypatch.setattr(encoded_batch, "SCAN_BELOW_RECORD_BYTES", scan_below)
    outcomes = []
    for breaker, _ in BAD_CASES:
        buf, sizes = _records("t")
        outcomes.append((breaker.__name__, *breaker(buf, sizes)))
    outcomes += _one_record_cases()
    for n in (1, 2, 4):
        buf, sizes = _records("t", n=n, extra=b"TAGS\x01a\x02" if n == 2 else b"")
        outcomes.append((f"{n} good records", bytes(buf), _pack(sizes)))
    # keys of one width followed by tags (found from the first record's width), and batches
    # where a later key is longer, shorter or unended (found by a search)
    for name, last in (("one width", None), ("a longer last key", b"UNIQ_KEY\x01" + b"B" * 40 + b"\x02"),
                       ("a shorter last key", b"UNIQ_KEY\x01B\x02TAGS\x01tag\x02"),
                       ("an unended last key", b"UNIQ_KEY\x01" + b"C" * 32 + b"TAGS"),
                       ("a last key over the limit", b"UNIQ_KEY\x01" + b"D" * 129 + b"\x02TAGS\x01t\x02")):
        props = [b"UNIQ_KEY\x01" + f"{i:032X}".encode() + b"\x02TAGS\x01tag\x02" for i in range(40)]
        if last is not None:
            props[-1] = last
        raw, tagged = encode_records("t", [b"x" * 200] * 40, props)
        outcomes.append((f"tagged, {name}", raw, _pack(list(tagged))))
    outcomes += [_binary_records(40), _binary_records(40, b"UNIQ_KEY\x01" + b"A" * 200 + b"\x02"),
                 _binary_records(40, b"UNIQ_KEY\x01" + b"A" * 128 + b"\x02"),
                 _binary_records(40, b"UNIQ_KEY\x01KEY\x02TAGS\x01" + b"t" * 300 + b"\x02")]
    for name, records, sizes_raw in outcomes:
        scalar, vector = _parse_outcome(records, sizes_raw, True), _parse_outcome(records, sizes_raw, False)
        assert scalar == vector, name
    assert isinstance(_parse_outcome(*_binary_records(40, b"UNIQ_KEY\x01" + b"A" * 129 + b"\x02")[1:], False),
                      str)
    assert not isinstance(
        _parse_outcome(*_binary_records(40, b"UNIQ_KEY\x01" + b"A" * 128 + b"\x02")[1:], False), str)
    assert isinstance(_parse_outcome(*_one_record_cases()[0][1:], True), str)


def _store_files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)).replace(p.name, "") if p.parent.name == "index" else
            str(p.relative_to(root)): p.read_bytes()
            for p in sorted(root.rglob("*")) if p.is_file() and p.name != "checkpoint"}


def test_scalar_and_vector_puts_store_the_same_bytes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Commit log, consume queues and index: byte for byte the same whichever path puts the records."""
    from pymq_broker.store import encoded_batch, index_service
    from pymq_broker.store.commit_log import MessageToStore
    from pymq_broker.store.config import MessageStoreConfig
    from pymq_broker.store.message_store import DefaultMessageStore

    monkeypatch.setattr("time.time", lambda: 1_790_000_000.123)
    files = []
    for limit in (10**9, 0):  # every put scalar, then every put vector
        monkeypatch.setattr(encoded_batch, "SCALAR_MAX_RECORDS", limit)
        monkeypatch.setattr(index_service, "SCALAR_MAX_KEYS", limit)
        root = tmp_path / f"store-{limit}"
        config = MessageStoreConfig(store_path_root_dir=root, mapped_file_size_commit_log=4096,
                                    max_message_size=1024)
        store = DefaultMessageStore(config, b"\x7f\0\0\x01\0\0\x27\x10")
        store.load()
        results = []
        for n in (1, 3, 1, 6):
            extra = b"TAGS\x01x\x02KEYS\x01a b\x02"
            props = [b"UNIQ_KEY\x01" + f"{n}-{i}".encode() + b"\x02" + (extra if i % 2 else b"")
                     for i in range(n)]
            raw, sizes = encode_records("t", [b"e" * (40 * i + 1) for i in range(n)], props, born_timestamp=7)
            results.append(store.put_records("t", n % 2, parse_encoded(raw, bytes(sizes), "t")))
            classic = [MessageToStore(b"c" * (50 * i + 3), i, p, 9, i, 0) for i, p in enumerate(props)]
            results.append(store.put_messages("t", 1, classic))
        for bad in ([MessageToStore(b"x", 0, b"UNIQ_KEY\x01k\x02" + b"P" * 40_000, 9)],
                    [MessageToStore(b"x" * (1 + 1100 * (i == 2)), 0, b"UNIQ_KEY\x01k\x02", 9)
                     for i in range(3)],
                    [MessageToStore(b"x" * 600, 0, b"UNIQ_KEY\x01k\x02", 9) for _ in range(2)]):
            results.append(store.put_messages("t", 0, bad))
        store.shutdown()
        files.append((_store_files(root), [repr(r) for r in results]))
    assert files[0] == files[1]
    assert "over the limit" in files[0][1][-3] and "message 2 of the batch" in files[0][1][-2]
    assert "split it" in files[0][1][-1]
    assert any(b"TAGS\x01x" in v for v in files[0][0].values())


@pytest.mark.parametrize("width", [1, 2, 7, 16, 31, 32, 48])
def test_crc32_of_equal_width_slices_is_zlibs(width: int) -> None:
    import random
    import zlib

    import numpy as np
    from pymq_broker.store.crc32_vector import crc32_equal_width

    rng = random.Random(width)
    buf = bytes(rng.randrange(256) for _ in range(4096))
    starts = np.array(sorted(rng.sample(range(len(buf) - width + 1), 300)), dtype=np.int64)
    seed = rng.randrange(1 << 32)
    got = crc32_equal_width(np.frombuffer(buf, dtype=np.uint8), starts, width, seed)
    assert got.tolist() == [zlib.crc32(buf[s : s + width], seed) for s in starts.tolist()]
    with pytest.raises(ValueError, match=r"width 49 is outside 1\.\.48"):
        crc32_equal_width(np.frombuffer(buf, dtype=np.uint8), starts, 49)


def test_store_crc32_is_zlibs() -> None:
    """ISA-L's CRC-32 where it ships wheels (so installed with pymq), zlib's elsewhere: zlib's values
    on every buffer the store passes."""
    import platform
    import zlib

    from pymq_proto.crc32 import crc32

    if platform.machine().lower() in ("x86_64", "amd64", "aarch64", "arm64") and sys.maxsize > 2**32:
        assert crc32.__module__ == "isal.isal_zlib"  # the dependency is there and imports

    buf = bytes(range(256)) * 9
    mv = memoryview(buf)
    for seed in (0, 1, 0x89ABCDEF, 0xFFFFFFFF):
        for a, b in ((0, 0), (3, 4), (5, 220), (17, 2000), (0, len(buf))):
            assert crc32(mv[a:b], seed) == crc32(bytearray(buf[a:b]), seed) == zlib.crc32(buf[a:b], seed)


@pytest.mark.parametrize("n", [3, 400])  # a put packed record by record, and one packed by numpy
def test_stored_crc_is_zlibs_crc_of_each_record_after_its_header(tmp_path: Path, n: int) -> None:
    import zlib

    from pymq_broker.store.config import MessageStoreConfig
    from pymq_broker.store.message_store import DefaultMessageStore

    config = MessageStoreConfig(store_path_root_dir=tmp_path, mapped_file_size_commit_log=1 << 20,
                                max_message_size=1 << 19)
    store = DefaultMessageStore(config, b"\x7f\0\0\x01\0\0\x27\x10")
    store.load()
    props = [b"UNIQ_KEY\x01" + f"{i:032X}".encode() + b"\x02" for i in range(n)]
    bodies = [bytes([i % 251]) * (i % 300) for i in range(n)]
    raw, sizes = encode_records("t", bodies, props, born_timestamp=7)
    assert store.put_records("t", 0, parse_encoded(raw, bytes(sizes), "t")).status.name == "PUT_OK"
    store.shutdown()
    log, pos, seen = next((tmp_path / "commitlog").iterdir()).read_bytes(), 0, 0
    while (size := HEADER.unpack_from(log, pos)[0]) > 0:
        record = log[pos : pos + size]
        assert HEADER.unpack_from(record)[2] == zlib.crc32(record[HEADER_SIZE:])
        pos, seen = pos + size, seen + 1
    assert seen == n


def test_uniq_hashes_of_a_large_batch_are_the_index_key_hashes() -> None:
    from pymq_broker.store.index_service import key_hash, key_seed

    n = encoded_batch.SCALAR_MAX_RECORDS * 3
    one_width, mixed = [f"{i:032X}" for i in range(n)], [f"{'k' * (i % 5)}{i}" for i in range(n)]
    for keys in (one_width, mixed):
        props = [b"UNIQ_KEY\x01" + k.encode() + b"\x02" for k in keys]
        records, sizes = encode_records("topic-a", [b"b"] * n, props)
        parsed = parse_encoded(records, sizes.tobytes(), "topic-a")
        assert list(parsed.uniq_hashes(key_seed("topic-a"))) == [key_hash("topic-a", k) for k in keys]


def test_a_large_batch_is_found_by_each_uniq_key(broker: BrokerProcess) -> None:
    topic = unique("enc-index")
    Admin(broker.endpoint).create_topic(topic, queues=1)
    n = encoded_batch.SCALAR_MAX_RECORDS * 4
    keys = [f"{7 * i + 1:032X}" for i in range(n)]
    props = [b"UNIQ_KEY\x01" + k.encode() + b"\x02" for k in keys]
    with Producer(broker.endpoint) as producer:
        producer.send_encoded(topic, [b"m%d" % i for i in range(n)], props, keys, queue_id=0)
    admin = Admin(broker.endpoint)
    for i in (0, 1, n // 2, n - 1):
        assert [m.body for m in admin.query_message(topic, keys[i])] == [b"m%d" % i]


def test_a_large_batch_locates_uniq_keys_followed_by_other_properties() -> None:
    n = encoded_batch.SCALAR_MAX_RECORDS * 3
    keys = [f"{i:032X}" for i in range(n)]
    for extra, plain in ((b"", True), (b"TAGS\x01a\x02", False), (b"TAGS\x01" + b"t" * 40 + b"\x02", False)):
        props = [b"UNIQ_KEY\x01" + k.encode() + b"\x02" + extra for k in keys]
        records, sizes = encode_records("topic-a", [b"b\x02" * 3] * n, props)
        parsed = parse_encoded(records, sizes.tobytes(), "topic-a")
        assert parsed.uniq_keys() == [k.encode() for k in keys] and parsed.plain is plain


@pytest.mark.parametrize(("digits", "start"), [(16, 0xFEDCBA9876543210 - 50), (8, 0xFFFFFF00), (5, 0xABC00)])
def test_uniq_property_matrix_rows_are_the_row_keys(digits: int, start: int) -> None:
    from pyspark_pymq.client.codec import uniq_property_matrix
    from pyspark_pymq.client.message import RowKeys

    keys = RowKeys("0A1B2C", start, start + 40, digits)
    matrix = uniq_property_matrix(keys)
    assert [bytes(row) for row in matrix] == [b"UNIQ_KEY\x01" + k.encode() + b"\x02" for k in keys]
    assert len(keys[0]) == 6 + digits


def test_byte_windows_are_the_slices_and_write_through() -> None:
    import numpy as np
    from pymq_broker.store.byte_windows import byte_windows

    buf = bytearray(range(20))
    arr = np.frombuffer(buf, dtype=np.uint8)
    rows = byte_windows(arr, 4)
    assert rows.shape == (17, 4) and [bytes(rows[i]) for i in (0, 7, 16)] == [buf[0:4], buf[7:11], buf[16:20]]
    rows[np.array([2, 10])] = np.array([[9, 9, 9, 9], [8, 8, 8, 8]], dtype=np.uint8)
    assert buf[2:6] == b"\x09" * 4 and buf[10:14] == b"\x08" * 4
    read_only = byte_windows(np.frombuffer(bytes(20), dtype=np.uint8), 4)
    assert not read_only.flags.writeable
    with pytest.raises(ValueError, match="window width 21 does not fit a buffer of 20 bytes"):
        byte_windows(arr, 21)


def test_tag_codes_of_a_batch_match_find_property_record_by_record() -> None:
    """The dispatch's vectorized TAGS look-up (every record at once over the properties alone)
    gives each record what find_property gives it: the last TAGS entry, not a name ending in
    TAGS, not text in a value or a body, an empty value, TAGS first, last or missing."""
    import random
    import zlib

    from pymq_broker.store.message_store import _tag_codes
    from pymq_proto.record import find_property, tag_hash

    rnd = random.Random(7)
    pool = [b"TAGS\x01TagA", b"TAGS\x01", b"TAGS\x01TagB||TagC", b"MYTAGS\x01NotATag", b"KEYS\x01k1 k2",
            b"a\x01TAGS", b"TAGSX\x01y", b"b\x01xTAGS", b"TAGS\x01" + bytes(range(3, 40))]
    for n in (1, 3, 40, 300):
        props, bodies = [], []
        for i in range(n):
            extra = b"\x02".join(rnd.sample(pool, rnd.randint(0, 4)))
            props.append(b"UNIQ_KEY\x01" + f"{i:032X}".encode() + b"\x02" + extra)
            bodies.append(rnd.choice([b"plain", b"\x02TAGS\x01in-a-body\x02", b"x" * rnd.randint(0, 50)]))
        raw, sizes = encode_records("topic-a", bodies, props)
        parsed = parse_encoded(raw, _pack(list(sizes)), "topic-a")
        expected = [tag_hash(find_property(p, b"TAGS")) for p in parsed.all_properties()]
        assert _tag_codes(parsed).tolist() == expected, n
        if n >= 40:  # the sample exercised tagged records, not only untagged ones
            assert zlib.crc32(b"TagA") in expected
        only_in_bodies = [b"\x02TAGS\x01body" if i % 2 else b"y" for i in range(n)]
        raw2, sizes2 = encode_records("topic-a", only_in_bodies, [p[:42] for p in props])
        parsed2 = parse_encoded(raw2, _pack(list(sizes2)), "topic-a")
        assert not parsed2.contains(b"TAGS\x01")  # bodies are not searched
        assert _tag_codes(parsed2).tolist() == [0] * n
    for tags in (b"TagA", b"", b"T" * 48, b"T" * 49):  # one tag for the batch: hashed together
        props = [b"UNIQ_KEY\x01" + f"{i:032X}".encode() + b"\x02TAGS\x01" + tags + b"\x02k\x01v"
                 for i in range(100)]
        raw, sizes = encode_records("topic-a", [b"b"] * 100, props)
        parsed = parse_encoded(raw, _pack(list(sizes)), "topic-a")
        assert _tag_codes(parsed).tolist() == [tag_hash(tags)] * 100

"""Unit tests of the store: commit log, consume queues, recovery, retention, index."""

from __future__ import annotations

import logging
import os
import shutil
import time
from pathlib import Path

import pytest
from pymq_broker.common.mix_all import SCHEDULE_TOPIC
from pymq_broker.store.commit_log import MessageToStore
from pymq_broker.store.config import MessageStoreConfig, parse_delay_levels
from pymq_broker.store.index_service import IndexService
from pymq_broker.store.message_store import DefaultMessageStore
from pymq_broker.store.results import GetMessageStatus, PutMessageStatus
from pymq_proto.record import (
    HEADER,
    MessageConst,
    decode_properties,
    encode_properties,
    find_property,
    store_host_bytes,
)

HOST = store_host_bytes("127.0.0.1", 9876)
MiB = 1024 * 1024


def loaded_store(root: Path, **cfg: object) -> DefaultMessageStore:
    """Loaded, not started: nothing flushes behind the test's back."""
    store = DefaultMessageStore(MessageStoreConfig(store_path_root_dir=root, **cfg), HOST)  # type: ignore[arg-type]
    store.load()
    return store


def make_store(root: Path, **cfg: object) -> DefaultMessageStore:
    store = loaded_store(root, **cfg)
    store.start()
    return store


def msg(body: bytes, **props: str) -> MessageToStore:
    return MessageToStore(body, 0, encode_properties(props), int(time.time() * 1000))


def records(raw: bytes) -> list[tuple[str, int, int, bytes, dict[str, str]]]:
    """(topic, queue id, queue offset, body, properties) of each record."""
    out = []
    pos = 0
    while pos < len(raw):
        h = HEADER.unpack_from(raw, pos)
        total, qid, qoff, body_len = h[0], h[3], h[5], h[13]
        body = raw[pos + 80 : pos + 80 + body_len]
        t = pos + 80 + body_len
        tlen = int.from_bytes(raw[t : t + 2], "little")
        topic = raw[t + 2 : t + 2 + tlen].decode()
        p = t + 2 + tlen
        plen = int.from_bytes(raw[p : p + 2], "little")
        out.append((topic, qid, qoff, body, decode_properties(raw[p + 2 : p + 2 + plen])))
        pos += total
    return out


def test_properties_round_trip_and_find() -> None:
    props = {"TAGS": "A", "KEYS": "k1 k2", "x": "1", "UNIQ_KEY": "U"}
    raw = encode_properties(props)
    assert decode_properties(raw) == props
    assert find_property(raw, b"KEYS") == b"k1 k2"
    assert find_property(raw, b"EYS") is None  # must match a whole name
    assert find_property(raw, b"missing") is None
    # a name given twice: the last entry, as decode_properties (RocketMQ's HashMap) reads it
    for twice in (b"PGROUP\x01a\x02PGROUP\x01b\x02", b"x\x01PGROUP\x01c\x02PGROUP\x01a\x02PGROUP\x01b",
                  b"PGROUP\x01a\x02y\x01zPGROUP\x01c\x02PGROUP\x01b\x02q\x01r\x02"):
        assert find_property(twice, b"PGROUP") == b"b" == decode_properties(twice)["PGROUP"].encode()


def test_named_entries_read_and_cut_whole_entries_only() -> None:
    from pymq_proto.record import entries_named

    entries = entries_named(("TAGS", "REAL_QID"))
    for props in ({"TAGS": "A", "KEYS": "k", "REAL_QID": "3"}, {"KEYS": "k", "TAGS": "A"},
                  {"XTAGS": "TAGS", "REAL_QIDX": "1", "a": "REAL_QID"}, {}):
        raw = encode_properties(props)
        for tail in (raw, raw[:-1]):  # a last entry may lack its separator
            kept = {k: v for k, v in props.items() if k not in ("TAGS", "REAL_QID")}
            assert decode_properties(entries.cut(tail)) == kept, tail
            assert entries.values(tail) == {k.encode(): v.encode() for k, v in props.items()
                                            if k in ("TAGS", "REAL_QID")}, tail
    assert entries.cut(encode_properties({"KEYS": "k", "TAGS": "A"})) == b"KEYS\x01k\x02"


def test_delay_levels_parse_with_units() -> None:
    assert parse_delay_levels("100ms 1s 2m 1h 1d") == [100, 1000, 120_000, 3_600_000, 86_400_000]
    with pytest.raises(ValueError, match="'5x'"):
        parse_delay_levels("1s 5x")


def test_put_and_get_batches_across_queues(tmp_path: Path) -> None:
    store = make_store(tmp_path)
    try:
        r = store.put_messages("t", 0, [msg(b"a%d" % i, TAGS="A") for i in range(5)])
        assert r.status == PutMessageStatus.PUT_OK and r.queue_offset == 0
        store.put_messages("t", 1, [msg(b"b")])
        r2 = store.put_messages("t", 0, [msg(b"c", TAGS="C")])
        assert r2.queue_offset == 5
        got = store.get_message("t", 0, 0, 100)
        assert got.status == GetMessageStatus.FOUND and got.message_count == 6
        bodies = [rec[3] for rec in records(got.records)]
        assert bodies == [b"a0", b"a1", b"a2", b"a3", b"a4", b"c"]
        assert [rec[2] for rec in records(got.records)] == list(range(6))
        assert got.next_begin_offset == 6
        # tag filter by hash, and the offset moves past non-matching entries
        only_c = store.get_message("t", 0, 0, 100, tag_hashes=frozenset({__import__("zlib").crc32(b"C")}))
        assert [rec[3] for rec in records(only_c.records)] == [b"c"]
        assert store.get_message("t", 0, 6, 10).status == GetMessageStatus.OFFSET_OVERFLOW_ONE
        assert store.get_message("t", 0, 9, 10).status == GetMessageStatus.OFFSET_OVERFLOW_BADLY
        assert store.get_message("t", 3, 0, 10).status == GetMessageStatus.NO_MATCHED_LOGIC_QUEUE
        # max bytes: at least one message, never more than asked
        one = store.get_message("t", 0, 0, 100, max_bytes=1)
        assert one.message_count == 1 and one.next_begin_offset == 1
    finally:
        store.shutdown()


def test_oversized_message_and_batch_are_refused_without_writing(tmp_path: Path) -> None:
    store = make_store(tmp_path, max_message_size=1024, mapped_file_size_commit_log=64 * 1024)
    try:
        r = store.put_messages("t", 0, [msg(b"x" * 2000)])
        assert r.status == PutMessageStatus.MESSAGE_ILLEGAL
        assert "2000 bytes" in r.remark and "1024" in r.remark
        r = store.put_messages("t", 0, [msg(b"x" * 600), msg(b"y" * 600)])
        assert r.status == PutMessageStatus.MESSAGE_ILLEGAL and "split it" in r.remark
        assert store.commit_log.max_offset == 0
    finally:
        store.shutdown()


def test_segments_roll_with_blank_padding_and_reopen(tmp_path: Path) -> None:
    cfg = {"max_message_size": 4096, "mapped_file_size_commit_log": 16 * 1024}
    store = make_store(tmp_path, **cfg)
    bodies = [os.urandom(700) for _ in range(100)]  # ~78 KiB: several segments
    for i, b in enumerate(bodies):
        store.put_messages("t", i % 2, [msg(b)])
    assert len(store.commit_log.mapped_file_queue.files) > 3
    store.shutdown()
    store = make_store(tmp_path, **cfg)
    try:
        got = [rec[3] for q in (0, 1) for rec in records(store.get_message("t", q, 0, 1000).records)]
        assert sorted(got) == sorted(bodies)
        r = store.put_messages("t", 0, [msg(b"after")])
        assert r.queue_offset == 50
    finally:
        store.shutdown()


def test_recovery_rebuilds_missing_consume_queue_entries(tmp_path: Path) -> None:
    store = make_store(tmp_path)
    for i in range(20):
        store.put_messages("t", 0, [msg(b"m%d" % i)])
    store.shutdown()
    # lose the consume queue entirely (as if its writes never reached the disk)
    for f in (tmp_path / "consumequeue" / "t" / "0").iterdir():
        f.unlink()
    (tmp_path / "checkpoint").write_bytes(bytes(16))
    store = make_store(tmp_path)
    try:
        got = store.get_message("t", 0, 0, 100)
        assert [rec[3] for rec in records(got.records)] == [b"m%d" % i for i in range(20)]
    finally:
        store.shutdown()


def test_torn_tail_is_cut_and_never_served(tmp_path: Path) -> None:
    store = make_store(tmp_path)
    for i in range(10):
        store.put_messages("t", 0, [msg(b"good-%d" % i)])
    end = store.commit_log.max_offset
    last = store.put_messages("t", 0, [msg(b"torn" * 50)])
    seg = store.commit_log.mapped_file_queue.files[-1].file_name
    store.commit_log.mapped_file_queue.flush()
    # simulate a crash: no clean shutdown (abort file stays), half the last record is zeros
    for cq in store._all_consume_queues():
        cq.flush()
    with open(seg, "r+b") as f:
        f.seek(last.physical_offsets[0] + 100)
        f.write(bytes(60))
    store2 = make_store(tmp_path)
    try:
        assert store2.commit_log.max_offset == end
        got = store2.get_message("t", 0, 0, 100)
        assert [rec[3] for rec in records(got.records)] == [b"good-%d" % i for i in range(10)]
        assert store2.get_max_offset_in_queue("t", 0) == 10
        r = store2.put_messages("t", 0, [msg(b"next")])
        assert r.queue_offset == 10 and r.physical_offsets[0] == end
        assert records(store2.get_message("t", 0, 10, 1).records)[0][3] == b"next"
    finally:
        store2.shutdown()


@pytest.mark.parametrize("damage", ["a zeroed size", "a garbage entry", "garbage at a segment start"])
def test_a_damaged_consume_queue_entry_is_rebuilt_from_the_commit_log_after_a_clean_stop(
    tmp_path: Path, damage: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A clean stop's checkpoint says every record is queued; a queue file damaged since hid the
    entries from the damage on, and gave their queue offsets to new messages (two records then
    claimed one offset, and after a crash the old ones came back in place of the new)."""
    store = make_store(tmp_path, mapped_file_size_consume_queue=4 * 20)  # 4 entries a segment
    for i in range(10):
        store.put_messages("t", 0, [msg(b"m%d" % i, TAGS="a")])
    store.shutdown()
    segments = sorted((tmp_path / "consumequeue" / "t" / "0").iterdir())
    at = {"a zeroed size": (segments[2], 20 + 8, bytes(4)),  # offset 9: its size is 0
          "a garbage entry": (segments[1], 0, b"\xff" * 20),  # offset 4
          "garbage at a segment start": (segments[2], 0, b"\xff" * 20)}[damage]  # offset 8
    with open(at[0], "r+b") as f:
        f.seek(at[1])
        f.write(at[2])
    with caplog.at_level(logging.WARNING):
        again = make_store(tmp_path, mapped_file_size_consume_queue=4 * 20)
    try:
        assert "consume queue t-0: the entry at queue offset" in caplog.text and "rebuilt" in caplog.text
        assert again.get_max_offset_in_queue("t", 0) == 10
        got = again.get_message("t", 0, 0, 100)
        assert [rec[3] for rec in records(got.records)] == [b"m%d" % i for i in range(10)]
        assert again.put_messages("t", 0, [msg(b"new")]).queue_offset == 10
    finally:
        again.shutdown()
    (tmp_path / "abort").touch()  # and a crash: recovery walks the commit log's last segment again
    crashed = make_store(tmp_path, mapped_file_size_consume_queue=4 * 20)
    try:
        got = crashed.get_message("t", 0, 0, 100)
        assert [rec[3] for rec in records(got.records)] == [*(b"m%d" % i for i in range(10)), b"new"]
    finally:
        crashed.shutdown()


def test_a_start_reads_what_its_consume_queues_hold_not_their_whole_segments(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Each queue's last segment (6 MB by default) was read whole at every start: a broker of 4,096
    queues of a few messages each took ~25 s to start. Its zeros (holes) are not read now, and a
    byte past a queue's end far into the segment still marks it damaged."""
    store = make_store(tmp_path)
    for q in range(8):
        store.put_messages("t", q, [msg(b"a"), msg(b"b")])
    store.shutdown()
    read: list[int] = []  # bytes read from consume queue files (the commit log's recovery reads its own)
    pread = os.pread
    monkeypatch.setattr(os, "pread", lambda fd, n, at: (
        "/consumequeue/" in os.readlink(f"/proc/self/fd/{fd}") and read.append(n)) or pread(fd, n, at))
    again = make_store(tmp_path)
    try:
        assert [again.get_max_offset_in_queue("t", q) for q in range(8)] == [2] * 8
        cq_bytes = 8 * again.config.mapped_file_size_consume_queue
        assert sum(read) < cq_bytes // 100, (sum(read), cq_bytes)  # a few KB a queue, not 6 MB
    finally:
        again.shutdown()
    monkeypatch.setattr(os, "pread", pread)
    segment = next((tmp_path / "consumequeue" / "t" / "3").iterdir())
    with open(segment, "r+b") as f:  # one stray byte 5 MB past the queue's end
        f.seek(5_000_000)
        f.write(b"\x01")
    with caplog.at_level(logging.WARNING):
        damaged = make_store(tmp_path)
    try:
        assert "consume queue t-3: the entry at queue offset 2" in caplog.text
        assert damaged.get_max_offset_in_queue("t", 3) == 2  # rebuilt from the commit log
        assert damaged.put_messages("t", 3, [msg(b"c")]).queue_offset == 2
    finally:
        damaged.shutdown()


def test_a_damaged_queue_is_found_again_when_the_start_that_found_it_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The queue was cut on disk before its rebuild: a start failing in between (an index file
    that cannot be read) left it cut, and the next start served it short (review helper-90)."""
    cfg: dict[str, object] = {"mapped_file_size_consume_queue": 4 * 20}
    store = make_store(tmp_path, **cfg)
    for i in range(10):
        store.put_messages("t", 0, [msg(b"m%d" % i)])
    store.shutdown()
    with open(sorted((tmp_path / "consumequeue" / "t" / "0").iterdir())[1], "r+b") as f:
        f.write(b"\xff" * 20)  # queue offset 4
    def unreadable(self: IndexService, *, crashed: bool = False) -> None:
        raise OSError(5, "Input/output error")

    with monkeypatch.context() as patch:
        patch.setattr(IndexService, "load", unreadable)
        with pytest.raises(OSError):
            loaded_store(tmp_path, **cfg)
    again = make_store(tmp_path, **cfg)
    try:
        assert again.get_max_offset_in_queue("t", 0) == 10
        assert [r[3] for r in records(again.get_message("t", 0, 0, 100).records)] == [
            b"m%d" % i for i in range(10)]
    finally:
        again.shutdown()


def test_a_damaged_queue_of_a_topic_created_again_never_serves_the_deleted_topics_messages(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Cut to nothing, the queue was rebuilt from the log's start: the deleted topic's records
    took its offsets (review helper-90); then it was not rebuilt at all, its messages lost. The
    topic created again starts at queue offset 0 again: its run of offsets is the last one."""
    cfg: dict[str, object] = {"mapped_file_size_consume_queue": 4 * 20}
    store = make_store(tmp_path, **cfg)
    for i in range(5):
        store.put_messages("t", 0, [msg(b"deleted%d" % i)])
    store.delete_topic("t")
    for i in range(5):
        store.put_messages("t", 0, [msg(b"live%d" % i)])
    store.shutdown()
    with open(sorted((tmp_path / "consumequeue" / "t" / "0").iterdir())[0], "r+b") as f:
        f.seek(8)
        f.write(bytes(4))  # queue offset 0: size 0
    with caplog.at_level(logging.WARNING):
        again = make_store(tmp_path, **cfg)
    try:
        got = records(again.get_message("t", 0, 0, 100).records)
        assert [r[3] for r in got] == [b"live%d" % i for i in range(5)]
        assert "consume queue t-0: rebuilt from the commit log, queue offsets 0..4" in caplog.text
        assert again.put_messages("t", 0, [msg(b"live5")]).queue_offset == 5
    finally:
        again.shutdown()


# small segments: a queue segment holds 4 entries, the commit log rolls over every 16 KiB
SMALL_SEGMENTS: dict[str, object] = {"mapped_file_size_consume_queue": 4 * 20, "max_message_size": 4096,
                                     "mapped_file_size_commit_log": 16 * 1024}


def half_expired_queue(root: Path) -> DefaultMessageStore:
    """Queue t-0 with offsets 0..9 in commit-log segments retention has deleted, 10..19 left."""
    store = make_store(root, **SMALL_SEGMENTS)
    for i in range(10):
        store.put_messages("t", 0, [msg(b"old%d" % i)])
    for _ in range(200):  # the commit log rolls over a few segments
        store.put_messages("other", 0, [msg(b"x" * 300)])
    for i in range(10, 20):
        store.put_messages("t", 0, [msg(b"new%d" % i)])
    assert store.clean_expired_files(now=time.time() + 10**7) > 0
    return store


@pytest.mark.parametrize("damaged_offset", [9, 10])
def test_a_damaged_queue_whose_last_good_entry_expired_is_rebuilt(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, damaged_offset: int
) -> None:
    """The rebuild walked from the log's start and met a gap: the start failed (review helper-90);
    then the queue's entries past the damage were lost. Its good entries' records expired, so
    its records left in the log are the queue's: it begins at the first of them."""
    store = half_expired_queue(tmp_path)
    store.shutdown()
    with open(tmp_path / "consumequeue" / "t" / "0" / f"{8 * 20:020d}", "r+b") as f:
        f.seek((damaged_offset - 8) * 20 + 8)
        f.write(bytes(4))  # 9: its record expired; 10: the first whose record is in the log
    with caplog.at_level(logging.WARNING):
        again = make_store(tmp_path, **SMALL_SEGMENTS)
    try:
        assert "consume queue t-0: rebuilt from the commit log, queue offsets 10..19" in caplog.text
        assert again.get_min_offset_in_queue("t", 0) == 10
        assert again.get_max_offset_in_queue("t", 0) == 20
        below = again.get_message("t", 0, 9, 10)
        assert below.status == GetMessageStatus.OFFSET_TOO_SMALL and below.next_begin_offset == 10
        got = records(again.get_message("t", 0, 10, 100).records)
        assert [(r[2], r[3]) for r in got] == [(i, b"new%d" % i) for i in range(10, 20)]
        assert again.put_messages("t", 0, [msg(b"new20")]).queue_offset == 20
    finally:
        again.shutdown()
    assert_queue_begins_at_10(tmp_path, upto=21)  # the rebuilt queue is whole on disk


def test_a_damaged_queue_that_begins_segments_later_is_rebuilt(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Entry 0 damaged and every record before offset 10 expired: the queue begins in a later
    segment than its damaged one (which is removed once the rebuild is done)."""
    store = half_expired_queue(tmp_path)
    store.shutdown()
    queue_dir = tmp_path / "consumequeue" / "t" / "0"
    for segment in sorted(queue_dir.iterdir()):
        segment.unlink()
    with open(queue_dir / f"{0:020d}", "wb") as f:
        f.write(b"\xff" * 20 + bytes(60))  # one segment left, its entry 0 garbage
    with caplog.at_level(logging.WARNING):
        assert_queue_begins_at_10(tmp_path, upto=20)
    assert "consume queue t-0: rebuilt from the commit log, queue offsets 10..19" in caplog.text
    assert not (queue_dir / f"{0:020d}").exists()
    (tmp_path / "abort").touch()  # and a crash: the rebuilt queue is found whole
    assert_queue_begins_at_10(tmp_path, upto=20)


def assert_queue_begins_at_10(root: Path, upto: int) -> None:
    """A store started on ``root`` serves t-0's messages new10.. from queue offset 10 on."""
    store = make_store(root, **SMALL_SEGMENTS)
    try:
        assert store.get_min_offset_in_queue("t", 0) == 10
        got = records(store.get_message("t", 0, 10, 100).records)
        assert [(r[2], r[3]) for r in got] == [(i, b"new%d" % i) for i in range(10, upto)]
    finally:
        store.shutdown()


def test_retention_deletes_old_segments_and_moves_min_offset(tmp_path: Path) -> None:
    cfg = {"max_message_size": 4096, "mapped_file_size_commit_log": 16 * 1024, "file_reserved_time": 1.0}
    store = make_store(tmp_path, **cfg)
    try:
        for i in range(100):
            store.put_messages("t", 0, [msg(b"%04d" % i + bytes(700))])
        files_before = len(store.commit_log.mapped_file_queue.files)
        deleted = store.clean_expired_files(now=time.time() + 2 * 3600)
        assert deleted == files_before - 1
        min_off = store.get_min_offset_in_queue("t", 0)
        assert 0 < min_off < 100
        got = store.get_message("t", 0, 0, 10)
        assert got.status == GetMessageStatus.OFFSET_TOO_SMALL and got.next_begin_offset == min_off
        first = records(store.get_message("t", 0, min_off, 1).records)[0]
        assert first[2] == min_off and first[3][:4] == b"%04d" % min_off
    finally:
        store.shutdown()


def test_retention_that_deletes_queue_segments_moves_the_min_offset_at_once(tmp_path: Path) -> None:
    """With the queue's first segments deleted, its min offset stayed 0 until a restart, and a
    consumer at 0 was answered NO_MATCHED_MESSAGE with next offset 0 for ever (review helper-90)."""
    store = half_expired_queue(tmp_path)
    try:
        assert store.consume_queue("t", 0).queue.files[0].file_from_offset > 0  # queue segments went
        assert store.get_min_offset_in_queue("t", 0) == 10
        got = store.get_message("t", 0, 0, 32)
        assert got.status == GetMessageStatus.OFFSET_TOO_SMALL and got.next_begin_offset == 10
        assert [r[3] for r in records(store.get_message("t", 0, 10, 32).records)] == [
            b"new%d" % i for i in range(10, 20)]
    finally:
        store.shutdown()


def test_index_finds_messages_by_key_and_uniq_key(tmp_path: Path) -> None:
    store = make_store(tmp_path, max_hash_slot_num=64, max_index_num=400)
    try:
        for i in range(300):  # forces index file rolls and slot collisions
            store.put_messages("t", 0, [msg(b"m%d" % i, KEYS=f"order-{i % 30} all", UNIQ_KEY=f"U{i}")])
        now = int(time.time() * 1000) + 1000
        hits = store.query_message("t", "order-7", 100, 0, now)
        assert sorted(records(b"".join(hits)), key=lambda r: r[2])[0][3] == b"m7"
        assert len(hits) == 10
        assert len(store.query_message("t", "U123", 5, 0, now)) == 1
        assert store.query_message("other", "U123", 5, 0, now) == []
    finally:
        store.shutdown()


def test_delayed_message_waits_in_schedule_topic(tmp_path: Path) -> None:
    from pymq_broker.store.schedule_message_service import ScheduleMessageService

    store = make_store(tmp_path, message_delay_level="50ms 100ms")
    sms = ScheduleMessageService(store, tmp_path / "delayOffset.json")
    try:
        r = store.put_messages("real", 2, [msg(b"later", DELAY="5")])  # clamped to level 2
        assert r.topic == SCHEDULE_TOPIC and r.queue_id == 1
        sched = records(store.get_message(SCHEDULE_TOPIC, 1, 0, 1).records)[0]
        assert sched[4][MessageConst.PROPERTY_REAL_TOPIC] == "real"
        assert sched[4][MessageConst.PROPERTY_REAL_QUEUE_ID] == "2"
        sms.deliver_due(r.store_timestamp + 50)  # not yet due
        assert store.get_max_offset_in_queue("real", 2) == 0
        sms.deliver_due(r.store_timestamp + 100)
        got = records(store.get_message("real", 2, 0, 1).records)
        # RocketMQ's delivered copy keeps DELAY (the clamped level), REAL_TOPIC and REAL_QID ...
        assert got[0][3] == b"later" and got[0][4][MessageConst.PROPERTY_DELAY_TIME_LEVEL] == "2"
        assert got[0][4][MessageConst.PROPERTY_REAL_TOPIC] == "real"
        assert got[0][4][MessageConst.PROPERTY_REAL_QUEUE_ID] == "2"
        assert sms.offset_table == {2: 1}
        # ... and is not delayed again by it
        assert store.get_max_offset_in_queue(SCHEDULE_TOPIC, 1) == 1
        sms.deliver_due(r.store_timestamp + 1000)
        assert store.get_max_offset_in_queue("real", 2) == 1
    finally:
        store.shutdown()


@pytest.mark.parametrize("ratio", [40, 0])
def test_in_memory_check_of_setzeroifnotfound(tmp_path: Path, ratio: int) -> None:
    """RocketMQ's estimate: a record among the newest accessMessageInMemoryMaxRatio percent of
    physical memory of the commit log is in memory; no record at the offset, never."""
    store = make_store(tmp_path, access_message_in_memory_max_ratio=ratio)
    try:
        assert not store.check_in_mem_by_consume_offset("t", 0, 0)  # no such queue
        store.put_messages("t", 0, [msg(b"a"), msg(b"b")])
        assert store.check_in_mem_by_consume_offset("t", 0, 0) is (ratio > 0)
        assert not store.check_in_mem_by_consume_offset("t", 0, 2)  # past the end
    finally:
        store.shutdown()
    with pytest.raises(ValueError, match="accessMessageInMemoryMaxRatio"):
        MessageStoreConfig(store_path_root_dir=tmp_path, access_message_in_memory_max_ratio=101)


def test_look_messages_by_offsets_reads_as_one_by_one(tmp_path: Path) -> None:
    """The bulk read of send back: same records (or None) as look_message_by_offset, any order."""
    cfg = {"max_message_size": 8192, "mapped_file_size_commit_log": 16 * 1024}
    store = make_store(tmp_path, **cfg)
    try:
        phys: list[int] = []
        for i in range(60):  # several segments, some records bigger than the read-ahead
            size = 5000 if i % 7 == 0 else 100
            put = store.put_messages("t", i % 2, [msg(b"%03d" % i + bytes(size), TAGS="x")])
            phys += put.physical_offsets
        asked = [*reversed(phys), phys[3] + 1, -5, store.commit_log.max_offset + 10, phys[5], phys[5]]
        got = store.look_messages_by_offsets(asked)
        assert got == [store.look_message_by_offset(p) for p in asked]
        assert all(r is not None for r in got[: len(phys)]) and got[-5:-2] == [None, None, None]
        assert got[0] is not None and got[0][80:83] == b"059"
    finally:
        store.shutdown()


@pytest.mark.parametrize("torn_flush", [False, True])
def test_keys_stored_after_the_last_index_flush_are_found_after_a_crash(
    tmp_path: Path, torn_flush: bool
) -> None:
    """Index entries are written as they come, the slot table and header at a flush: a
    crash must not lose the keys stored since (nor index anything twice), even when it
    struck between the table's write and the header's."""
    from pymq_broker.store.index_service import INDEX_HEADER

    cfg = {"max_hash_slot_num": 64, "max_index_num": 1000}
    store = loaded_store(tmp_path, **cfg)  # not started: nothing flushes behind the test's back
    for i in range(80):
        store.put_messages("t", 0, [msg(b"m%d" % i, KEYS=f"k{i}", UNIQ_KEY=f"U{i}")])
        if i == 39:
            store.checkpoint_now()
    newest = store.index_service.files[-1]
    if torn_flush:  # the slot table reached the disk, the header did not
        assert newest.slots is not None
        os.pwrite(newest.fd, newest.slots.tobytes(), INDEX_HEADER.size)
    # the process dies here: no shutdown, the abort file stays
    again = make_store(tmp_path, **cfg)
    try:
        now = int(time.time() * 1000) + 1000
        for i in range(80):
            for key in (f"k{i}", f"U{i}"):
                hits = again.query_message("t", key, 5, 0, now)
                assert [r[3] for r in records(b"".join(hits))] == [b"m%d" % i], key
        assert again.index_service.files[-1].index_count == 1 + 2 * 80  # each key once
    finally:
        again.shutdown()


def test_allocate_mapped_file_service_allocates_ahead_and_never_changes_a_record(tmp_path: Path) -> None:
    """Disk blocks after the write position are allocated while appends go on; every record reads
    back as written (allocating writes nothing), and how far ahead follows the writer's size."""
    store = make_store(tmp_path / "warm", mapped_file_size_commit_log=64 * MiB)
    warm = store.commit_log.allocate_mapped_file_service
    assert warm is not None and warm.warmed_bytes == 0
    try:
        bodies = [bytes([i % 251]) * 1000 for i in range(600)]
        for i in range(0, len(bodies), 100):  # 100 kB appends: 16x of them is 1.6 MB ahead
            store.put_messages("t", 0, [msg(b, KEYS=f"k{i + j}") for j, b in enumerate(bodies[i : i + 100])])
        written = store.commit_log.max_offset
        deadline = time.monotonic() + 10
        while warm.warmed_bytes < 1 * MiB and time.monotonic() < deadline:
            time.sleep(0.01)
        assert warm.warmed_bytes >= 1 * MiB, "nothing was allocated ahead of the writer"
        assert warm.warmed_bytes <= 64 * MiB - written  # never behind the writer, never past the segment
        segment = store.commit_log.mapped_file_queue.last_mapped_file()
        assert segment is not None
        on_disk = os.fstat(segment.fd).st_blocks * 512  # a sparse file holds only what was written
        assert on_disk >= written + 1 * MiB
        assert os.fstat(segment.fd).st_size == 64 * MiB
        got = [r[3] for r in records(store.get_message("t", 0, 0, 1000).records)]
        assert got == bodies
    finally:
        store.shutdown()
    store2 = make_store(tmp_path / "warm", mapped_file_size_commit_log=64 * MiB)  # a restart reads them all
    try:
        assert [r[3] for r in records(store2.get_message("t", 0, 0, 1000).records)] == bodies
    finally:
        store2.shutdown()
    off = make_store(tmp_path / "off", warm_mapped_file_enable=False)
    try:
        assert off.commit_log.allocate_mapped_file_service is None
    finally:
        off.shutdown()


def test_a_file_system_that_cannot_allocate_ahead_only_loses_the_speed_up(tmp_path: Path) -> None:
    import errno

    from pymq_broker.store.allocate_mapped_file_service import AllocateMappedFileService
    from pymq_broker.store.mapped_file import MappedFile

    calls: list[tuple[int, int]] = []

    def refusing(fd: int, offset: int, length: int) -> None:
        calls.append((offset, length))
        raise OSError(errno.EOPNOTSUPP, os.strerror(errno.EOPNOTSUPP))

    mf = MappedFile(tmp_path / "00000000000000000000", 0, 8 * MiB)
    try:
        service = AllocateMappedFileService(fallocate=refusing)
        mf.append(b"x" * 1000)
        service.appended(mf, 1000)
        service.run_once()
        assert calls == [(1000, 1 * MiB)]  # one chunk ahead of a small append
        mf.append(b"y" * 100_000)
        service.appended(mf, 100_000)
        service.run_once()
        assert len(calls) == 1 and service.warmed_bytes == 0  # refused once: never asked again
        assert mf.read(0, 101_000) == b"x" * 1000 + b"y" * 100_000
    finally:
        mf.close()


def test_a_closed_segment_flushes_and_allocates_in_no_other_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Retention (on a thread) or a DeleteTopic closes a segment that the allocate-ahead service or
    a flush thread still holds. close() kept the old fd number: their fallocate / fdatasync then
    acted on whichever file the system opened next under that number."""
    import threading

    from pymq_broker.store import mapped_file
    from pymq_broker.store.allocate_mapped_file_service import AllocateMappedFileService
    from pymq_broker.store.mapped_file import MappedFile

    allocated: list[int] = []
    synced: list[int] = []
    real_sync = os.fdatasync

    def recording_sync(fd: int) -> None:  # os's, for every thread: record, then sync as asked
        synced.append(fd)
        real_sync(fd)

    mf = MappedFile(tmp_path / "00000000000000000000", 0, 8 * MiB)
    service = AllocateMappedFileService(fallocate=lambda fd, offset, length: allocated.append(fd))
    mf.append(b"x" * 1000)  # dirty, and an allocation asked for: both threads will act on it
    service.appended(mf, 1000)
    old = mf.fd
    mf.close()
    assert mf.fd == -1
    reused = os.open(tmp_path / "another", os.O_RDWR | os.O_CREAT, 0o644)
    if reused != old:  # the next open takes the lowest free number; make sure it is this one
        os.dup2(reused, old)
        os.close(reused)
        reused = old
    try:
        monkeypatch.setattr(mapped_file.os, "fdatasync", recording_sync)
        service.run_once()  # raises nothing: the service thread goes on
        assert mf.flush() == 0
        assert old not in allocated and old not in synced
        assert service.warmed_bytes == 0
    finally:
        monkeypatch.undo()
        os.close(reused)

    # close() waits for an allocation in progress, rather than giving its number back under it
    mf = MappedFile(tmp_path / "00000000000000000001", 0, 8 * MiB)
    in_call, release = threading.Event(), threading.Event()

    def held(fd: int, offset: int, length: int) -> None:
        in_call.set()
        release.wait(5)
        os.fstat(fd)  # still this segment's file: the number was not closed under the call

    service = AllocateMappedFileService(fallocate=held)
    mf.append(b"x" * 1000)
    service.appended(mf, 1000)
    allocating = threading.Thread(target=service.run_once)
    allocating.start()
    try:
        assert in_call.wait(5)
        closing = threading.Thread(target=mf.close)
        closing.start()
        closing.join(0.3)
        assert closing.is_alive()
    finally:
        release.set()
        allocating.join(5)
    closing.join(5)
    assert mf.fd == -1 and service.warmed_bytes == 1 * MiB


def test_a_put_left_for_the_reput_is_seen_by_every_reader_and_survives_a_crash(tmp_path: Path) -> None:
    """put_records(reput_later=True) answers before the consume queue and index are written
    (RocketMQ's ReputMessageService): every read dispatches what is queued first, the
    checkpoint never passes an undispatched record, and a crash before the reput loses nothing."""
    from pymq_broker.store.encoded_batch import EncodedRecords

    store = DefaultMessageStore(MessageStoreConfig(store_path_root_dir=tmp_path), HOST)
    store.load()  # not started: nothing flushes behind the test's back

    def put(i: int) -> None:
        batch = EncodedRecords.from_messages("t", [msg(b"m%d" % i, KEYS=f"k{i}")])
        assert store.put_records("t", 0, batch, reput_later=True).ok
        assert store.dispatched_offset == pos[i]  # answered, not yet dispatched

    pos = [0]
    put(0)
    assert store.get_max_offset_in_queue("t", 0) == 1
    pos.append(store.dispatched_offset)
    put(1)
    now = int(time.time() * 1000) + 1000
    assert [r[3] for r in records(b"".join(store.query_message("t", "k1", 5, 0, now)))] == [b"m1"]
    pos.append(store.dispatched_offset)
    put(2)
    got = store.get_message("t", 0, 0, 10)
    assert [r[3] for r in records(got.records)] == [b"m0", b"m1", b"m2"]
    pos.append(store.dispatched_offset)
    put(3)
    store.checkpoint_now()  # the flush thread's checkpoint: it must not claim record 3 dispatched
    assert store.checkpoint.logics_msg_offset == pos[3]
    # the process dies here, before the reput of record 3
    again = make_store(tmp_path)
    try:
        got = again.get_message("t", 0, 0, 10)
        assert [r[3] for r in records(got.records)] == [b"m0", b"m1", b"m2", b"m3"]
        hits = again.query_message("t", "k3", 5, 0, now)
        assert [r[3] for r in records(b"".join(hits))] == [b"m3"]
    finally:
        again.shutdown()


def _fill_the_index_disk(store: DefaultMessageStore) -> list[bool]:
    """Make index writes fail as on a full disk while the returned flag's [0] is True."""
    real = store.index_service.build_index
    fail = [True]

    def full_disk(*args: object, **kwargs: object) -> None:
        if fail[0]:
            raise OSError(28, "No space left on device")
        real(*args, **kwargs)  # type: ignore[arg-type]

    store.index_service.build_index = full_disk  # type: ignore[method-assign]
    return fail


def test_a_failed_reput_stays_first_in_line_and_loses_nothing(tmp_path: Path) -> None:
    """A dispatch that fails (say the index's disk is full) must not drop the put's consume
    queue entries nor let a later put's entries skip ahead: it is retried, in order, by the
    next reader, which sees the error until the dispatch succeeds."""
    from pymq_broker.store.encoded_batch import EncodedRecords

    store = DefaultMessageStore(MessageStoreConfig(store_path_root_dir=tmp_path), HOST)
    store.load()
    fail = _fill_the_index_disk(store)
    for i in range(2):
        batch = EncodedRecords.from_messages("t", [msg(b"m%d" % i, KEYS=f"k{i}")])
        assert store.put_records("t", 0, batch, reput_later=True).ok
    with pytest.raises(OSError, match="No space left"):
        store.get_max_offset_in_queue("t", 0)
    with pytest.raises(OSError, match="No space left"):
        store.get_message("t", 0, 0, 10)
    fail[0] = False
    got = store.get_message("t", 0, 0, 10)
    assert [r[3] for r in records(got.records)] == [b"m0", b"m1"]
    now = int(time.time() * 1000) + 1000
    for i in range(2):
        hits = store.query_message("t", f"k{i}", 5, 0, now)
        assert [r[3] for r in records(b"".join(hits))] == [b"m%d" % i]
    store.shutdown()


def test_a_failing_dispatch_fails_no_put_retention_or_shutdown(tmp_path: Path) -> None:
    """Once stored, a message is not answered as a failed put (the producer would send it again);
    the puts after it are refused as on a full disk (DISK_FULL), retention still frees old
    segments, and a shutdown still stops the services and leaves the abort file, so that the next
    start dispatches again what was left."""
    from pymq_broker.store.encoded_batch import EncodedRecords

    cfg = MessageStoreConfig(store_path_root_dir=tmp_path, mapped_file_size_commit_log=4096,
                             max_message_size=1024)
    store = DefaultMessageStore(cfg, HOST)
    store.load()
    store.start()
    for _ in range(40):  # several commit-log segments
        assert store.put_messages("old", 0, [msg(b"x" * 200)]).ok
    segments = len(store.commit_log.mapped_file_queue.files)
    fail = _fill_the_index_disk(store)
    put = store.put_records("t", 0, EncodedRecords.from_messages("t", [msg(b"a", KEYS="k")]))
    assert put.ok  # stored, its dispatch waits
    refused = store.put_messages("other", 0, [msg(b"b")])
    assert refused.status == PutMessageStatus.SERVICE_NOT_AVAILABLE
    assert refused.remark == ("the broker's disk is full: writing the store failed: "
                              "No space left on device; free space there")
    assert store.clean_expired_files(now=time.time() + 10 * 24 * 3600) > 0
    assert len(store.commit_log.mapped_file_queue.files) < segments
    store.shutdown()
    assert not any(s._thread.is_alive() for s in store._services)
    assert (tmp_path / "abort").exists()

    fail[0] = False
    again = DefaultMessageStore(cfg, HOST)
    again.load()
    again.start()
    assert [r[3] for r in records(again.get_message("t", 0, 0, 10).records)] == [b"a"]
    assert again.put_messages("other", 0, [msg(b"b")]).ok
    assert [r[3] for r in records(again.get_message("other", 0, 0, 10).records)] == [b"b"]
    again.shutdown()


def test_group_commit_answers_every_put_it_covers_though_one_stopped_waiting() -> None:
    # SYNC_FLUSH: a put whose wait timed out (FLUSH_DISK_TIMEOUT) cancels its future; the
    # other puts of the same round must still be answered, not dropped with the round.
    from pymq_broker.store.flush import GroupCommitService

    flushed = [0]
    service = GroupCommitService(lambda: flushed[0])
    gave_up, waiting, later = service.put_request(10), service.put_request(20), service.put_request(99)
    assert gave_up.cancel()
    flushed[0] = 50
    service.run_once()
    assert waiting.result(timeout=0) is True
    assert not later.done()  # not covered yet: kept for the next round
    flushed[0] = 100
    service.run_once()
    assert later.result(timeout=0) is True


def _crash(store: DefaultMessageStore) -> None:
    """kill -9 as the store sees it: what was written is on disk, nothing else ran."""
    for s in store._services:
        s.run_once = lambda: None  # type: ignore[method-assign]  # no last flush or checkpoint
        s.shutdown()
    store.commit_log.flush()
    for cq in store._all_consume_queues():
        cq.flush()


def _bodies(store: DefaultMessageStore, topic: str, queue_id: int = 0) -> list[bytes]:
    return [rec[3] for rec in records(store.get_message(topic, queue_id, 0, 1000).records)]


@pytest.mark.parametrize("left", [8, 40, 79])
def test_a_segment_ending_in_a_blank_shorter_than_a_header_keeps_the_next_segment_after_a_crash(
    tmp_path: Path, left: int
) -> None:
    """A blank end-of-file record needs 8 bytes, not a record header's 80: recovery took a
    shorter one for a torn record, cut the log there and deleted the next segment."""
    seg = 64 * 1024
    cfg = {"max_message_size": 16 * 1024, "mapped_file_size_commit_log": seg}
    store = loaded_store(tmp_path, **cfg)
    size = store.put_messages("t", 0, [msg(b"x" * 100)]).end_offset
    while store.commit_log.max_offset + size + 2000 < seg:
        store.put_messages("t", 0, [msg(b"x" * 100)])
    last = seg - store.commit_log.max_offset - left  # the record that leaves `left` bytes
    store.put_messages("t", 0, [msg(b"y" * (last - size + 100))])
    assert seg - store.commit_log.max_offset == left
    for i in range(5):
        r = store.put_messages("t", 0, [msg(b"after-roll-%d" % i)])
        assert r.physical_offsets[0] >= seg
    before, end = _bodies(store, "t"), store.commit_log.max_offset
    _crash(store)
    again = make_store(tmp_path, **cfg)
    try:
        assert again.commit_log.max_offset == end
        assert _bodies(again, "t") == before
        assert before[-1] == b"after-roll-4"
    finally:
        again.shutdown()


def test_a_record_larger_than_recovery_reads_at_once_survives_a_crash(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pymq_broker.store import commit_log

    monkeypatch.setattr(commit_log, "RECOVER_READ_CHUNK", 64 * 1024)
    cfg = {"max_message_size": 1 * MiB}
    store = loaded_store(tmp_path, **cfg)
    bodies = [b"small", os.urandom(200 * 1024), b"after"]
    for b in bodies:
        store.put_messages("t", 0, [msg(b)])
    end = store.commit_log.max_offset
    _crash(store)
    again = make_store(tmp_path, **cfg)
    try:
        assert again.commit_log.max_offset == end
        assert _bodies(again, "t") == bodies
    finally:
        again.shutdown()


@pytest.mark.parametrize("recreate", [True, False])
def test_a_deleted_topic_stays_deleted_after_a_crash(tmp_path: Path, recreate: bool) -> None:
    """Recovery re-queued every record from the checkpoint segment's start: a deleted topic's
    messages came back, after the re-created topic's own."""
    store = make_store(tmp_path)
    for i in range(5):
        store.put_messages("t", 0, [msg(b"old-%d" % i)])
    store.put_messages("other", 0, [msg(b"kept")])
    store.delete_topic("t")
    if recreate:
        for i in range(3):
            store.put_messages("t", 0, [msg(b"new-%d" % i)])
        store.checkpoint_now()
    _crash(store)
    again = make_store(tmp_path)
    try:
        assert _bodies(again, "t") == ([b"new-0", b"new-1", b"new-2"] if recreate else [])
        assert again.get_max_offset_in_queue("t", 0) == (3 if recreate else 0)
        assert _bodies(again, "other") == [b"kept"]
    finally:
        again.shutdown()


def _eight_messages_five_checkpointed(tmp_path: Path) -> DefaultMessageStore:
    """A store whose topic t holds old-0..old-7 in queue 0, the checkpoint after old-4."""
    store = make_store(tmp_path)
    for i in range(5):
        store.put_messages("t", 0, [msg(b"old-%d" % i)])
    store.checkpoint_now()
    for i in range(5, 8):
        store.put_messages("t", 0, [msg(b"old-%d" % i)])
    return store


def test_a_consume_queue_that_begins_later_keeps_its_entries_across_restarts(tmp_path: Path) -> None:
    """A queue rebuilt from mid-queue (its first entries gone) had zeros before its first entry:
    the next load took them for the queue's end, max offset 0, and acknowledged messages were
    unreadable and their offsets reused. RocketMQ's fillPreBlank entries hold that place."""
    store = _eight_messages_five_checkpointed(tmp_path)
    _crash(store)
    shutil.rmtree(tmp_path / "consumequeue" / "t")  # the queue's files are gone: rebuilt from 5
    again = make_store(tmp_path)
    assert (again.get_min_offset_in_queue("t", 0), again.get_max_offset_in_queue("t", 0)) == (5, 8)
    for i in range(8, 11):
        assert again.put_messages("t", 0, [msg(b"new-%d" % i)]).queue_offset == i
    again.shutdown()
    for restart in range(2):  # a clean restart, then a crash
        again = make_store(tmp_path)
        assert (again.get_min_offset_in_queue("t", 0), again.get_max_offset_in_queue("t", 0)) == (5, 11)
        assert again.get_message("t", 0, 0, 10).status == GetMessageStatus.OFFSET_TOO_SMALL
        got = records(again.get_message("t", 0, 5, 100).records)
        assert [(r[2], r[3]) for r in got] == [(i, b"old-%d" % i) for i in range(5, 8)] + [
            (i, b"new-%d" % i) for i in range(8, 11)]
        if restart:
            _crash(again)
        else:
            again.shutdown()
    again = make_store(tmp_path)
    try:
        assert again.put_messages("t", 0, [msg(b"newer")]).queue_offset == 11
    finally:
        again.shutdown()


@pytest.mark.parametrize("removed", [False, True])
def test_a_kill_while_a_topic_is_deleted_never_brings_its_queue_back_mid_queue(
    tmp_path: Path, removed: bool
) -> None:
    """delete_topic removed the queue files, then moved the checkpoint past the topic's records: a
    kill -9 in between re-queued the records after the older checkpoint, and the deleted topic's
    queue came back beginning mid-queue (offsets 5..7). The checkpoint now goes first. The files
    are renamed aside (detach_topic), then removed (on another thread by the broker): a kill -9
    after either leaves nothing of the topic for the next start."""
    store = _eight_messages_five_checkpointed(tmp_path)
    detached = store.detach_topic("t")
    if removed:
        detached.remove()
    _crash(store)
    again = make_store(tmp_path)
    try:
        # of what was renamed aside, the emptied directory: the broker finishes the deletion by it
        (marker,) = (tmp_path / "consumequeue").iterdir()
        assert marker.name.startswith(".deleted-t-") and not any(marker.iterdir())
        assert list(again.unfinished_deletions) == ["t"]
        assert again.get_max_offset_in_queue("t", 0) == 0
        assert _bodies(again, "t") == []
        assert again.put_messages("t", 0, [msg(b"new")]).queue_offset == 0  # created again
        assert _bodies(again, "t") == [b"new"]
    finally:
        again.shutdown()


def test_delay_progress_past_a_cut_schedule_queue_goes_back_to_its_end(tmp_path: Path) -> None:
    """A crash cut the log (and the schedule queue) below the saved progress: the delayed
    messages stored after the restart take those offsets again and must still be delivered."""
    from pymq_broker.store.schedule_message_service import ScheduleMessageService

    store = make_store(tmp_path, message_delay_level="50ms")
    try:
        path = tmp_path / "delayOffset.json"
        saved = ScheduleMessageService(store, path)
        saved.offset_table = {1: 5}  # delivered up to 5 before the crash cut the queue to 0
        saved.persist()
        sms = ScheduleMessageService(store, path)  # the restart
        sms.load()
        assert sms.offset_table == {1: 0}
        r = store.put_messages("real", 0, [msg(b"later", DELAY="1")])
        # a second crash before a round wrote the progress: the correction must be on disk
        sms = ScheduleMessageService(store, path)
        sms.load()
        assert sms.offset_table == {1: 0}
        sms.deliver_due(r.store_timestamp + 1000)
        assert [rec[3] for rec in records(store.get_message("real", 0, 0, 10).records)] == [b"later"]
    finally:
        store.shutdown()


def test_a_checkpoint_never_goes_back_when_two_are_written_at_once(tmp_path: Path) -> None:
    """The flush thread read the dispatched offset, then waited in an fsync while delete_topic
    checkpointed past the deleted topic's records; its older offset, written last, brought the
    deleted topic back after a crash."""
    import threading

    store = make_store(tmp_path, flush_interval_consume_queue=3_600_000)  # the test is the flush thread
    store.put_messages("other", 0, [msg(b"kept")])
    cq = store.consume_queue("other", 0)
    assert cq is not None
    real_flush, entered, release = cq.flush, threading.Event(), threading.Event()

    def slow_flush() -> None:  # an fsync that takes a while
        entered.set()
        release.wait(10)
        real_flush()

    cq.flush = slow_flush  # type: ignore[method-assign]
    flush_thread = threading.Thread(target=store.checkpoint_now)
    flush_thread.start()
    assert entered.wait(10)
    cq.flush = real_flush  # type: ignore[method-assign]

    def delete() -> None:  # the event loop: puts, then an admin deletes the topic
        for i in range(5):
            store.put_messages("t", 0, [msg(b"old-%d" % i)])
        store.delete_topic("t")

    loop = threading.Thread(target=delete)
    loop.start()
    loop.join(0.5)  # delete_topic's checkpoint waits for the flush thread's (or, before, went first)
    release.set()
    flush_thread.join(10)
    loop.join(10)
    assert store.checkpoint.logics_msg_offset == store.dispatched_offset
    _crash(store)
    again = make_store(tmp_path)
    try:
        assert _bodies(again, "t") == [] and _bodies(again, "other") == [b"kept"]
    finally:
        again.shutdown()


def test_recovery_does_not_read_a_corrupt_records_claimed_size(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A torn header claiming hundreds of MiB is cut there, not read up to the segment's end."""
    from pymq_broker.store import commit_log
    from pymq_broker.store.mapped_file import MappedFile

    monkeypatch.setattr(commit_log, "RECOVER_READ_CHUNK", 64 * 1024)
    cfg = {"max_message_size": 256 * 1024}
    store = loaded_store(tmp_path, **cfg)
    for i in range(3):
        store.put_messages("t", 0, [msg(b"good-%d" % i)])
    end = store.commit_log.max_offset
    big = store.put_messages("t", 0, [msg(os.urandom(100 * 1024))])  # over one read chunk
    _crash(store)
    seg = store.commit_log.mapped_file_queue.files[0].file_name
    with open(seg, "r+b") as f:  # its size field torn: 512 MiB
        f.seek(big.physical_offsets[0])
        f.write((512 << 20).to_bytes(4, "little"))
    reads: list[int] = []
    real_read = MappedFile.read

    def read(self: MappedFile, pos: int, size: int) -> bytes:
        if self.file_name.parent.name == "commitlog":
            reads.append(size)
        return real_read(self, pos, size)

    monkeypatch.setattr(MappedFile, "read", read)
    again = make_store(tmp_path, **cfg)
    try:
        assert again.commit_log.max_offset == end
        assert max(reads) <= 1 << 20
    finally:
        again.shutdown()


def test_topic_configs_load_with_fields_a_later_version_wrote(tmp_path: Path) -> None:
    """Going back a version must not keep the broker from starting on its topics.json."""
    import json

    from pymq_broker.manager.topic_config_manager import TopicConfig, TopicConfigManager

    later = TopicConfigManager(tmp_path / "topics.json")
    later.create_topic(TopicConfig("orders", 2, 2), update_if_exists=False)
    data = json.loads((tmp_path / "topics.json").read_text())
    data["topicConfigTable"]["orders"]["retention_hours"] = 72  # a field this version does not know
    (tmp_path / "topics.json").write_text(json.dumps(data))
    loaded = TopicConfigManager(tmp_path / "topics.json")
    loaded.load()
    cfg = loaded.select_topic_config("orders")
    assert cfg is not None and cfg.read_queue_nums == 2
    assert cfg.topic_id == later.select_topic_config("orders").topic_id != 0  # type: ignore[union-attr]


def test_an_append_while_a_flush_reads_its_target_is_flushed_by_the_next(tmp_path: Path) -> None:
    """MappedFile.flush runs on a flushing thread (GroupCommitService, a delivery round's write)
    while the loop appends: an append between reading the target and clearing the dirty flag lost
    its flag, and every later flush stopped short of it (review helper-109)."""
    from pymq_broker.store.mapped_file import MappedFile

    class Racing(MappedFile):
        append_while_read = False

        @property  # type: ignore[override]
        def wrote_position(self) -> int:
            position: int = self.__dict__.get("_position", 0)
            if self.append_while_read:
                self.append_while_read = False
                self.append(b"y" * 50)  # lands as the flush reads: the flush's target is the old end
            return position

        @wrote_position.setter
        def wrote_position(self, value: int) -> None:
            self.__dict__["_position"] = value

    mf = Racing(tmp_path / "00000000000000000000", 0, MiB)
    try:
        mf.append(b"x" * 100)
        mf.append_while_read = True
        assert mf.flush() == 100
        assert mf.flush() == 150  # the racing append is flushed next time, not never
    finally:
        mf.close()


def test_a_flush_waits_for_one_in_progress_on_another_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Several threads flush the commit log (the group commit, a delivery round's progress write, a
    recall's) before writing what it covers. One that found the dirty flag cleared by another still
    in its fdatasync returned at once: its caller's progress reached the disk before the records."""
    import threading

    from pymq_broker.store import mapped_file
    from pymq_broker.store.mapped_file import MappedFile

    in_sync, release = threading.Event(), threading.Event()
    events: list[object] = []
    real_sync = os.fdatasync

    def slow_sync(fd: int) -> None:  # os's, for every thread: other tests' flush threads may run
        if fd != mf.fd:
            return real_sync(fd)
        if not in_sync.is_set():
            in_sync.set()
            release.wait(5)
        real_sync(fd)
        events.append("synced")

    mf = MappedFile(tmp_path / "00000000000000000000", 0, MiB)
    try:
        mf.append(b"x" * 100)
        monkeypatch.setattr(mapped_file.os, "fdatasync", slow_sync)
        first = threading.Thread(target=mf.flush)
        first.start()
        assert in_sync.wait(5)
        second = threading.Thread(target=lambda: events.append(("second flush returned", mf.flush())))
        second.start()
        second.join(0.5)
        assert second.is_alive()  # waits for the fdatasync in progress
        release.set()
        first.join(5)
        second.join(5)
        assert events == ["synced", ("second flush returned", 100)]
    finally:
        release.set()
        mf.close()

"""A full disk: the store refuses puts with SERVICE_NOT_AVAILABLE (RocketMQ's DISK_FULL), names
why, keeps serving reads, loses nothing, and delayed and timer messages wait instead of being
skipped."""

from __future__ import annotations

import errno
import os
import time
from pathlib import Path
from typing import Any

import pytest
from broker_process import BrokerProcess
from pymq_broker.cli import parser
from pymq_broker.common.mix_all import SCHEDULE_TOPIC
from pymq_broker.manager.topic_config_manager import TopicConfigManager
from pymq_broker.store import mapped_file, schedule_message_service
from pymq_broker.store.config import MessageStoreConfig
from pymq_broker.store.disk_space import (
    DiskSpaceService,
    disk_partition_space,
    human_readable_byte_count,
    used_ratio,
)
from pymq_broker.store.message_store import DefaultMessageStore
from pymq_broker.store.results import PutMessageError, PutMessageResult, PutMessageStatus
from pymq_broker.store.schedule_message_service import ScheduleMessageService
from pymq_broker.store.timer_message_store import TimerMessageStore
from pymq_broker.transaction.transactional_message_service import (
    TRANS_OP_HALF_TOPIC,
    TransactionalMessageService,
    TransactionConfig,
)
from pyspark_pymq import Admin, Message, MessageQueue, Producer, PullConsumer
from pyspark_pymq.errors import BrokerUnavailableError
from test_store import make_store, msg, records

GiB = 1 << 30
DISK_FULL = PutMessageResult(PutMessageStatus.SERVICE_NOT_AVAILABLE, remark="the broker's disk is full")


class FakeDisk:
    """What the store's partitions look like (percent used, bytes available), and a clock."""

    def __init__(self) -> None:
        self.percent = 50.0
        self.available = 100 * GiB
        self.now = 0.0

    def space(self, _path: Path) -> tuple[int, int]:
        if self.percent >= 100:
            return 100 * GiB, 0
        return int(self.available * self.percent / (100 - self.percent)), self.available

    def clock(self) -> float:
        return self.now

    def later(self) -> None:
        self.now += 1.5  # past the once-a-second look at the partitions


def watch(store: DefaultMessageStore, disk: FakeDisk) -> DefaultMessageStore:
    ds = store.disk_space
    store.disk_space = DiskSpaceService(ds.paths, ds.warning_level_ratio, ds.reserve_bytes,
                                        space=disk.space, clock=disk.clock)
    return store


def bodies(store: DefaultMessageStore, topic: str, queue_id: int = 0) -> list[bytes]:
    return [r[3] for r in records(store.get_message(topic, queue_id, 0, 100).records)]


def test_over_the_warning_level_puts_are_refused_reads_go_on_and_puts_come_back(tmp_path: Path) -> None:
    disk = FakeDisk()
    store = watch(make_store(tmp_path), disk)
    try:
        assert store.put_messages("t", 0, [msg(b"before")]).ok
        disk.percent = 91.0
        assert store.put_messages("t", 0, [msg(b"unseen yet")]).ok  # looked at once a second
        disk.later()
        refused = store.put_messages("t", 0, [msg(b"refused")])
        assert refused.status == PutMessageStatus.SERVICE_NOT_AVAILABLE
        assert "disk is full" in refused.remark and "91.0% used" in refused.remark
        assert "diskSpaceWarningLevelRatio 90%" in refused.remark
        assert bodies(store, "t") == [b"before", b"unseen yet"]  # reads go on
        disk.percent = 89.0
        assert store.put_messages("t", 0, [msg(b"refused")]).status == PutMessageStatus.SERVICE_NOT_AVAILABLE
        disk.later()
        assert store.put_messages("t", 0, [msg(b"after")]).ok
        assert bodies(store, "t") == [b"before", b"unseen yet", b"after"]
    finally:
        store.shutdown()


def test_the_store_keeps_room_for_its_queues_and_looks_again_before_its_puts_could_take_it(
    tmp_path: Path,
) -> None:
    disk = FakeDisk()
    store = watch(make_store(tmp_path, disk_space_warning_level_ratio=100), disk)
    reserve = 2 * store.config.max_message_size
    assert store.disk_space.reserve_bytes == reserve
    try:
        disk.available = reserve + 3000  # room for about one put of 1 KB (counted twice) ...
        assert store.put_messages("t", 0, [msg(b"a" * 1000)]).ok
        disk.available = reserve - 1  # ... and the next put looks again, within the same second
        refused = store.put_messages("t", 0, [msg(b"b" * 1000)])
        assert refused.status == PutMessageStatus.SERVICE_NOT_AVAILABLE
        assert f"{reserve - 1} bytes free, under the {reserve}" in refused.remark
        disk.available = reserve + 100 * GiB
        disk.later()
        assert store.put_messages("t", 0, [msg(b"c")]).ok
        assert bodies(store, "t") == [b"a" * 1000, b"c"]
    finally:
        store.shutdown()


def test_a_file_system_that_does_not_say_how_full_it_is_sets_no_limit(tmp_path: Path) -> None:
    store = make_store(tmp_path)
    ds = store.disk_space
    store.disk_space = DiskSpaceService(ds.paths, 90, ds.reserve_bytes, space=lambda _p: (0, 0))
    try:
        assert store.put_messages("t", 0, [msg(b"a")]).ok
    finally:
        store.shutdown()


def test_a_write_that_runs_out_of_space_leaves_no_part_of_a_record(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A short write (the disk filled up between two looks) may have landed whole records that
    were never acknowledged: after a crash, recovery must not find them."""
    disk = FakeDisk()
    store = watch(make_store(tmp_path), disk)
    assert store.put_messages("t", 0, [msg(b"acked")]).ok
    end = store.commit_log.max_offset
    real_pwrite = os.pwrite

    def full_disk(fd: int, data: bytes, pos: int) -> int:
        return real_pwrite(fd, bytes(data)[: len(data) * 2 // 3], pos)  # two of three records land

    monkeypatch.setattr(mapped_file.os, "pwrite", full_disk)
    refused = store.put_messages("t", 0, [msg(b"x" * 100), msg(b"y" * 100), msg(b"z" * 100)])
    monkeypatch.undo()
    assert refused.status == PutMessageStatus.SERVICE_NOT_AVAILABLE
    assert os.strerror(errno.ENOSPC) in refused.remark and "commitlog" in refused.remark
    segment = store.commit_log.mapped_file_queue.files[-1]
    assert segment.read(end - segment.file_from_offset, 1000) == bytes(1000)  # cut again
    # refused until the partitions are looked at again and have room
    assert store.put_messages("t", 0, [msg(b"no")]).status == PutMessageStatus.SERVICE_NOT_AVAILABLE
    store.shutdown()
    (tmp_path / "abort").touch()  # as after a crash: recovery walks the commit log's tail

    again = watch(make_store(tmp_path), disk)
    try:
        assert bodies(again, "t") == [b"acked"]
        assert again.put_messages("t", 0, [msg(b"next")]).ok
        assert bodies(again, "t") == [b"acked", b"next"]
    finally:
        again.shutdown()


def test_delayed_messages_wait_while_the_disk_is_full(tmp_path: Path) -> None:
    disk = FakeDisk()
    store = watch(make_store(tmp_path, message_delay_level="50ms"), disk)
    sms = ScheduleMessageService(store, tmp_path / "delayOffset.json")
    try:
        put = store.put_messages("real", 0, [msg(b"later", DELAY="1")])
        assert put.topic == SCHEDULE_TOPIC
        disk.percent = 95.0
        disk.later()
        with pytest.raises(PutMessageError, match=r"delayed message.*disk is full"):
            sms.deliver_due(put.store_timestamp + 100)
        assert sms.offset_table.get(1, 0) == 0 and bodies(store, "real") == []
        disk.percent = 50.0
        disk.later()
        sms.deliver_due(put.store_timestamp + 100)
        assert bodies(store, "real") == [b"later"] and sms.offset_table == {1: 1}
    finally:
        store.shutdown()


def test_delayed_messages_written_before_a_refusal_are_not_delivered_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A round writes runs of messages (one per real queue in a row); when the store refuses the
    fourth, the three written before it are done."""
    store = make_store(tmp_path, message_delay_level="50ms")
    sms = ScheduleMessageService(store, tmp_path / "delayOffset.json")
    try:
        last = None
        for i in range(6):
            last = store.put_messages("ab"[i % 2], 0, [msg(b"m%d" % i, DELAY="1")])
        assert last is not None
        real_put = store.put_records
        calls = []

        def full_after_three(topic: str, queue_id: int, records: Any, **kw: Any) -> PutMessageResult:
            calls.append(topic)
            if len(calls) > 3:
                return DISK_FULL
            return real_put(topic, queue_id, records, **kw)

        monkeypatch.setattr(store, "put_records", full_after_three)
        with pytest.raises(PutMessageError) as refused:
            sms.deliver_due(last.store_timestamp + 100)
        assert refused.value.written == 3 and sms.offset_table == {1: 3}
        monkeypatch.undo()
        sms.deliver_due(last.store_timestamp + 100)
        assert bodies(store, "a") == [b"m0", b"m2", b"m4"]
        assert bodies(store, "b") == [b"m1", b"m3", b"m5"]
        again = ScheduleMessageService(store, tmp_path / "delayOffset.json")
        again.load()
        assert again.offset_table == {1: 6}  # the interrupted round's progress was persisted too
    finally:
        store.shutdown()


def test_a_message_the_store_can_never_take_does_not_stall_its_delay_level(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = make_store(tmp_path, message_delay_level="50ms")
    sms = ScheduleMessageService(store, tmp_path / "delayOffset.json")
    try:
        first = store.put_messages("a", 0, [msg(b"too big now", DELAY="1")])
        store.put_messages("a", 0, [msg(b"fine", DELAY="1")])
        real_put = store.put_records

        def refuse_big(topic: str, queue_id: int, records: Any, **kw: Any) -> PutMessageResult:
            if b"too big now" in bytes(records.buf):
                return PutMessageResult(PutMessageStatus.MESSAGE_ILLEGAL, remark="over maxMessageSize")
            return real_put(topic, queue_id, records, **kw)

        monkeypatch.setattr(store, "put_records", refuse_big)
        monkeypatch.setattr(schedule_message_service, "RUN_MAX_BYTES", 1)  # one put per message
        sms.deliver_due(first.store_timestamp + 1000)
        assert bodies(store, "a") == [b"fine"] and sms.offset_table == {1: 2}
    finally:
        store.shutdown()


def test_timer_messages_wait_while_the_disk_is_full(tmp_path: Path) -> None:
    disk = FakeDisk()
    store = watch(make_store(tmp_path), disk)
    timers = TimerMessageStore(store, tmp_path / "timerProgress.json")
    try:
        at = int(time.time() * 1000) + 60_000
        for body in (b"t1", b"t2"):
            timer = msg(body, TIMER_DELIVER_MS=str(at), UNIQ_KEY=body.decode())
            assert store.put_messages("real", 0, [timer]).ok
        assert timers.pending() == 2
        disk.percent = 95.0
        disk.later()
        with pytest.raises(PutMessageError, match="disk is full"):
            timers.deliver_due(at + 1)
        assert timers.pending() == 2 and bodies(store, "real") == []
        disk.percent = 50.0
        disk.later()
        timers.deliver_due(at + 2)
        assert bodies(store, "real") == [b"t1", b"t2"] and timers.pending() == 0
    finally:
        store.shutdown()


def test_a_refused_op_record_is_written_later_and_the_commit_stands(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ending a transaction writes its real message, then an op record; if the store refuses the
    op record, the commit is not undone nor answered as failed: the op record is written later."""
    store = make_store(tmp_path)
    topics = TopicConfigManager(tmp_path / "topics.json")
    tx = TransactionalMessageService(store, topics, tmp_path / "tx.json", TransactionConfig())
    try:
        half = msg(b"paid", TRAN_MSG="true", PGROUP="pg", UNIQ_KEY="tx-1")
        assert tx.prepare_messages("orders", 0, [half]).ok
        real_put = store.put_messages

        def refuse_ops(topic: str, queue_id: int, messages: Any) -> PutMessageResult:
            if topic == TRANS_OP_HALF_TOPIC:
                return DISK_FULL
            return real_put(topic, queue_id, messages)

        monkeypatch.setattr(store, "put_messages", refuse_ops)
        resolved, results = tx.end_transactions(["tx-1"], commit=True)
        assert resolved == 1 and all(r.ok for r in results)
        assert bodies(store, "orders") == [b"paid"]
        monkeypatch.undo()
        tx.check()  # the periodic check writes what waits
        assert store.get_max_offset_in_queue(TRANS_OP_HALF_TOPIC, 0) == 1
        again = TransactionalMessageService(store, topics, tmp_path / "tx.json", TransactionConfig())
        again.load()
        assert again.pending == {}  # a restart would not check it back and commit it twice
    finally:
        store.shutdown()


def test_disk_figures_read_as_rocketmq_prints_them() -> None:
    assert used_ratio(182, 818) == 0.19  # 18.2% used, rounded up as RocketMQ does
    assert used_ratio(0, 0) == -1.0
    assert human_readable_byte_count(500) == "500 B"
    assert human_readable_byte_count(252 * GiB) == "252.0 GiB"
    assert human_readable_byte_count(3 * 1024 * 1024 + 512 * 1024) == "3.5 MiB"


def test_the_warning_level_is_a_percentage() -> None:
    with pytest.raises(ValueError, match=r"diskSpaceWarningLevelRatio must be a percentage 1\.\.100.*got 0"):
        MessageStoreConfig(disk_space_warning_level_ratio=0)
    with pytest.raises(ValueError, match="got 101"):
        MessageStoreConfig(disk_space_warning_level_ratio=101)
    with pytest.raises(TypeError, match=r"an int percentage 1\.\.100, got '95'"):
        MessageStoreConfig(disk_space_warning_level_ratio="95")  # type: ignore[arg-type]
    assert MessageStoreConfig().disk_space_warning_level_ratio == 90  # RocketMQ's default
    args = parser().parse_args(["--data-dir", "d", "--disk-space-warning-level-ratio", "97"])
    assert args.disk_space_warning_level_ratio == 97


@pytest.mark.integration
def test_a_broker_on_a_full_disk_refuses_sends_serves_reads_and_loses_nothing(tmp_path: Path) -> None:
    """The real partition, a real broker process: a warning level under what the disk holds now."""
    used_bytes, available = disk_partition_space(tmp_path)
    used = 100 * used_bytes / (used_bytes + available)
    assert used > 1.0, f"this test needs a file system that holds something ({used:.2f}% used)"
    under = max(1, int(used) - 1)
    broker = BrokerProcess(tmp_path / "b", ["--disk-space-warning-level-ratio", "100"]).start()
    try:
        Admin(broker.endpoint).create_topic("full", queues=1, dedup_window_ms=600_000)
        with Producer(broker.endpoint) as producer:
            for i in range(10):
                producer.send(Message("full", b"m%d" % i))
        broker.stop()
        broker.extra_args = ["--disk-space-warning-level-ratio", str(under)]
        broker.start()
        # the producer retries a refused send with the same UNIQ_KEY: under a dedup window the
        # retry must be refused again, not dropped as a duplicate of what was never stored
        with Producer(broker.endpoint) as producer, pytest.raises(BrokerUnavailableError) as refused:
            producer.send(Message("full", b"refused"))
        text = str(refused.value)
        assert "SERVICE_NOT_AVAILABLE" in text and "disk is full" in text
        assert f"diskSpaceWarningLevelRatio {under}%" in text
        consumer = PullConsumer(broker.endpoint, "reader")
        mq = MessageQueue("full", "broker-a", 0)
        assert [m.body for m in consumer.pull(mq, 0, 100).messages] == [b"m%d" % i for i in range(10)]
        consumer.commit(mq, 10)  # offsets are not messages: still taken
        assert consumer.committed(mq) == 10
        assert "the broker's disk is full" in "".join(broker.output)
        info = Admin(broker.endpoint).broker_info()  # RocketMQ's runtime info keys, and the state
        assert info["diskFull"] == "true" and f"diskSpaceWarningLevelRatio {under}%" in info["diskFullReason"]
        assert info["diskSpaceWarningLevelRatio"] == str(under)
        assert 0 < float(info["commitLogDiskRatio"]) <= 1
        assert info["commitLogDirCapacity"].startswith("Total : ")
        broker.kill()
        broker.extra_args = []
        broker.start()
        assert Admin(broker.endpoint).broker_info()["diskFull"] == "false"
        with Producer(broker.endpoint) as producer:
            assert producer.send(Message("full", b"after")).queue_offset == 10
        assert [m.body for m in PullConsumer(broker.endpoint, "check").pull(mq, 0, 100).messages] == [
            *(b"m%d" % i for i in range(10)), b"after"]
    finally:
        broker.stop()


def test_the_commit_logs_disk_ratio_key_names_its_absolute_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # RocketMQ's commitLogDiskRatio_<storePathCommitLog>: a broker started with a relative
    # --data-dir must not show a path only its own working directory resolves
    monkeypatch.chdir(tmp_path)
    info = DiskSpaceService([Path("data/commitlog"), Path("data/consumequeue")], 90, 0,
                            space=lambda _p: (1, 9)).runtime_info()
    assert info[f"commitLogDiskRatio_{tmp_path / 'data' / 'commitlog'}"] == info["commitLogDiskRatio"]

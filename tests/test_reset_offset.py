"""Admin.reset_offset / ``pymq-admin reset-offset``: RocketMQ 5's server-side resetOffset
(``mqadmin resetOffsetByTime``) on the embedded broker, real broker processes."""

from __future__ import annotations

import time
from datetime import datetime, timezone
from pathlib import Path

import pytest
from broker_process import BrokerProcess
from helpers import unique
from pymq_proto.rocketmq_v2 import definition_pb2 as v2
from pymq_proto.v1 import pymq_pb2
from pyspark_pymq import Admin, Message, Producer, PullConsumer
from pyspark_pymq.admin_cli import main
from pyspark_pymq.errors import GROUP_NOT_EXIST, PymqError, TopicNotExistError
from test_v2_clients import _ack_raw, _receive_raw


def _offsets(admin: Admin, group: str, topic: str) -> list[int]:
    return admin.group_progress(group, topic)["consumer_offset"].tolist()


def test_offsets_move_back_and_forth_by_time_and_by_offset(shared_broker: BrokerProcess) -> None:
    ep = shared_broker.endpoint
    admin = Admin(ep)
    topic, group = unique("reset"), unique("reset-g")
    admin.create_topic(topic, queues=1)
    producer = Producer(ep)
    producer.send_batch([Message(topic, f"early-{i}") for i in range(3)])
    time.sleep(0.05)
    later = datetime.now(timezone.utc)
    time.sleep(0.05)
    producer.send_batch([Message(topic, f"late-{i}") for i in range(3)])
    consumer = PullConsumer(ep, group)
    (mq,) = consumer.queues(topic)
    consumer.commit(mq, 6)
    moved = admin.reset_offset(group, topic, later)
    assert moved[["group", "topic", "broker_name", "queue_id", "offset"]].values.tolist() == [
        [group, topic, "broker-a", 0, 3]]
    assert _offsets(admin, group, topic) == [3]
    assert [m.body for m in consumer.pull(mq, consumer.committed(mq), 10).messages] == [
        b"late-0", b"late-1", b"late-2"]
    assert admin.reset_offset(group, topic, 0)["offset"].tolist() == [0]  # the first message
    assert admin.reset_offset(group, topic, -1)["offset"].tolist() == [6]  # the end
    assert admin.reset_offset(group, topic, offset=1, queue_id=0)["offset"].tolist() == [1]
    assert _offsets(admin, group, topic) == [1]
    later_ms = int(later.timestamp() * 1000)
    assert admin.reset_offset(group, topic, later_ms, queue_id=0)["offset"].tolist() == [3]
    assert _offsets(admin, group, topic) == [3]


def test_bad_resets_name_what_is_wrong_and_change_nothing(shared_broker: BrokerProcess) -> None:
    ep = shared_broker.endpoint
    admin = Admin(ep)
    topic, group = unique("reset-bad"), unique("reset-bad-g")
    admin.create_topic(topic, queues=1)
    Producer(ep).send_batch([Message(topic, str(i)) for i in range(4)])
    consumer = PullConsumer(ep, group)
    consumer.commit(consumer.queues(topic)[0], 2)
    with pytest.raises(PymqError, match="consumer group 'nob' does not exist") as err:
        admin.reset_offset("nob", topic, 0)  # a misspelt group is not created by a reset
    assert err.value.code == GROUP_NOT_EXIST
    assert "nob" not in set(admin.groups()["group"])
    with pytest.raises(TopicNotExistError, match="'no-such-topic'"):
        admin.reset_offset(group, "no-such-topic", 0)
    with pytest.raises(PymqError, match=r"offset 9 is outside .*#0's offsets 0\.\.4"):
        admin.reset_offset(group, topic, offset=9, queue_id=0)
    with pytest.raises(PymqError, match="queue id 3 is out of range"):
        admin.reset_offset(group, topic, 0, queue_id=3)
    with pytest.raises(ValueError, match="offset=1 needs queue_id="):
        admin.reset_offset(group, topic, offset=1)
    with pytest.raises(ValueError, match="not both"):
        admin.reset_offset(group, topic, 0, offset=1, queue_id=0)
    with pytest.raises(ValueError, match="not neither"):
        admin.reset_offset(group, topic)
    with pytest.raises(ValueError, match="timestamp -5 must be"):
        admin.reset_offset(group, topic, -5)
    with pytest.raises(TypeError, match="got '2026-11-28'"):
        admin.reset_offset(group, topic, "2026-11-28")  # type: ignore[arg-type]
    # what the client checks, the broker checks too (another client, a raw request)
    raw = admin._client.reset_offset
    with pytest.raises(PymqError, match=r"needs a timestamp .* not neither"):  # not "the first message"
        raw(pymq_pb2.ResetOffsetRequest(consumer_group=group, topic=topic, queue_id=-1))
    with pytest.raises(PymqError, match="not both"):
        raw(pymq_pb2.ResetOffsetRequest(consumer_group=group, topic=topic, queue_id=0, timestamp=0, offset=1))
    with pytest.raises(PymqError, match="timestamp -5 must be"):
        raw(pymq_pb2.ResetOffsetRequest(consumer_group=group, topic=topic, queue_id=-1, timestamp=-5))
    assert _offsets(admin, group, topic) == [2]


def test_a_reset_is_on_disk_when_answered(tmp_path: Path) -> None:
    """kill -9 right after the answer: the reset offsets are what the broker comes back with."""
    with BrokerProcess(tmp_path / "broker") as broker:
        admin = Admin(broker.endpoint)
        topic, group = unique("reset-kill"), unique("reset-kill-g")
        admin.create_topic(topic, queues=1)
        Producer(broker.endpoint).send_batch([Message(topic, str(i)) for i in range(5)])
        consumer = PullConsumer(broker.endpoint, group)
        consumer.commit(consumer.queues(topic)[0], 5)
        time.sleep(1.5)  # the commit reaches the disk with the periodic flush
        admin.reset_offset(group, topic, offset=2, queue_id=0)
        broker.restart(crash=True)
        assert _offsets(Admin(broker.endpoint), group, topic) == [2]


@pytest.mark.parametrize("crash", [False, True])
def test_rocketmq_5_clients_receive_again_from_a_reset_offset(tmp_path: Path, crash: bool) -> None:
    """A v2 (pop) group's reading is the proxy's state, not only its offset: a reset moved the
    offset, and the group went on receiving from where its state said (nothing, after acking
    everything), and after a restart the stored state made the messages below it pass for acked.
    Now it receives from the reset offset, across a restart (kill -9 too), and the receipt
    handles of what it had in flight are refused."""
    with BrokerProcess(tmp_path / "broker") as broker:
        ep = broker.endpoint
        admin = Admin(ep)
        topic, group = unique("reset-v2"), unique("reset-v2-g")
        admin.create_topic(topic, queues=1, message_type="MIXED")
        Producer(ep).send_batch([Message(topic, f"m{i}") for i in range(4)])
        got = _receive_raw(ep, topic, group, 30_000)
        assert [m.body for m in got] == [b"m0", b"m1", b"m2", b"m3"]
        assert _ack_raw(ep, topic, group, got) == [v2.OK] * 4
        time.sleep(1.5)  # the pop state (next offset 4) is on disk
        assert _receive_raw(ep, topic, group, 30_000) == []
        admin.reset_offset(group, topic, offset=1, queue_id=0)
        again = _receive_raw(ep, topic, group, 30_000)
        assert [(m.body, m.system_properties.delivery_attempt) for m in again] == [
            (b"m1", 1), (b"m2", 1), (b"m3", 1)]
        admin.reset_offset(group, topic, offset=2, queue_id=0)  # m1..m3 in flight: forgotten
        assert _ack_raw(ep, topic, group, again[:1]) == [v2.INVALID_RECEIPT_HANDLE]
        broker.restart(crash=crash)
        ep, admin = broker.endpoint, Admin(broker.endpoint)  # a new port
        after = _receive_raw(ep, topic, group, 30_000)
        assert [m.body for m in after] == [b"m2", b"m3"]
        assert _ack_raw(ep, topic, group, after) == [v2.OK] * 2
        admin.reset_offset(group, topic, -1)  # to the end: nothing more
        assert _receive_raw(ep, topic, group, 30_000) == []


def test_pymq_admin_reset_offset(shared_broker: BrokerProcess, capsys: pytest.CaptureFixture[str]) -> None:
    ep = shared_broker.endpoint
    topic, group = unique("reset-cli"), unique("reset-cli-g")
    Admin(ep).create_topic(topic, queues=2)
    Producer(ep).send_batch([Message(topic, str(i)) for i in range(5)])  # one batch: one queue
    consumer = PullConsumer(ep, group)
    ends = {mq.queue_id: consumer.max_offset(mq) for mq in consumer.queues(topic)}
    full = max(ends, key=ends.__getitem__)
    for mq in consumer.queues(topic):
        consumer.commit(mq, ends[mq.queue_id])
    assert main(["-e", ep, "reset-offset", group, topic, "--timestamp", "earliest"]) == 0
    out = capsys.readouterr().out
    assert f"offsets of {group} on {topic} reset (2 queue(s))" in out
    assert "stop those first" in out and "new checkpointLocation" in out  # as the README says
    assert _offsets(Admin(ep), group, topic) == [0, 0]
    assert main(["-e", ep, "reset-offset", group, topic, "--offset", "3", "--queue-id", str(full)]) == 0
    capsys.readouterr()
    assert _offsets(Admin(ep), group, topic) == [3 if q == full else 0 for q in (0, 1)]
    assert main(["-e", ep, "reset-offset", group, topic, "--timestamp", "2999-01-01T00:00:00+00:00"]) == 0
    capsys.readouterr()
    assert _offsets(Admin(ep), group, topic) == [ends[0], ends[1]]  # after the last message: the ends
    assert main(["-e", ep, "reset-offset", group, topic]) == 1
    assert "give --timestamp" in capsys.readouterr().err
    with pytest.raises(SystemExit) as bad:
        main(["-e", ep, "reset-offset", group, topic, "--timestamp", "yesterday"])
    assert bad.value.code == 2 and "'yesterday' is not a time" in capsys.readouterr().err

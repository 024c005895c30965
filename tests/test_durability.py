"""kill -9 the broker while producers send under SYNC_FLUSH: nothing acknowledged is lost.

Every acknowledged message must be there after the restart, byte for byte,
at the queue offset it was acknowledged with, and every queue must read back
in order with no gap. Repeated enough times to mean something.
"""

from __future__ import annotations

import os
import random
import threading
import time
from pathlib import Path

import pytest
from broker_process import BrokerProcess
from pyspark_pymq import Admin, Message, MessageQueue, Producer, PullConsumer
from pyspark_pymq.client.message import SendStatus
from pyspark_pymq.errors import PymqError

ROUNDS = int(os.environ.get("PYMQ_KILL9_ROUNDS", "6"))
PRODUCERS = 4


def _produce(
    endpoint: str, worker: int, acked: list[tuple[int, int, bytes]], keyed: list[tuple[str, bytes]],
    stop: threading.Event,
) -> None:
    producer = Producer(endpoint, retry_times_when_send_failed=0, send_msg_timeout_ms=2000)
    rnd = random.Random(worker)
    seq = 0
    while not stop.is_set():
        seq += 1
        if seq % 3 == 0:
            bodies = [os.urandom(rnd.randint(1, 600)) for _ in range(rnd.randint(2, 20))]
            try:
                r = producer.send_batch([Message("durable", b) for b in bodies])[0]
            except PymqError:
                return
            if r.status == SendStatus.SEND_OK:
                acked.extend((r.queue_id, r.queue_offset + i, b) for i, b in enumerate(bodies))
        else:
            body = os.urandom(rnd.randint(1, 2000))
            try:
                r = producer.send(Message("durable", body, keys=[f"w{worker}-{seq}"]))
            except PymqError:
                return
            if r.status == SendStatus.SEND_OK:
                acked.append((r.queue_id, r.queue_offset, body))
                keyed.append((f"w{worker}-{seq}", body))


@pytest.mark.parametrize("round_no", range(ROUNDS))
def test_kill9_under_sync_flush_loses_no_acknowledged_message(tmp_path: Path, round_no: int) -> None:
    broker = BrokerProcess(tmp_path / "b", flush_disk_type="SYNC_FLUSH").start()
    try:
        Admin(broker.endpoint).create_topic("durable", queues=3)
        acked_per_round: list[list[tuple[int, int, bytes]]] = []
        last_keyed: list[tuple[str, bytes]] = []  # sent just before each crash: after the last index flush
        for _crash in range(2):  # crash, restart, crash again on the same store
            acked: list[tuple[int, int, bytes]] = []
            keyed: list[tuple[str, bytes]] = []
            stop = threading.Event()
            threads = [
                threading.Thread(
                    target=_produce, args=(broker.endpoint, w + 10 * round_no, acked, keyed, stop)
                )
                for w in range(PRODUCERS)
            ]
            for t in threads:
                t.start()
            time.sleep(random.Random(round_no).uniform(0.4, 1.2))
            broker.kill()
            stop.set()
            for t in threads:
                t.join(30)
            acked_per_round.append(acked)
            last_keyed += keyed[-40:]
            broker.start()
        everything = [a for acked in acked_per_round for a in acked]
        assert len(everything) > 50, "the producers should have had time to send"
        print(f"round {round_no}: {len(everything)} acknowledged messages checked")
        consumer = PullConsumer(broker.endpoint, "verify")
        stored: dict[tuple[int, int], bytes] = {}
        for q in range(3):
            mq = MessageQueue("durable", "broker-a", q)
            offset = 0
            while True:
                result = consumer.pull(mq, offset, 5000)
                if not result.messages:
                    break
                for m in result.messages:
                    assert m.queue_offset == offset, "gap or disorder in the queue"
                    stored[(q, offset)] = m.body
                    offset += 1
        for q, off, body in everything:
            assert stored.get((q, off)) == body, f"acknowledged message {q}/{off} lost or changed"
        admin = Admin(broker.endpoint)
        for key, body in last_keyed:  # the index lost no key either
            # (each crash round reuses the workers' keys: the message is one of the hits)
            assert body in [m.body for m in admin.query_message("durable", key)], key
        # and the broker keeps taking messages after the crashes
        r = Producer(broker.endpoint).send(Message("durable", b"after"))
        assert r.status == SendStatus.SEND_OK
    finally:
        broker.stop()


def test_kill9_then_torn_tail_is_cut_not_served(tmp_path: Path) -> None:
    broker = BrokerProcess(tmp_path / "b", flush_disk_type="SYNC_FLUSH").start()
    try:
        Admin(broker.endpoint).create_topic("torn", queues=1)
        producer = Producer(broker.endpoint)
        good = [producer.send(Message("torn", b"good-%d" % i)) for i in range(20)]
        last = producer.send(Message("torn", b"last" * 100))
        broker.kill()
        # the last record is half written: zero its second half (a torn page)
        seg = sorted((tmp_path / "b" / "commitlog").iterdir())[-1]
        phy = last.offset_msg_ids[0]
        offset = int(phy[16:], 16)
        with open(seg, "r+b") as f:
            f.seek(offset - int(seg.name) + 200)
            f.write(bytes(200))
        broker.start()
        consumer = PullConsumer(broker.endpoint, "g")
        mq = consumer.queues("torn")[0]
        assert consumer.max_offset(mq) == 20
        bodies = [m.body for m in consumer.pull(mq, 0, 100).messages]
        assert bodies == [b"good-%d" % i for i in range(20)]
        again = Producer(broker.endpoint).send(Message("torn", b"new"))
        assert again.queue_offset == 20 and again.offset_msg_ids[0][16:] == phy[16:]
        assert consumer.pull(mq, 20, 1).messages[0].body == b"new"
        assert good[0].queue_offset == 0
    finally:
        broker.stop()


def test_dedup_window_survives_a_broker_crash(tmp_path: Path) -> None:
    """A replay after the broker was killed is still dropped: the window is refilled from the store."""
    from helpers import read_all
    from pymq_proto.record import encode_properties

    broker = BrokerProcess(tmp_path / "b").start()
    try:
        ep = broker.endpoint
        Admin(ep).create_topic("dedup", queues=2, dedup_window_ms=600_000)
        Admin(ep).create_topic("short", queues=1, dedup_window_ms=500)
        keys = [f"REPLAY{i:026d}" for i in range(300)]

        def send(topic: str) -> None:
            props = [encode_properties({"UNIQ_KEY": k}) for k in keys]
            Producer(ep).send_encoded(topic, [k.encode() for k in keys], props, keys)

        send("dedup")
        send("short")
        time.sleep(0.8)  # past the short window
        broker.restart(crash=True)
        ep = broker.endpoint
        send("dedup")
        send("short")
        assert sorted(m.body for m in read_all(ep, "dedup")) == sorted(k.encode() for k in keys)
        assert len(read_all(ep, "short")) == 600, "keys older than the window must not be dropped"
    finally:
        broker.stop()


def test_a_deleted_topics_consumer_offsets_stay_deleted_after_a_crash(tmp_path: Path) -> None:
    """DeleteTopic removed the topic's consumer offsets in memory only, written by the periodic
    flush: a kill -9 right after it answered brought them back, applied to the topic created again."""
    broker = BrokerProcess(tmp_path / "b").start()
    try:
        ep = broker.endpoint
        Admin(ep).create_topic("gone", queues=1)
        mq = MessageQueue("gone", "broker-a", 0)
        PullConsumer(ep, "G").commit(mq, 8)
        time.sleep(1.5)  # the periodic flush wrote offset 8
        Admin(ep).delete_topic("gone")
        broker.restart(crash=True)
        ep = broker.endpoint
        Admin(ep).create_topic("gone", queues=1)
        assert PullConsumer(ep, "G").committed(mq) < 0
    finally:
        broker.stop()


def test_topics_created_are_on_disk_when_create_topic_answers(tmp_path: Path) -> None:
    """CreateTopic writes topics.json on a thread (off the event loop) but answers only once it is
    written: a kill -9 right after the answer keeps every topic, as created or updated."""
    broker = BrokerProcess(tmp_path / "b").start()
    try:
        admin = Admin(broker.endpoint)
        ids = {admin.create_topic(f"made-{i}", queues=1 + i % 3).topic_id: f"made-{i}" for i in range(20)}
        admin.create_topic("made-0", queues=5)  # an update: its id is kept
        broker.restart(crash=True)
        admin = Admin(broker.endpoint)
        for topic_id, name in ids.items():
            config = admin.topic_config(name)
            assert config.topic_id == topic_id
            assert config.read_queue_nums == (5 if name == "made-0" else 1 + int(name[5:]) % 3)
    finally:
        broker.stop()


@pytest.mark.parametrize("crash", [True, False])
def test_a_topic_deleted_and_created_again_at_once_keeps_its_new_messages(
    tmp_path: Path, crash: bool
) -> None:
    """DeleteTopic removes the old topic's files on a thread, after renaming them aside: a topic of
    the same name created right after keeps its own, across a restart too (and a kill -9 leaves no
    half-removed files for the next start to load)."""
    from helpers import read_all

    broker = BrokerProcess(tmp_path / "b").start()
    try:
        ep = broker.endpoint
        Admin(ep).create_topic("again", queues=8)
        Producer(ep).send_batch([Message("again", b"old-%d" % i) for i in range(200)])
        Admin(ep).delete_topic("again")
        Admin(ep).create_topic("again", queues=2)
        producer = Producer(ep)
        new = [b"new-%d" % i for i in range(40)]
        for body in new:
            assert producer.send(Message("again", body)).status == SendStatus.SEND_OK
        assert sorted(m.body for m in read_all(ep, "again")) == sorted(new)
        broker.restart(crash=crash)
        ep = broker.endpoint
        assert sorted(m.body for m in read_all(ep, "again")) == sorted(new)
        assert Admin(ep).topic_config("again").read_queue_nums == 2
        assert not list((tmp_path / "b" / "consumequeue").glob(".deleted-*"))
    finally:
        broker.stop()


def test_topics_a_send_makes_keep_its_messages_after_a_kill9(tmp_path: Path) -> None:
    """A send's auto-create (autoCreateTopicEnable) and a group's first dead letter (%DLQ%<group>)
    write topics.json off the event loop, but the message is stored, and SEND_OK answered, only once
    the topic is written: a kill -9 right after leaves every acknowledged message in a topic the
    restarted broker lists, with the same topic id (a stream's checkpoint keeps it)."""
    broker = BrokerProcess(tmp_path / "b", ["--auto-create-topic-enable"]).start()
    try:
        ep = broker.endpoint
        with Producer(ep) as producer, PullConsumer(ep, "g") as consumer:
            mq = producer.send(Message("auto-0", b"hopeless")).message_queue
            dead = consumer.send_back(consumer.pull(mq, 0).messages[0], delay_level=-1)
            assert dead.dead_letter
            sent = {f"auto-{i}": producer.send(Message(f"auto-{i}", b"m%d" % i)) for i in range(1, 30)}
        admin = Admin(ep)
        ids = {name: admin.topic_config(name).topic_id for name in sent}
        broker.kill()
        broker.start()
        ep = broker.endpoint
        admin = Admin(ep)
        with PullConsumer(ep, "reader") as reader:
            for name, result in sent.items():
                assert admin.topic_config(name).topic_id == ids[name]
                got = reader.pull(result.message_queue, result.queue_offset, 1).messages
                assert [m.body for m in got] == [b"m%s" % name[5:].encode()]
        assert [m.body for m in admin.dead_letter_messages("g")] == [b"hopeless"]
    finally:
        broker.kill()

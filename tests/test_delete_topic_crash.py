"""kill -9 during a DeleteTopic: the deletion is all or nothing after the restart.

A DeleteTopic takes the topic out of the tables at once and writes its removal on threads: the
queue files, then the consumer offsets, then topics.json, the emptied queue directory staying as a
marker until the last. Found by a crash probe (700 kill -9 iterations): another topic's CreateTopic
(or the periodic write, an auto-create) wrote topics.json without the topic before its offsets were
gone, so a topic made again after the crash took the old topic's consumer offsets; a kill after
the queue files went but before topics.json left the topic listed with its messages gone and its
offsets starting again at 0 under the same topic id; a send's auto-create did not wait for the
deletion.
"""

from __future__ import annotations

import contextlib
import threading
import time
from pathlib import Path

import pytest
from broker_process import BrokerProcess
from pyspark_pymq import Admin, MessageQueue, Producer, PullConsumer
from pyspark_pymq.client.message import Message, encode_message_properties, new_uniq_key
from pyspark_pymq.errors import PymqError

QUEUES = 512  # removing their files takes long enough for another request to come in between


def _fill(endpoint: str, topic: str, queues: int, per_queue: int) -> None:
    """``per_queue`` messages in each queue, and group g's progress on queue 0 at its end."""
    Admin(endpoint).create_topic(topic, queues)
    with Producer(endpoint) as producer:
        for q in range(queues):
            keys = [new_uniq_key() for _ in range(per_queue)]
            bodies = [b"old-%d-%d" % (q, i) for i in range(per_queue)]
            props = [encode_message_properties(Message(topic, b), k)
                     for b, k in zip(bodies, keys, strict=True)]
            producer.send_encoded(topic, bodies, props, keys, queue_id=q)
    consumer = PullConsumer(endpoint, "g")
    consumer.commit(MessageQueue(topic, "broker-a", 0), per_queue)
    consumer.close()


def _delete_in_background(endpoint: str, topic: str) -> threading.Thread:
    def delete() -> None:
        with contextlib.suppress(PymqError):  # the broker was killed before it answered
            Admin(endpoint).delete_topic(topic)

    thread = threading.Thread(target=delete, daemon=True)
    thread.start()
    return thread


def _check_after_restart(broker: BrokerProcess, topic: str, per_queue: int) -> bool:
    """All or nothing: the topic is there with every message, or gone with its group's offsets.
    Returns whether it is gone."""
    admin = Admin(broker.endpoint)
    consumer = PullConsumer(broker.endpoint, "g")
    try:
        if topic in admin.topic_names():
            for q in (0, QUEUES // 2, QUEUES - 1):  # a DeleteTopic that never got far: untouched
                mq = MessageQueue(topic, "broker-a", q)
                assert [m.body for m in consumer.pull(mq, 0, 32).messages] == [
                    b"old-%d-%d" % (q, i) for i in range(per_queue)], f"queue {q} of a topic still listed"
            assert consumer.committed(MessageQueue(topic, "broker-a", 0)) == per_queue
            return False
        # gone: a topic of the name made again starts with no progress of the old one's group
        admin.create_topic(topic, 4)
        assert consumer.committed(MessageQueue(topic, "broker-a", 0)) == -1
        assert consumer.min_offset(MessageQueue(topic, "broker-a", 0)) == 0
        assert consumer.max_offset(MessageQueue(topic, "broker-a", 0)) == 0
        assert not any(broker.data_dir.glob("consumequeue/.deleted-*"))
        return True
    finally:
        consumer.close()


def test_a_topic_config_written_by_another_create_keeps_a_topic_being_deleted(tmp_path: Path) -> None:
    """Kill -9 right after another topic's CreateTopic answered, the DeleteTopic still writing:
    the other create's topics.json held the deleted topic until its offsets were gone."""
    broker = BrokerProcess(tmp_path / "b").start()
    try:
        _fill(broker.endpoint, "victim", QUEUES, 3)
        time.sleep(1.5)  # the periodic write has put g's progress in consumerOffset.json
        deleting = _delete_in_background(broker.endpoint, "victim")
        deadline = time.monotonic() + 10
        while (broker.data_dir / "consumequeue" / "victim").exists() and time.monotonic() < deadline:
            time.sleep(0.001)  # the deletion has begun: its queues are renamed aside
        Admin(broker.endpoint).create_topic("other", 1)
        broker.kill()
        deleting.join(10)
        broker.start()
        assert _check_after_restart(broker, "victim", 3)  # begun before the kill: finished at the start
        assert "other" in Admin(broker.endpoint).topic_names()
    finally:
        broker.kill()


@pytest.mark.parametrize("delay_s", [0.0, 0.01, 0.05])
def test_a_deletion_cut_by_kill9_is_finished_at_the_start(tmp_path: Path, delay_s: float) -> None:
    """Kill -9 once the deletion has begun (its queues renamed aside), then a little later: the
    topic is never listed again without its messages."""
    broker = BrokerProcess(tmp_path / "b").start()
    try:
        _fill(broker.endpoint, "victim", QUEUES, 2)
        time.sleep(1.5)
        deleting = _delete_in_background(broker.endpoint, "victim")
        deadline = time.monotonic() + 10
        while (broker.data_dir / "consumequeue" / "victim").exists() and time.monotonic() < deadline:
            time.sleep(0.0005)
        time.sleep(delay_s)
        broker.kill()
        deleting.join(10)
        broker.start()
        assert _check_after_restart(broker, "victim", 2)
    finally:
        broker.kill()


def test_an_auto_create_waits_for_a_deletion_of_the_name(tmp_path: Path) -> None:
    """With autoCreateTopicEnable a send right after DeleteTopic made the topic again at once and
    wrote topics.json; a kill then gave the new topic the old one's consumer offsets."""
    broker = BrokerProcess(tmp_path / "b", ["--auto-create-topic-enable"]).start()
    try:
        _fill(broker.endpoint, "victim", QUEUES, 1)
        time.sleep(1.5)
        _delete_in_background(broker.endpoint, "victim")
        deadline = time.monotonic() + 10
        while (broker.data_dir / "consumequeue" / "victim").exists() and time.monotonic() < deadline:
            time.sleep(0.0005)
        with Producer(broker.endpoint) as producer:
            sent = producer.send_sync(Message("victim", b"new"))  # made again, once the deletion is done
        broker.kill()
        broker.start()
        consumer = PullConsumer(broker.endpoint, "g")
        mq = sent.message_queue
        assert [m.body for m in consumer.pull(mq, 0, 8).messages] == [b"new"]
        assert all(consumer.committed(MessageQueue("victim", "broker-a", q)) == -1 for q in range(4))
        consumer.close()
    finally:
        broker.kill()


def test_a_pull_held_on_a_deleted_topic_answers_at_once_that_it_is_gone(tmp_path: Path) -> None:
    """A long poll held on a deleted topic waited out its timeout and answered OFFSET_ILLEGAL; held
    across a delete and a create of the name, it answered the new topic's messages from the old
    offset on (skipping the first ones)."""
    from pyspark_pymq.errors import TopicNotExistError

    broker = BrokerProcess(tmp_path / "b").start()
    try:
        admin = Admin(broker.endpoint)
        for topic in ("gone", "again"):
            admin.create_topic(topic, 1)
        with Producer(broker.endpoint) as producer:
            producer.send_batch([Message("again", b"old-%d" % i) for i in range(3)])
        outcome: dict[str, object] = {}

        def hold(topic: str, offset: int) -> None:
            consumer = PullConsumer(broker.endpoint, "g")
            started = time.monotonic()
            try:
                pulled = consumer.pull(MessageQueue(topic, "broker-a", 0), offset, 8,
                                       suspend_timeout_ms=20_000)
                outcome[topic] = [m.body for m in pulled.messages]
            except TopicNotExistError as err:
                outcome[topic] = err
            outcome[topic + " waited"] = time.monotonic() - started
            consumer.close()

        held = (("gone", 0), ("again", 3))
        threads = [threading.Thread(target=hold, args=(topic, offset)) for topic, offset in held]
        for t in threads:
            t.start()
        time.sleep(0.5)  # both held
        admin.delete_topic("gone")
        admin.delete_topic("again")
        admin.create_topic("again", 1)
        with Producer(broker.endpoint) as producer:
            producer.send_batch([Message("again", b"new-%d" % i) for i in range(4)])
        for t in threads:
            t.join(30)
        assert isinstance(outcome["gone"], TopicNotExistError) and "deleted while the pull waited" in str(
            outcome["gone"])
        assert isinstance(outcome["again"], TopicNotExistError), outcome["again"]
        assert float(outcome["gone waited"]) < 10  # not the 20 s timeout
    finally:
        broker.kill()

"""The RocketMQ backend through pymq's client classes, against a real Apache RocketMQ 5.3.3.

One name server and two brokers (tests/rocketmq_cluster.py); messages come from
pymq's Producer and from RocketMQ's own Java client, and are read back with
PullConsumer, the same code path the Spark source uses. Each test uses topics
and groups of its own on the session's cluster.
"""

from __future__ import annotations

import socket
import time
from collections import Counter
from typing import Any

import pytest
from helpers import unique
from pyspark_pymq import Admin, Message, MessageQueue, Producer, PullConsumer, PullStatus
from pyspark_pymq.backend import BackendConfig, QueueBounds, open_backend
from pyspark_pymq.errors import (
    GROUP_NOT_EXIST,
    BrokerUnavailableError,
    NoPermissionError,
    PymqError,
    RequestTimeoutError,
    SubscriptionParseError,
    TopicNotExistError,
)
from pyspark_pymq.rocketmq.route import NameServerClient
from pyspark_pymq.spark.offset_reader import OffsetReader
from pyspark_pymq.spark.options import parse_source_options
from pyspark_pymq.spark.views import _rows, parse_view_options
from rocketmq_cluster import JavaMessage, RocketMQCluster


def _topic(
    cluster: RocketMQCluster, prefix: str, queues: int = 2, brokers: list[str] | None = None
) -> str:
    topic = unique(prefix)
    cluster.create_topic(topic, queues, brokers=brokers)
    return topic


def _one_read(c: RocketMQCluster, prefix: str, broker: str) -> tuple[str, PullConsumer, Any]:
    """A topic on ``broker`` alone with one message ``fails``, read by a new group's consumer:
    (topic, consumer, the message)."""
    topic = _topic(c, prefix, queues=1, brokers=[broker])
    Producer(namesrv_addr=c.namesrv_addr).send(Message(topic, b"fails"))
    consumer = PullConsumer(group=unique("g"), namesrv_addr=c.namesrv_addr)
    (first,) = [m for _, m in _read(consumer, topic, at_least=1)]
    return topic, consumer, first


def _read(
    consumer: PullConsumer, topic: str, *, at_least: int = 0, **pull: str
) -> list[tuple[MessageQueue, object]]:
    """Every message of ``topic``; waits (30 s at most) until there are ``at_least``: a send is
    acknowledged once in the commit log, its consume queue entry follows a moment later."""
    deadline = time.monotonic() + 30
    while True:
        out = []
        for mq in consumer.queues(topic):
            offset = 0
            while True:
                r = consumer.pull(mq, offset, 64, **pull)  # type: ignore[arg-type]
                out.extend((mq, m) for m in r.messages)
                if r.status is not PullStatus.FOUND or r.next_begin_offset >= r.max_offset:
                    break
                offset = r.next_begin_offset
        if len(out) >= at_least or time.monotonic() > deadline:
            return out
        time.sleep(0.2)


def test_route_spans_both_brokers_and_java_messages_decode(rocketmq_cluster: RocketMQCluster) -> None:
    c = rocketmq_cluster
    topic = _topic(c, "java")
    big = bytes(range(256)) * 40  # 10 KiB: the Java client stores it zlib-compressed
    sent = c.produce(topic, [
        JavaMessage(b"plain-0"),
        JavaMessage("tagged-1", tags="TagA", keys=["order-1", "user-9"], properties={"region": "eu"}),
        JavaMessage(big, tags="TagB"),
        *[JavaMessage(f"m-{i}", tags="TagA") for i in range(3, 12)],
    ])
    consumer = PullConsumer(group=unique("g"), namesrv_addr=c.namesrv_addr)
    queues = consumer.queues(topic)
    assert {mq.broker_name for mq in queues} == {"broker-a", "broker-b"}
    got = {m.msg_id: (mq, m) for mq, m in _read(consumer, topic, at_least=len(sent))}  # type: ignore[attr-defined]
    assert set(got) == {s.msg_id for s in sent}
    for s in sent:
        mq, m = got[s.msg_id]
        assert (mq.broker_name, mq.queue_id, m.queue_offset) == (s.broker_name, s.queue_id, s.queue_offset)
        assert m.offset_msg_id == s.offset_msg_id
    by_body = {m.body: m for _, m in got.values()}
    assert big in by_body and by_body[big].tags == "TagB"
    tagged = by_body[b"tagged-1"]
    assert tagged.keys == ("order-1", "user-9")
    assert tagged.properties["region"] == "eu"
    # tag subscriptions: the brokers filter by hash code, the backend by the tag itself
    only_b = _read(consumer, topic, subscription="TagB")
    assert [m.body for _, m in only_b] == [big]  # type: ignore[attr-defined]


@pytest.mark.parametrize("mode", ["sync", "async", "oneway"])
def test_producer_send_modes_and_batches_reach_both_brokers(
    rocketmq_cluster: RocketMQCluster, mode: str
) -> None:
    c = rocketmq_cluster
    topic = _topic(c, f"send-{mode}")
    producer = Producer(namesrv_addr=c.namesrv_addr, send_mode=mode)  # type: ignore[arg-type]
    results = [producer.send(Message(topic, f"one-{i}".encode(), tags="T", keys=(f"k{i}",)))
               for i in range(8)]
    results += producer.send_batch([Message(topic, f"batch-{i}".encode()) for i in range(50)])
    producer.flush()
    if mode == "async":
        results = [r.result() for r in results]
    consumer = PullConsumer(group=unique("g"), namesrv_addr=c.namesrv_addr)
    got = _read(consumer, topic, at_least=58)
    bodies = Counter(m.body for _, m in got)  # type: ignore[attr-defined]
    expected = [f"one-{i}".encode() for i in range(8)] + [f"batch-{i}".encode() for i in range(50)]
    assert bodies == Counter(expected)
    assert {mq.broker_name for mq, _ in got} == {"broker-a", "broker-b"}  # round robin over brokers
    if mode != "oneway":
        ids = {i for r in results for i in r.msg_ids}  # type: ignore[union-attr]
        assert ids == {m.msg_id for _, m in got}  # type: ignore[attr-defined]
        # each message's offsetMsgId (store host + commit-log offset) as the broker answered it,
        # the batch's 50 decoded at once: the same ids the consumer reads
        answered = {i: o for r in results for i, o in zip(r.msg_ids, r.offset_msg_ids, strict=True)}  # type: ignore[union-attr]
        assert answered == {m.msg_id: m.offset_msg_id for _, m in got}  # type: ignore[attr-defined]
    one = next(m for _, m in got if m.body == b"one-3")  # type: ignore[attr-defined]
    assert (one.tags, one.keys) == ("T", ("k3",))


def test_a_delivery_time_is_kept_by_rocketmqs_timer(rocketmq_cluster: RocketMQCluster) -> None:
    """Message(deliver_time_ms=...) as Java's setDeliverTimeMs: TIMER_DELIVER_MS, which RocketMQ 5's
    timer holds until then (the client refused the property, and had no field: probe helper-93)."""
    c = rocketmq_cluster
    topic = _topic(c, "timed", queues=1, brokers=["broker-a"])
    producer = Producer(namesrv_addr=c.namesrv_addr)
    at = int(time.time() * 1000) + 4000
    producer.send(Message(topic, b"later", deliver_time_ms=at))
    producer.send(Message(topic, b"now"))
    consumer = PullConsumer(group=unique("g"), namesrv_addr=c.namesrv_addr)
    first = [m.body for _, m in _read(consumer, topic, at_least=1)]  # type: ignore[attr-defined]
    if time.time() * 1000 < at - 1500:  # RocketMQ's timer counts in seconds (timerPrecisionMs)
        assert first == [b"now"]
    got = [m for _, m in _read(consumer, topic, at_least=2)]
    assert time.time() * 1000 >= at - 1000
    later = next(m for m in got if m.body == b"later")  # type: ignore[attr-defined]
    assert later.properties["TIMER_DELIVER_MS"] == str(at)  # type: ignore[attr-defined]


def test_a_sharding_key_goes_where_javas_select_message_queue_by_hash_sends_it(
    rocketmq_cluster: RocketMQCluster,
) -> None:
    """Java's SelectMessageQueueByHash: Math.abs(key.hashCode() % size) over the publish queues,
    brokers by name; pymq used crc32, so a key's messages from a Java and a pymq producer went to
    two queues and lost their order (probe helper-93). Java's "hello".hashCode() is 99162322,
    "polygenelubricants".hashCode() is Integer.MIN_VALUE."""
    c = rocketmq_cluster
    topic = _topic(c, "by-hash", queues=2)  # broker-a:0, broker-a:1, broker-b:0, broker-b:1
    producer = Producer(namesrv_addr=c.namesrv_addr)
    for key, java_hash in (("hello", 99162322), ("polygenelubricants", -(2**31))):
        expected = abs(java_hash % 4 if java_hash >= 0 else -(-java_hash % 4))
        mq = producer.message_queue_for_key(topic, key)
        assert (mq.broker_name, mq.queue_id) == (["broker-a", "broker-b"][expected // 2], expected % 2)
        result = producer.send(Message(topic, key.encode(), sharding_key=key))
        assert result.message_queue == mq


def test_offsets_commit_search_and_bounds(rocketmq_cluster: RocketMQCluster) -> None:
    c = rocketmq_cluster
    topic = _topic(c, "offsets", queues=1, brokers=["broker-a"])
    producer = Producer(namesrv_addr=c.namesrv_addr)
    before = int(time.time() * 1000)
    for i in range(5):
        producer.send(Message(topic, b"x%d" % i))
    backend = open_backend(BackendConfig(None, c.namesrv_addr))
    consumer0 = PullConsumer(group=unique("g"), namesrv_addr=c.namesrv_addr)
    assert len(_read(consumer0, topic, at_least=5)) == 5  # the consume queue has them all
    bounds = backend.queue_bounds(topic)
    mq = MessageQueue(topic, "broker-a", 0)
    assert bounds == {mq: QueueBounds(0, 5)}
    group = unique("g")
    consumer = PullConsumer(group=group, namesrv_addr=c.namesrv_addr)
    assert consumer.committed(mq) == -1  # never committed: -1, not RocketMQ's in-memory 0
    with pytest.raises(PymqError, match=rf"consumer group '{group}' does not exist.*updateSubGroup"):
        consumer.commit(mq, 3)  # the group is made by its first pull (autoCreateSubscriptionGroup)
    consumer.pull(mq, 0, 1)
    consumer.commit(mq, 3)
    consumer.register(topic)  # %RETRY%<group>: what mqadmin consumerProgress looks the group up by
    assert consumer.committed(mq) == 3
    # mqadmin sees the group's progress as RocketMQ's own tools show it
    progress = [line.split() for line in c.mqadmin("consumerProgress", "-g", group).splitlines()]
    row = next(p for p in progress if p and p[0] == topic)
    assert row[1:5] == ["broker-a", "0", "5", "3"]  # broker offset 5, consumer offset 3
    assert consumer.search_offset(mq, before) == 0
    assert consumer.search_offset(mq, int(time.time() * 1000) + 60_000) == 5
    r = consumer.pull(mq, 5, 10)
    assert r.status is PullStatus.NO_NEW_MSG
    assert backend.queue_bounds(unique("missing")) is None


def test_send_back_goes_through_retry_to_dead_letters(rocketmq_cluster: RocketMQCluster) -> None:
    c = rocketmq_cluster
    topic = _topic(c, "sendback", queues=1, brokers=["broker-b"])
    group = unique("g")
    Producer(namesrv_addr=c.namesrv_addr).send(Message(topic, b"fails", keys=("order-7",)))
    consumer = PullConsumer(group=group, namesrv_addr=c.namesrv_addr)
    (first,) = [m for _, m in _read(consumer, topic, at_least=1)]
    result = consumer.send_back(first, max_reconsume_times=2)  # type: ignore[arg-type]
    assert (result.topic, result.dead_letter, result.fallback) == (f"%RETRY%{group}", False, False)
    retried = _wait_for(consumer, f"%RETRY%{group}", 1)
    copy = retried[0]
    assert copy.body == b"fails" and copy.reconsume_times == 1
    assert copy.properties["RETRY_TOPIC"] == topic
    assert copy.msg_id == first.msg_id  # type: ignore[attr-defined]  # UNIQ_KEY kept across retries
    consumer.send_back(copy, max_reconsume_times=2)
    second = _wait_for(consumer, f"%RETRY%{group}", 2)[1]
    assert second.reconsume_times == 2
    last = consumer.send_back(second, max_reconsume_times=2)
    assert last.dead_letter and last.topic == f"%DLQ%{group}"
    dead = _wait_for(consumer, f"%DLQ%{group}", 1)
    assert dead[0].body == b"fails" and dead[0].reconsume_times == 3


def test_the_fallback_copy_to_retry_carries_its_limit_where_the_broker_reads_it(
    rocketmq_cluster: RocketMQCluster,
) -> None:
    # A send back the broker cannot do (the message is not at that commit-log offset) falls back
    # to sending the copy to %RETRY% directly; its counts go in the request header (j, l), as the
    # Java client moves them there, so the broker's retry/DLQ rule applies the explicit limit.
    import dataclasses

    c = rocketmq_cluster
    topic = _topic(c, "fallback", queues=1, brokers=["broker-a"])
    group = unique("g")
    Producer(namesrv_addr=c.namesrv_addr).send(Message(topic, b"fails"))
    consumer = PullConsumer(group=group, namesrv_addr=c.namesrv_addr)
    (first,) = [m for _, m in _read(consumer, topic, at_least=1)]
    consumer.send_back(first, max_reconsume_times=2)  # type: ignore[arg-type]  # %RETRY% exists now
    _wait_for(consumer, f"%RETRY%{group}", 1)
    lost = dataclasses.replace(first, commit_log_offset=10**12, reconsume_times=2)  # type: ignore[type-var]
    result = consumer.send_back(lost, max_reconsume_times=2)
    assert (result.topic, result.dead_letter, result.fallback) == (f"%DLQ%{group}", True, True)
    dead = _wait_for(consumer, f"%DLQ%{group}", 1)
    assert dead[0].body == b"fails" and dead[0].reconsume_times == 3
    # without a limit the copy carries 16, as RocketMQ's push consumer sends (the broker would
    # otherwise apply the group's retryMaxTimes)
    tired = dataclasses.replace(first, commit_log_offset=10**12, reconsume_times=16)  # type: ignore[type-var]
    result = consumer.send_back(tired)
    assert (result.topic, result.dead_letter, result.fallback) == (f"%DLQ%{group}", True, True)
    assert sorted(m.reconsume_times for m in _wait_for(consumer, f"%DLQ%{group}", 2)) == [3, 17]


def _wait_for(consumer: PullConsumer, topic: str, n: int, timeout: float = 60.0) -> list:  # type: ignore[type-arg]
    deadline = time.monotonic() + timeout
    got: list = []  # type: ignore[type-arg]
    while time.monotonic() < deadline:
        try:
            got = [m for _, m in _read(consumer, topic)]
        except TopicNotExistError:
            got = []
        if len(got) >= n:
            return got
        time.sleep(0.5)
    raise AssertionError(f"{topic} holds {len(got)} message(s) after {timeout} s, expected {n}")


def test_unreachable_name_server_and_unknown_topic_are_named(rocketmq_cluster: RocketMQCluster) -> None:
    started = time.monotonic()
    with pytest.raises(BrokerUnavailableError, match=r"127\.0\.0\.1:1\b.*namesrvAddr"):
        PullConsumer(group="g", namesrv_addr="127.0.0.1:1", timeout_ms=2000).queues("t")
    assert time.monotonic() - started < 10
    missing = unique("missing")
    with pytest.raises(TopicNotExistError, match=missing):
        PullConsumer(group="g", namesrv_addr=rocketmq_cluster.namesrv_addr).queues(missing)
    with pytest.raises(ValueError, match="exactly one of endpoint"):
        Producer("127.0.0.1:8081", namesrv_addr=rocketmq_cluster.namesrv_addr)


def test_a_broker_that_does_not_answer_leaves_its_queues_waiting(
    rocketmq_cluster: RocketMQCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Between a broker's kill -9 and the name servers noticing, the route still names it:
    mid-stream its queues wait (the source reads on from broker-b), at the start it is an error,
    and the group's progress on broker-b is kept although broker-a cannot take its part."""
    c = rocketmq_cluster
    topic = _topic(c, "unanswered")
    producer = Producer(namesrv_addr=c.namesrv_addr)
    for i in range(4):
        producer.send(Message(topic, b"x%d" % i))
    group = unique("g")
    consumer = PullConsumer(group=group, namesrv_addr=c.namesrv_addr)
    assert len(_read(consumer, topic, at_least=4)) == 4  # also creates the group on both brokers
    opts = parse_source_options({"namesrvAddr": c.namesrv_addr, "topic": topic, "consumerGroup": group},
                                stream=True)
    backend = open_backend(opts.backend)
    routes = backend._routes  # type: ignore[attr-defined]
    real_addr = routes.broker_addr
    with socket.create_server(("127.0.0.1", 0)) as s:
        dead = f"127.0.0.1:{s.getsockname()[1]}"  # closed: nothing listens, as at a killed broker
    monkeypatch.setattr(routes, "broker_addr",
                        lambda t, b: dead if b == "broker-a" else real_addr(t, b))
    reader = OffsetReader(opts, backend)
    bounds, missing = reader.bounds(require_topics=False)
    assert missing == []
    assert {mq.broker_name for mq in bounds if mq.topic == topic} == {"broker-b"}
    a0, b0 = MessageQueue(topic, "broker-a", 0), MessageQueue(topic, "broker-b", 0)
    # what is missing from the route: broker-a's queue waits, a queue broker-b never had is gone
    assert reader.unavailable_brokers([a0, MessageQueue(topic, "broker-b", 7)]) == {"broker-a"}
    # a registered broker that still holds a queue the route lost (a restart the name servers
    # have not caught up with) keeps it waiting too
    assert backend.unavailable_brokers([b0]) == {"broker-b"}
    with pytest.raises(BrokerUnavailableError, match=rf"namesrvAddr='{c.namesrv_addr}'.*{dead}"):
        reader.bounds(require_topics=True)
    with pytest.raises(BrokerUnavailableError, match=dead):
        backend.commit_offsets(group, {a0: 1, b0: 1})
    assert consumer.committed(b0) == 1


def test_a_new_group_registers_with_every_broker_for_its_retry_topic(
    rocketmq_cluster: RocketMQCluster,
) -> None:
    # register() with no topic heartbeats every master (RocketMQ's heartbeat creates %RETRY%<group>
    # on the broker receiving it), so retry_queues() of a group new to the cluster works
    c = rocketmq_cluster
    group = unique("g")
    consumer = PullConsumer(group=group, namesrv_addr=c.namesrv_addr)
    # a %RETRY% topic is made by the brokers: nothing to create by hand
    with pytest.raises(TopicNotExistError, match=rf"group '{group}' has no retries yet") as info:
        consumer.queues(f"%RETRY%{group}")
    assert "updateTopic" not in str(info.value)
    assert {mq.broker_name for mq in consumer.retry_queues()} == {"broker-a", "broker-b"}
    other = PullConsumer(group=unique("g"), namesrv_addr=c.namesrv_addr)
    other.register()
    assert {mq.broker_name for mq in other.queues(f"%RETRY%{other.group}")} == {"broker-a", "broker-b"}


def test_a_dead_brokers_message_is_sent_back_through_a_live_broker(rocketmq_cluster: RocketMQCluster) -> None:
    # The message's broker died after it was read: the send back falls back to the copy, which
    # goes to %RETRY%<group> on a live broker (made there by a heartbeat), not only its own.
    c = rocketmq_cluster
    topic, consumer, first = _one_read(c, "deadsendback", "broker-b")
    group = consumer.group
    consumer.register(topic)  # as a stream does: %RETRY%<group> on broker-b only
    c.kill_broker("broker-b")
    try:
        deadline = time.monotonic() + 30
        while "broker-b" in consumer.backend.namesrv.get_broker_names():  # type: ignore[attr-defined]
            assert time.monotonic() < deadline, "the name server still lists broker-b 30 s after its kill"
            time.sleep(0.2)
        result = consumer.send_back(first)  # type: ignore[arg-type]
        assert (result.topic, result.dead_letter, result.fallback) == (f"%RETRY%{group}", False, True)
        (copy,) = _wait_for(consumer, f"%RETRY%{group}", 1)
        assert copy.broker_name == "broker-a" and copy.body == b"fails" and copy.reconsume_times == 1
    finally:
        c.start_broker("broker-b")


def test_progress_of_a_queue_cut_by_a_scale_in_is_committed(rocketmq_cluster: RocketMQCluster) -> None:
    # RocketMQ's broker keeps a group's offset on any queue id (updateConsumerOffset), unlike the
    # pymq broker: a queue cut by a scale-in of read queues keeps the end of what was read of it,
    # so a later reader of the group does not read it again once the queues are raised.
    import json
    from types import SimpleNamespace

    from pyspark_pymq.spark.progress import commit_group_progress
    from pyspark_pymq.spark.source_offset import offsets_to_json

    c = rocketmq_cluster
    topic = _topic(c, "scalein", queues=2, brokers=["broker-a"])
    producer = Producer(namesrv_addr=c.namesrv_addr)
    for i in range(6):
        producer.send(Message(topic, b"x%d" % i))
    group = unique("g")
    consumer = PullConsumer(group=group, namesrv_addr=c.namesrv_addr)
    assert len(_read(consumer, topic, at_least=6)) == 6  # also creates the group
    opts = parse_source_options({"namesrvAddr": c.namesrv_addr, "topic": topic, "consumerGroup": group},
                                stream=True)
    reader = OffsetReader(opts, open_backend(opts.backend))
    bounds, _ = reader.bounds(require_topics=True)
    ends = {mq: b.max_offset for mq, b in bounds.items() if mq.topic == topic}
    q0, q1 = MessageQueue(topic, "broker-a", 0), MessageQueue(topic, "broker-a", 1)
    assert set(ends) == {q0, q1} and ends[q1] > 0
    c.mqadmin("updateTopic", "-b", c.broker_addrs["broker-a"], "-t", topic, "-r", "1", "-w", "1")
    deadline = time.monotonic() + 30
    while q1 in consumer.queues(topic):
        assert time.monotonic() < deadline, "the name server still routes queue 1 after the scale-in"
        time.sleep(0.2)
    reader.bounds(require_topics=False)
    reader.commit(ends)  # a batch's end, committed once the next batch is planned (queue 1 cut)
    assert (consumer.committed(q0), consumer.committed(q1)) == (ends[q0], ends[q1])
    later = {q0: ends[q0] + 1, q1: ends[q1] + 1}  # as if the last batch moved both
    query = SimpleNamespace(lastProgress={"sources": [{"endOffset": json.dumps(offsets_to_json(later))}]})
    assert commit_group_progress(query, None, group, namesrv_addr=c.namesrv_addr) == 2
    assert (consumer.committed(q0), consumer.committed(q1)) == (later[q0], later[q1])


def test_a_send_back_finds_the_messages_broker_by_name(rocketmq_cluster: RocketMQCluster) -> None:
    # The broker that stores a message does its send back whatever its original topic's route
    # says (RocketMQ's consumer finds it by name): here the topic was deleted after the read, and
    # another process (an executor holding no route) sends the message back.
    c = rocketmq_cluster
    topic, consumer, first = _one_read(c, "byname", "broker-a")
    group = consumer.group
    c.mqadmin("deleteTopic", "-c", c.cluster_name, "-t", topic)  # the message stays in the commit log
    elsewhere = PullConsumer(group=group, namesrv_addr=c.namesrv_addr)
    with pytest.raises(TopicNotExistError):
        elsewhere.queues(topic)
    result = elsewhere.send_back(first)  # type: ignore[arg-type]
    assert (result.topic, result.dead_letter, result.fallback) == (f"%RETRY%{group}", False, False)
    (copy,) = _wait_for(elsewhere, f"%RETRY%{group}", 1)
    assert (copy.broker_name, copy.body, copy.properties["RETRY_TOPIC"]) == ("broker-a", b"fails", topic)


def test_admin_groups_leave_out_rocketmqs_own_groups_only(rocketmq_cluster: RocketMQCluster) -> None:
    # RocketMQ's system groups are the ones its brokers create (SubscriptionGroupManager.init())
    # and CID_RMQ_SYS_*; a user's group spelt as many are (ORDER_..._CONSUMER, ..._GROUP) is listed.
    c = rocketmq_cluster
    suffix = unique("x").upper().replace("-", "")
    mine = [f"ORDER_{suffix}_CONSUMER", f"PAY_{suffix}_GROUP"]
    for group in mine:
        c.mqadmin("updateSubGroup", "-c", c.cluster_name, "-g", group)
    admin = Admin(namesrv_addr=c.namesrv_addr)
    listed = set(admin.groups()["group"])
    assert set(mine) <= listed
    system = {"TOOLS_CONSUMER", "FILTERSRV_CONSUMER", "SELF_TEST_C_GROUP", "CID_ONS-HTTP-PROXY",
              "CID_ONSAPI_PULL", "CID_ONSAPI_PERMISSION", "CID_ONSAPI_OWNER", "CID_RMQ_SYS_TRANS"}
    assert not listed & system, listed & system
    assert set(admin.groups(include_internal=True)["group"]) >= system | set(mine)


def test_lag_of_a_topic_that_does_not_exist_is_an_error(rocketmq_cluster: RocketMQCluster) -> None:
    # As on the embedded broker and in mqadmin consumerProgress -t: a misspelt topic must not read
    # as "no lag" (the brokers answer an empty table for a topic they do not have).
    c = rocketmq_cluster
    topic, consumer, _ = _one_read(c, "lagtypo", "broker-a")
    consumer.commit(MessageQueue(topic, "broker-a", 0), 1)
    admin = Admin(namesrv_addr=c.namesrv_addr)
    missing = unique("no-such-topic")
    with pytest.raises(TopicNotExistError, match=missing):
        admin.group_progress(consumer.group, missing)
    deadline = time.monotonic() + 30
    while admin.group_progress(consumer.group, topic)["consumer_offset"].tolist() != [1]:
        assert time.monotonic() < deadline, admin.group_progress(consumer.group, topic)
        time.sleep(0.3)


def test_admin_topics_leave_out_the_topics_named_after_clusters_and_brokers(
    rocketmq_cluster: RocketMQCluster,
) -> None:
    # RocketMQ's brokers create a topic named after their cluster, <cluster>_REPLY_TOPIC and one
    # named after each broker: system topics, listed only with include_system.
    c = rocketmq_cluster
    topic = _topic(c, "usertopic", queues=1)
    admin = Admin(namesrv_addr=c.namesrv_addr)
    own = {c.cluster_name, f"{c.cluster_name}_REPLY_TOPIC", *c.broker_names}
    everything = set(admin.topic_names(include_system=True))
    assert own <= everything
    names = set(admin.topic_names())
    assert topic in names and not names & own, names & own
    # one route request per topic listed (its queue counts and its stats share it)
    namesrv = admin._namesrv
    asked: Counter[str] = Counter()
    get_route_info = namesrv.get_route_info

    def counted(name: str) -> Any:
        asked[name] += 1
        return get_route_info(name)

    namesrv.get_route_info = counted  # type: ignore[method-assign]
    table = admin.topics()
    assert not set(table["topic"]) & own
    assert topic in set(table["topic"])
    assert asked[topic] == 1 and set(asked.values()) == {1}, asked


def test_the_lag_view_of_a_topic_asks_its_route_once(
    rocketmq_cluster: RocketMQCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The lag view without consumerGroup lists the groups of the topic's brokers, then each
    # group's progress there: one route request for the topic, however many groups read it.
    c = rocketmq_cluster
    topic, first, _ = _one_read(c, "lagroute", "broker-a")
    groups = [first, *(PullConsumer(group=unique("g"), namesrv_addr=c.namesrv_addr) for _ in range(2))]
    mq = MessageQueue(topic, "broker-a", 0)
    for n, consumer in enumerate(groups):
        consumer.register(topic)  # the broker meets the group (a commit alone does not make it)
        consumer.commit(mq, n % 2)
    names = {g.group for g in groups}
    options = parse_view_options({"namesrvAddr": c.namesrv_addr, "view": "lag", "topic": topic})
    deadline = time.monotonic() + 30
    while {r["group"] for r in _rows(options)} != names:  # commits reach the broker asynchronously
        assert time.monotonic() < deadline, _rows(options)
        time.sleep(0.3)
    asked: Counter[str] = Counter()
    get_route_info = NameServerClient.get_route_info

    def counted(self: NameServerClient, name: str) -> Any:
        asked[name] += 1
        return get_route_info(self, name)

    monkeypatch.setattr(NameServerClient, "get_route_info", counted)
    rows = _rows(options)
    assert sorted((r["group"], r["consumer_offset"], r["lag"]) for r in rows) == sorted(
        (g.group, n % 2, 1 - n % 2) for n, g in enumerate(groups))
    assert asked == Counter({topic: 1}), asked


def test_admin_tables_of_a_cluster_with_a_hung_broker(
    rocketmq_cluster: RocketMQCluster, caplog: pytest.LogCaptureFixture
) -> None:
    # broker-a hung (SIGSTOP: still registered, answering nothing). The progress of a group whose
    # consumers met broker-b only comes from broker-b (the brokers of %RETRY%<group>'s route, as
    # mqadmin consumerProgress asks); broker-a, asked in case of commits without a registration,
    # is left out with a warning naming it. Tables that need broker-a fail naming it: rows
    # silently missing would show less lag than there is.
    c = rocketmq_cluster
    topic = _topic(c, "hung", queues=1, brokers=["broker-b"])
    on_a = _topic(c, "hung-a", queues=1, brokers=["broker-a"])
    Producer(namesrv_addr=c.namesrv_addr).send_batch([Message(topic, b"a"), Message(topic, b"b")])
    group = unique("g")
    consumer = PullConsumer(group=group, namesrv_addr=c.namesrv_addr)
    consumer.register(topic)  # a heartbeat: %RETRY%<group> on broker-b only
    mq = MessageQueue(topic, "broker-b", 0)
    consumer.commit(mq, 1)
    admin = Admin(namesrv_addr=c.namesrv_addr, timeout_ms=3000)
    progress = ["topic", "broker_name", "queue_id", "broker_offset", "consumer_offset", "lag"]
    deadline = time.monotonic() + 30
    while admin.group_progress(group)[progress].values.tolist() != [[topic, "broker-b", 0, 2, 1, 1]]:
        assert time.monotonic() < deadline, admin.group_progress(group)
        time.sleep(0.3)
    while on_a not in admin.topic_names():  # its route at the name server before broker-a hangs
        assert time.monotonic() < deadline, on_a
        time.sleep(0.3)
    hung = f"broker 'broker-a' ({c.broker_addrs['broker-a']}) did not answer"

    def warnings() -> list[str]:
        return [r.getMessage() for r in caplog.records if r.name == "pyspark_pymq.rocketmq.admin"]

    caplog.set_level("WARNING", logger="pyspark_pymq.rocketmq.admin")
    c.pause_broker("broker-a")
    try:
        for of_topic in (None, None, topic):
            rows = admin.group_progress(group, of_topic)[progress].values.tolist()
            assert rows == [[topic, "broker-b", 0, 2, 1, 1]]
        # asked once (its time-out), then left out for UNANSWERED_RETRY_S; never for the topic's rows
        assert len(warnings()) == 2 and hung in warnings()[0], warnings()
        assert "not asked again yet" in warnings()[1]
        assert admin.topic_stats(topic)["max_offset"].tolist() == [2]  # broker-b's topic
        for table in (admin.groups, admin.topics, lambda: admin.topic_stats(on_a)):
            with pytest.raises(RequestTimeoutError) as info:
                table()
            assert hung in str(info.value) and "would miss its rows" in str(info.value)

        def view(name: str, **options: str) -> list[tuple[Any, ...]]:
            # as an executor reads a view: a new Admin (10 s time-out), never waiting for broker-a
            began = time.monotonic()
            rows = _rows(parse_view_options({"namesrvAddr": c.namesrv_addr, "view": name, **options}))
            assert time.monotonic() - began < 3, f"view {name} waited for broker-a"
            shown = ("group", "topic", "broker_name", "consumer_offset", "lag", "messages")
            return [tuple(r[k] for k in shown if k in r) for r in rows]

        # one topic's rows need only the brokers of its route
        assert view("topics", topic=topic) == [(topic, 2)]
        assert view("topics", topic=unique("missing")) == []  # as the embedded broker's view
        assert view("lag", topic=topic) == [(group, topic, "broker-b", 1, 1)]
    finally:
        c.resume_broker("broker-a")


def test_a_group_no_broker_knows_fails_its_progress_naming_it(rocketmq_cluster: RocketMQCluster) -> None:
    # mqadmin consumerProgress -g <no such group> fails; an empty table would read as "no lag" (in the
    # lag view too). A group the brokers know without progress, and one that only committed offsets
    # (never registered: %RETRY%<group> has no route), still show their (empty or not) tables.
    c = rocketmq_cluster
    admin = Admin(namesrv_addr=c.namesrv_addr)
    missing = unique("no-such-group")
    with pytest.raises(PymqError, match=f"consumer group {missing!r} is unknown") as info:
        admin.group_progress(missing)
    assert info.value.code == GROUP_NOT_EXIST
    with pytest.raises(PymqError, match=f"consumer group {missing!r} is unknown"):
        _rows(parse_view_options({"namesrvAddr": c.namesrv_addr, "view": "lag", "consumerGroup": missing}))
    topic = _topic(c, "commit-only", queues=1, brokers=["broker-a"])
    Producer(namesrv_addr=c.namesrv_addr).send_batch([Message(topic, b"a"), Message(topic, b"b")])
    group = unique("g")
    consumer = PullConsumer(group=group, namesrv_addr=c.namesrv_addr)
    _read(consumer, topic, at_least=2)  # pulls only, no heartbeat
    with pytest.raises(PymqError, match=f"consumer group {missing!r} is unknown"):
        admin.group_progress(missing, topic)  # not the topic's queues at consumer offset 0
    consumer.commit(MessageQueue(topic, "broker-a", 0), 1)
    with pytest.raises(TopicNotExistError):
        open_backend(BackendConfig(namesrv_addr=c.namesrv_addr)).route(f"%RETRY%{group}", refresh=True)
    progress = ["group", "topic", "broker_name", "queue_id", "broker_offset", "consumer_offset", "lag"]
    deadline = time.monotonic() + 30
    while admin.group_progress(group)[progress].values.tolist() != [[group, topic, "broker-a", 0, 2, 1, 1]]:
        assert time.monotonic() < deadline, admin.group_progress(group)
        time.sleep(0.3)
    lag = _rows(parse_view_options({"namesrvAddr": c.namesrv_addr, "view": "lag", "topic": topic}))
    assert [(r["group"], r["lag"]) for r in lag] == [(group, 1)]  # without consumerGroup: as before
    known = unique("known-group")
    c.mqadmin("updateSubGroup", "-c", c.cluster_name, "-g", known)
    while known not in set(admin.groups()["group"]):
        assert time.monotonic() < deadline + 30, known
        time.sleep(0.3)
    assert admin.group_progress(known).empty


def test_dead_letters_of_a_write_only_dlq_topic_fail_saying_how_to_read_them(
    rocketmq_cluster: RocketMQCluster,
) -> None:
    # RocketMQ 4.3-4.7 create every %DLQ% topic write-only (perm 2): its letters would show as none
    c = rocketmq_cluster
    _, consumer, first = _one_read(c, "dlq-perm", "broker-a")
    dlq = f"%DLQ%{consumer.group}"
    assert consumer.send_back(first, -1).topic == dlq  # straight to the dead letters
    admin = Admin(namesrv_addr=c.namesrv_addr)
    deadline = time.monotonic() + 30
    while len(admin.dead_letters(consumer.group)) != 1:
        assert time.monotonic() < deadline, admin.dead_letters(consumer.group)
        time.sleep(0.3)
    c.mqadmin("updateTopicPerm", "-c", c.cluster_name, "-t", dlq, "-p", "2")
    while True:
        try:
            rows = admin.dead_letters(consumer.group)
        except PymqError as err:
            assert isinstance(err, NoPermissionError), err
            assert f"dead-letter topic {dlq!r}" in str(err), err
            assert f"updateTopicPerm -c <cluster> -t {dlq} -p 6" in str(err), err
            break
        assert len(rows) == 1 and time.monotonic() < deadline + 30, rows  # until the name servers know
        time.sleep(0.3)
    with pytest.raises(NoPermissionError, match="not readable"):
        _rows(parse_view_options({"namesrvAddr": c.namesrv_addr, "view": "deadLetters",
                                  "consumerGroup": consumer.group}))


def test_a_rocketmq_address_given_as_a_pymq_endpoint_says_to_use_namesrv_addr(
    rocketmq_cluster: RocketMQCluster,
) -> None:
    """RocketMQ's servers complete a TLS handshake too (permissive mode, a self-signed test
    certificate): a name server or broker given as ``endpoint`` was answered "enable TLS on the
    client", which led on to a certificate error. It is named for what it is now."""
    c = rocketmq_cluster
    for addr in (c.namesrv_addr, c.broker_addrs["broker-a"]):
        with pytest.raises(BrokerUnavailableError, match=rf"{addr} speaks RocketMQ's remoting") as err:
            Producer(addr).send(Message("t", b"x"))
        assert "namesrv_addr=" in str(err.value) and "TLS" not in str(err.value)


def test_an_unreachable_name_server_is_explained_once() -> None:
    """The source's error said what to check three times (the connection's, the name servers', the
    source's words); once now, the source's."""
    with socket.create_server(("127.0.0.1", 0)) as s:
        dead = f"127.0.0.1:{s.getsockname()[1]}"
    opts = parse_source_options({"namesrvAddr": dead, "topic": "t", "connectTimeoutMs": "1000",
                                 "consumerGroup": "g"}, stream=True)
    with pytest.raises(BrokerUnavailableError) as err:
        OffsetReader(opts).bounds(require_topics=True)
    text = str(err.value)
    assert f"cannot connect to {dead}" in text and text.count("Check ") == 1, text
    assert text.endswith("Check that the name servers and their brokers run and namesrvAddr is right"), text


def test_a_sql92_subscription_is_checked_with_each_broker_at_start(rocketmq_cluster: RocketMQCluster) -> None:
    """CHECK_CLIENT_CONFIG to each broker of the topic, as RocketMQ's push consumer at its start: a
    broker with enablePropertyFilter off failed every task's first pull instead."""
    c = rocketmq_cluster
    topic = _topic(c, "sql-check")
    backend = open_backend(BackendConfig(namesrv_addr=c.namesrv_addr))
    queues = backend.route(topic).subscribe_queues
    assert {mq.broker_name for mq in queues} == {"broker-a", "broker-b"}
    backend.check_client_config("g", queues, "a = 1", "SQL92")
    with pytest.raises(SubscriptionParseError):
        backend.check_client_config("g", queues, "a >", "SQL92")
    raw = {"namesrvAddr": c.namesrv_addr, "topic": topic, "consumerGroup": unique("g"),
           "subscriptionType": "SQL92", "subscription": "a = 1"}
    reader = OffsetReader(parse_source_options(raw, stream=True))
    flag = ("updateBrokerConfig", "-b", c.broker_addrs["broker-b"], "-k", "enablePropertyFilter", "-v")
    c.mqadmin(*flag, "false")
    try:
        refused = (r"subscriptionType='SQL92', subscription='a = 1': CHECK_CLIENT_CONFIG .*"
                   r"does not support .*enablePropertyFilter=true")
        with pytest.raises(PymqError, match=refused):
            reader.bounds(require_topics=True)
    finally:
        c.mqadmin(*flag, "true")
    OffsetReader(parse_source_options(raw, stream=True)).bounds(require_topics=True)

"""The embedded broker answers as Apache RocketMQ 5.3.3 does (issue 16), real broker processes.

What a trace of real RocketMQ 5.3.3 showed (/work/shared/real-rocketmq.md, "Semantics
observed on it") and the broker sources it comes from: send-back copies and their
properties, maxReconsumeTimes per send back, unchecked commits, setZeroIfNotFound,
consumer progress, and %RETRY%<group> made when a consumer registers.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from broker_process import BrokerProcess
from pymq_proto.record import HEADER, split_tail
from pymq_proto.v1 import pymq_pb2
from pyspark_pymq import Admin, Message, MessageExt, MessageQueue, Producer, PullConsumer
from pyspark_pymq.client.transport import BrokerClient
from pyspark_pymq.errors import GROUP_NOT_EXIST, PymqError, TopicNotExistError
from pyspark_pymq.spark.offset_reader import OffsetReader
from pyspark_pymq.spark.options import parse_source_options

LEVELS = " ".join(f"{20 * level}ms" for level in range(1, 19))
PERM_READ_WRITE = 6


@pytest.fixture(scope="module")
def fast(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """One broker for the module, delay level L = 20*L ms; tests use distinct names."""
    with BrokerProcess(tmp_path_factory.mktemp("parity"), ["--message-delay-level", LEVELS]) as broker:
        yield broker.endpoint


def _one(ep: str, topic: str, group: str, **kw: object) -> tuple[PullConsumer, MessageExt, str]:
    """``topic`` (1 queue) with one message, consumed by ``group``: (consumer, message, offsetMsgId)."""
    Admin(ep).create_topic(topic, queues=1)
    sent = Producer(ep).send(Message(topic, b"x", **kw))  # type: ignore[arg-type]
    consumer = PullConsumer(ep, group)
    return consumer, consumer.pull(consumer.queues(topic)[0], 0, 10).messages[0], sent.offset_msg_id


def _retried(consumer: PullConsumer, n: int) -> list[MessageExt]:
    """The first ``n`` messages of the group's %RETRY% queue, waiting for their delays."""
    got: list[MessageExt] = []
    deadline = time.monotonic() + 10
    while len(got) < n and time.monotonic() < deadline:
        got = consumer.pull(consumer.retry_queues()[0], 0, 100, suspend_timeout_ms=100).messages
    assert len(got) >= n, f"{len(got)} of {n} retries arrived"
    return got


def _names(ep: str, topic: str) -> list[list[bytes]]:
    """The property names of each stored record of ``topic``'s queue 0, as stored."""
    raw = PullConsumer(ep, "raw-reader").pull_raw(MessageQueue(topic, "broker-a", 0), 0, 100).records
    out, pos = [], 0
    while pos < len(raw):
        h = HEADER.unpack_from(raw, pos)
        _, _, p0, p1 = split_tail(raw, pos, h[0], h[13])
        out.append([e.split(b"\x01")[0] for e in bytes(raw[p0:p1]).split(b"\x02") if e])
        pos += h[0]
    return out


# -- send back ------------------------------------------------------------------------------


def test_retry_and_dead_letter_copies_carry_rocketmqs_properties(fast: str) -> None:
    consumer, m, offset_id = _one(fast, "pp", "gpp", tags="T", keys=["k"])
    assert "DELAY" not in m.properties and "REAL_TOPIC" not in m.properties
    consumer.send_back(m, delay_level=1)
    r = _retried(consumer, 1)[0]
    # %RETRY% copy: delayed through SCHEDULE_TOPIC_XXXX, the delay's properties kept on delivery
    assert r.properties["DELAY"] == "1"
    assert (r.properties["REAL_TOPIC"], r.properties["REAL_QID"]) == ("%RETRY%gpp", "0")
    assert r.properties["RETRY_TOPIC"] == "pp" and r.properties["WAIT"] == "false"
    assert r.properties["ORIGIN_MESSAGE_ID"] == offset_id != m.msg_id  # offsetMsgId, not UNIQ_KEY
    assert (r.msg_id, r.born_timestamp, r.reconsume_times) == (m.msg_id, m.born_timestamp, 1)
    assert (r.tags, r.keys) == ("T", ("k",))
    assert consumer.send_back(r, delay_level=-1).dead_letter
    d = Admin(fast).dead_letter_messages("gpp")[0]
    # %DLQ% copy: DELAY=0, the retry copy's REAL_TOPIC / REAL_QID / RETRY_TOPIC / ORIGIN_MESSAGE_ID kept
    assert d.properties["DELAY"] == "0" and d.properties["WAIT"] == "false"
    assert (d.properties["REAL_TOPIC"], d.properties["REAL_QID"]) == ("%RETRY%gpp", "0")
    assert d.properties["RETRY_TOPIC"] == "pp" and d.properties["ORIGIN_MESSAGE_ID"] == offset_id
    assert (d.msg_id, d.reconsume_times) == (m.msg_id, 2)
    for topic in ("%RETRY%gpp", "%DLQ%gpp"):
        cfg = Admin(fast).topic_config(topic)
        assert (cfg.read_queue_nums, cfg.write_queue_nums, cfg.perm) == (1, 1, PERM_READ_WRITE)
        for names in _names(fast, topic):
            assert len(names) == len(set(names)), f"an entry is written twice in {topic}: {names}"


def test_a_dead_letter_straight_from_its_topic_has_no_real_topic(fast: str) -> None:
    consumer, m, offset_id = _one(fast, "straight", "gst")
    assert consumer.send_back(m, delay_level=-1).dead_letter
    d = Admin(fast).dead_letter_messages("gst")[0]
    assert d.properties["DELAY"] == "0" and "REAL_TOPIC" not in d.properties
    assert d.properties["ORIGIN_MESSAGE_ID"] == offset_id and d.properties["RETRY_TOPIC"] == "straight"


def test_dead_letters_are_found_and_resent_by_the_originals_offset_msg_id(fast: str) -> None:
    consumer, m, offset_id = _one(fast, "orig", "gor")
    consumer.send_back(m, delay_level=-1)
    admin = Admin(fast)
    table = admin.dead_letters("gor")
    assert list(table["origin_msg_id"]) == [offset_id] and list(table["msg_id"]) == [m.msg_id]
    original = admin.view_message(offset_id)  # VIEW_MESSAGE_BY_ID, as RocketMQ's tools
    assert (original.topic, original.queue_offset, original.msg_id) == ("orig", 0, m.msg_id)
    assert admin.resend_dead_letters("gor", ["not-an-id"]) == 0
    assert admin.resend_dead_letters("gor", [offset_id]) == 1  # picked by its origin_msg_id
    again = consumer.pull(consumer.queues("orig")[0], 1, 10).messages
    assert [x.body for x in again] == [b"x"] and again[0].properties["ORIGIN_MESSAGE_ID"] == offset_id


def _group_max(ep: str, group: str) -> int:
    req = pymq_pb2.GetSubscriptionGroupRequest(group_name=group)
    return int(BrokerClient(ep).get_subscription_group(req).config.retry_max_times)


def test_max_reconsume_times_goes_with_each_send_back_and_the_group_keeps_its_own(fast: str) -> None:
    consumer, a, _ = _one(fast, "mx", "gmx")
    Producer(fast).send(Message("mx", b"y"))
    b = consumer.pull(consumer.queues("mx")[0], 1, 10).messages[0]
    consumer.send_back(a, delay_level=1, max_reconsume_times=1)
    consumer.send_back(b, delay_level=1)
    assert _group_max(fast, "gmx") == 16  # not overwritten by the client's 1
    first = {m.body: m for m in _retried(consumer, 2)}
    # a: reconsume times 1 >= this send back's 1: dead. b: the group's 16 applies, not a's 1
    assert consumer.send_back(first[b"x"], delay_level=1, max_reconsume_times=1).dead_letter
    assert not consumer.send_back(first[b"y"], delay_level=1).dead_letter
    # the group's retryMaxTimes (mqadmin updateSubGroup) applies when a send back names none
    BrokerClient(fast).update_subscription_group(pymq_pb2.UpdateSubscriptionGroupRequest(
        config=pymq_pb2.SubscriptionGroupConfig(group_name="gmx", retry_queue_nums=1, retry_max_times=2,
                                                consume_enable=True)))
    again = [m for m in _retried(consumer, 3) if m.reconsume_times == 2]
    assert again and consumer.send_back(again[0], delay_level=1).dead_letter
    assert _group_max(fast, "gmx") == 2


def test_a_direct_retry_send_goes_to_the_dlq_only_over_its_maximum(fast: str) -> None:
    """The client's fallback (send back failed): RocketMQ's handleRetryAndDLQ sends a retry
    whose reconsumeTimes (the failed message's + 1) is over maxReconsumeTimes to the DLQ."""
    consumer, m, offset_id = _one(fast, "direct", "gdr")
    lost = dataclasses.replace(m, commit_log_offset=10**12)  # the broker cannot find it
    at_max = consumer.send_back(dataclasses.replace(lost, reconsume_times=2), max_reconsume_times=3)
    assert at_max.fallback
    over = consumer.send_back(dataclasses.replace(lost, reconsume_times=3), max_reconsume_times=3)
    assert over.fallback
    dead = Admin(fast).dead_letter_messages("gdr")
    assert [d.reconsume_times for d in dead] == [4]  # the 3rd retry (3 <= 3) still went to %RETRY%
    assert dead[0].properties["DELAY"] == "-1"  # as RocketMQ's handleRetryAndDLQ stores it
    assert dead[0].properties["ORIGIN_MESSAGE_ID"] == offset_id
    assert Admin(fast).topic_stats("%DLQ%gdr")["messages"].sum() == 1


# -- consumer offsets --------------------------------------------------------------------------


def _get_offset(ep: str, group: str, topic: str, queue_id: int, **kw: bool) -> int:
    mq = pymq_pb2.MessageQueue(topic=topic, broker_name="broker-a", queue_id=queue_id)
    req = pymq_pb2.GetOffsetRequest(consumer_group=group, message_queue=mq, **kw)
    return int(BrokerClient(ep).get_offset(req).offset)


def test_commits_are_not_bound_checked(endpoint: str) -> None:
    Admin(endpoint).create_topic("three", queues=1)
    Producer(endpoint).send_batch([Message("three", b"m%d" % i) for i in range(3)])
    consumer = PullConsumer(endpoint, "gc")
    mq = consumer.queues("three")[0]
    consumer.commit(mq, 100)
    assert consumer.committed(mq) == 100  # as RocketMQ: 100 on a 3-message queue reads back 100
    row = Admin(endpoint).group_progress("gc").iloc[0]
    assert (row["broker_offset"], row["consumer_offset"], row["lag"]) == (3, 100, 0)
    consumer.commit(mq, 1)  # and back below the max
    assert consumer.committed(mq) == 1


def test_a_group_that_never_committed_reads_zero_unless_it_asks_for_not_found(endpoint: str) -> None:
    Admin(endpoint).create_topic("fresh", queues=2)
    q = Producer(endpoint).send(Message("fresh", b"m")).message_queue.queue_id
    # RocketMQ's setZeroIfNotFound (unset = true): 0 where the queue starts at 0 in memory
    assert _get_offset(endpoint, "gz", "fresh", q) == 0
    assert _get_offset(endpoint, "gz", "fresh", q, set_zero_if_not_found=True) == 0
    assert _get_offset(endpoint, "gz", "fresh", q, set_zero_if_not_found=False) == -1
    assert _get_offset(endpoint, "gz", "fresh", 1 - q) == -1  # no message at offset 0: not found
    consumer = PullConsumer(endpoint, "gz")
    assert [consumer.committed(mq) for mq in consumer.queues("fresh")] == [-1, -1]  # "no progress"
    consumer.commit(MessageQueue("fresh", "broker-a", q), 1)
    assert _get_offset(endpoint, "gz", "fresh", q, set_zero_if_not_found=False) == 1


def test_a_first_message_out_of_memory_is_not_found(tmp_path: Path) -> None:
    with BrokerProcess(tmp_path / "b", ["--access-message-in-memory-max-ratio", "0"]) as broker:
        ep = broker.endpoint
        Admin(ep).create_topic("cold", queues=1)
        Producer(ep).send(Message("cold", b"m"))
        assert _get_offset(ep, "gcold", "cold", 0) == -1


def test_group_progress_shows_every_queue_and_zero_where_never_committed(endpoint: str) -> None:
    Admin(endpoint).create_topic("gp", queues=3)
    Producer(endpoint).send_batch([Message("gp", b"a"), Message("gp", b"b")])  # one queue
    consumer = PullConsumer(endpoint, "gprog")
    queues = consumer.queues("gp")
    full = next(mq for mq in queues if consumer.max_offset(mq) == 2)
    consumer.commit(queues[(full.queue_id + 1) % 3], 0)
    frame = Admin(endpoint).group_progress("gprog")
    rows = {int(r["queue_id"]): (r["broker_offset"], r["consumer_offset"], r["lag"])
            for r in frame.to_dict("records")}
    # as mqadmin consumerProgress: every read queue of the group's topics, 0 where never committed
    assert rows == {q: ((2, 0, 2) if q == full.queue_id else (0, 0, 0)) for q in range(3)}
    assert len(Admin(endpoint).group_progress("gprog", "gp")) == 3
    with pytest.raises(PymqError, match="consumer group 'nobody' is unknown") as info:
        Admin(endpoint).group_progress("nobody")  # a misspelt group: not an empty table ("no lag")
    assert info.value.code == GROUP_NOT_EXIST
    with pytest.raises(PymqError, match="consumer group 'nobody' is unknown"):
        Admin(endpoint).group_progress("nobody", "gp")  # not "gp"'s queues at consumer offset 0
    Admin(endpoint).update_group("nobody", retry_max_times=3)
    assert Admin(endpoint).group_progress("nobody").empty  # known, no progress
    assert Admin(endpoint).group_progress("nobody", "gp")["consumer_offset"].tolist() == [0, 0, 0]


# -- registration ---------------------------------------------------------------------------


def test_a_registering_consumer_gets_its_retry_topic(endpoint: str) -> None:
    admin = Admin(endpoint)
    admin.create_topic("reg", queues=2)
    consumer = PullConsumer(endpoint, "greg")
    consumer.pull(consumer.queues("reg")[0], 0)
    consumer.commit(consumer.queues("reg")[0], 0)
    assert "%RETRY%greg" not in admin.topic_names(include_system=True)  # pulls and commits do not
    with pytest.raises(TopicNotExistError):  # nor does asking for its route (RocketMQ's answer)
        consumer.queues("%RETRY%greg")
    assert "%RETRY%greg" not in admin.topic_names(include_system=True)
    consumer.register("reg")  # RocketMQ's HEART_BEAT
    cfg = admin.topic_config("%RETRY%greg")
    assert (cfg.read_queue_nums, cfg.write_queue_nums, cfg.perm) == (1, 1, PERM_READ_WRITE)
    assert "greg" in set(admin.groups()["group"])
    consumer.register("reg")  # again: nothing changes
    assert admin.topic_names(include_system=True).count("%RETRY%greg") == 1
    # the client's retry_queues() registers a group whose %RETRY% topic does not exist yet
    assert PullConsumer(endpoint, "greg2").retry_queues() == [MessageQueue("%RETRY%greg2", "broker-a", 0)]


def test_the_spark_source_starts_from_its_group_as_before(endpoint: str) -> None:
    """Where a stream with startingOffsets=group starts: the committed offset, clamped to the
    queue's end when beyond it, and consumeFromWhere where the group never committed (-1, not
    RocketMQ's 0). Opening it registers the group: %RETRY%<group> exists from the start."""
    Admin(endpoint).create_topic("src", queues=2)
    Producer(endpoint).send_batch([Message("src", b"m%d" % i) for i in range(3)])
    consumer = PullConsumer(endpoint, "gsrc")
    full = next(mq for mq in consumer.queues("src") if consumer.max_offset(mq) == 3)
    consumer.commit(full, 100)

    def starts(group: str) -> dict[MessageQueue, int]:
        opts = parse_source_options({"endpoint": endpoint, "topic": "src", "consumerGroup": group},
                                    stream=True)  # consumeFromWhere: CONSUME_FROM_LAST_OFFSET
        reader = OffsetReader(opts)
        bounds, _missing = reader.bounds(require_topics=True)
        return reader.starting_offsets(bounds)

    assert starts("gsrc")[full] == 3  # committed 100, the queue ends at 3: the source reads on from 3
    # never committed: CONSUME_FROM_LAST_OFFSET, the end of the queue (RocketMQ's 0 would re-read it)
    assert starts("gsrc2")[full] == 3
    assert {"%RETRY%gsrc", "%RETRY%gsrc2"} <= set(Admin(endpoint).topic_names(include_system=True))


def test_a_retry_queue_without_progress_starts_where_rocketmq_consumers_start_it(endpoint: str) -> None:
    """RebalancePushImpl.computePullFromWhereWithException for a %RETRY% queue the group never
    committed on: its first message for CONSUME_FROM_LAST/FIRST_OFFSET, its max offset for
    CONSUME_FROM_TIMESTAMP (whatever the timestamp)."""
    Admin(endpoint).create_topic("rsrc", queues=1)
    Producer(endpoint).send(Message("rsrc", b"m"))
    consumer = PullConsumer(endpoint, "gretry")
    message = consumer.pull(consumer.queues("rsrc")[0], 0, 1).messages[0]
    for _ in range(2):
        consumer.send_back(message, delay_level=1)
    rq = consumer.retry_queues()[0]
    deadline = time.monotonic() + 30
    while consumer.max_offset(rq) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)

    def retry_start(**where: str) -> int:
        opts = parse_source_options({"endpoint": endpoint, "topic": "rsrc", "consumerGroup": "gretry",
                                     **where}, stream=True)
        reader = OffsetReader(opts)
        return reader.starting_offsets(reader.bounds(require_topics=True)[0])[rq]

    assert retry_start() == 0  # CONSUME_FROM_LAST_OFFSET
    assert retry_start(consumeFromWhere="CONSUME_FROM_FIRST_OFFSET") == 0
    assert retry_start(consumeFromWhere="CONSUME_FROM_TIMESTAMP", consumeTimestamp="0") == 2

"""Consume retry, delay levels and dead letters, as RocketMQ does them (real broker process)."""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from broker_process import BrokerProcess
from pyspark_pymq import Admin, Message, MessageExt, Producer, PullConsumer
from pyspark_pymq.client.consumer import retry_topic

# level L waits 20*L ms: distinct, increasing, and the whole ladder takes ~3.4 s
LEVEL_MS = [20 * level for level in range(1, 19)]
LEVELS = " ".join(f"{ms}ms" for ms in LEVEL_MS)
MC_REASON = "CONSUME_FAILURE_REASON"


@pytest.fixture
def retry_broker(tmp_path: Path):
    with BrokerProcess(tmp_path / "b", ["--message-delay-level", LEVELS]) as broker:
        yield broker


def now_ms() -> int:
    return int(time.time() * 1000)


def consume(
    consumer: PullConsumer, topic: str, handle: Callable[[MessageExt], bool], *,
    until: Callable[[], bool], timeout_s: float = 30.0,
) -> None:
    """A RocketMQ-style clustering consumer: the topic and the group's %RETRY% topic,
    failures sent back, progress committed."""
    queues = consumer.queues(topic) + consumer.retry_queues()
    offsets = {mq: max(consumer.committed(mq), 0) for mq in queues}
    deadline = time.monotonic() + timeout_s
    while not until():
        assert time.monotonic() < deadline, "consumer timed out"
        for mq in queues:
            result = consumer.pull(mq, offsets[mq], 32, suspend_timeout_ms=20)
            for m in result.messages:
                if not handle(m):
                    consumer.send_back(m, reason="ValueError: poison")
            offsets[mq] = result.next_begin_offset
            consumer.commit(mq, offsets[mq])


def test_always_failing_message_is_retried_16_times_with_growing_delay_then_dead(retry_broker) -> None:
    ep = retry_broker.endpoint
    Admin(ep).create_topic("orders", queues=2)
    sent = Producer(ep).send(Message("orders", b"poison", keys=["p1"]))
    consumer = PullConsumer(ep, "billing")
    deliveries: list[MessageExt] = []
    sent_back_at: list[int] = []

    def handle(m: MessageExt) -> bool:
        deliveries.append(m)
        sent_back_at.append(now_ms())
        return False

    admin = Admin(ep)
    consume(consumer, "orders", handle, until=lambda: len(admin.dead_letter_messages("billing")) > 0)
    assert len(deliveries) == 1 + 16
    assert [m.reconsume_times for m in deliveries] == list(range(17))
    assert all(m.msg_id == sent.msg_id for m in deliveries)  # the msgId is kept
    for k, m in enumerate(deliveries[1:], start=1):
        assert m.topic == retry_topic("billing") and m.retry_topic == "orders"
        level = 3 + (k - 1)  # levels 3..18 in order
        assert m.store_timestamp >= sent_back_at[k - 1] + LEVEL_MS[level - 1] - 1, (
            f"retry {k} came back before its level {level} delay"
        )
    time.sleep(0.3)
    dead = admin.dead_letter_messages("billing")
    assert len(dead) == 1
    d = dead[0]
    assert d.body == b"poison" and d.msg_id == sent.msg_id
    assert d.properties["DLQ_ORIGIN_TOPIC"] == "orders"
    # RocketMQ's ORIGIN_MESSAGE_ID: the original's offsetMsgId (its msgId is kept in UNIQ_KEY)
    assert d.properties["ORIGIN_MESSAGE_ID"] == d.properties["DLQ_ORIGIN_MESSAGE_ID"] == sent.offset_msg_id
    assert d.properties["CONSUME_FAILURE_REASON"] == "ValueError: poison"
    table = admin.dead_letters("billing")
    assert list(table["origin_topic"]) == ["orders"] and list(table["reconsume_times"]) == [17]
    assert list(table["origin_msg_id"]) == [sent.offset_msg_id]
    original = admin.view_message(table["origin_msg_id"][0])  # VIEW_MESSAGE_BY_ID, as mqadmin
    assert (original.topic, original.body, original.msg_id) == ("orders", b"poison", sent.msg_id)


def test_max_reconsume_times_3_delivers_four_times(retry_broker) -> None:
    ep = retry_broker.endpoint
    Admin(ep).create_topic("t3", queues=1)
    Producer(ep).send(Message("t3", b"bad"))
    consumer = PullConsumer(ep, "g3")
    deliveries: list[MessageExt] = []

    def handle(m: MessageExt) -> bool:
        deliveries.append(m)
        consumer.send_back(m, max_reconsume_times=3)
        return True  # already sent back above, with this consumer's maximum

    admin = Admin(ep)
    consume(consumer, "t3", handle, until=lambda: bool(admin.dead_letter_messages("g3")))
    assert len(deliveries) == 1 + 3
    # RocketMQ: the client's maxReconsumeTimes goes with each send back; the group keeps its own
    from pymq_proto.v1 import pymq_pb2
    from pyspark_pymq.client.transport import BrokerClient

    cfg = BrokerClient(ep).get_subscription_group(pymq_pb2.GetSubscriptionGroupRequest(group_name="g3"))
    assert cfg.config.retry_max_times == 16
    assert dict(zip(admin.groups()["group"], admin.groups()["retry_max_times"], strict=True))["g3"] == 16


def test_negative_delay_level_goes_straight_to_the_dlq(retry_broker) -> None:
    ep = retry_broker.endpoint
    Admin(ep).create_topic("neg", queues=1)
    Producer(ep).send(Message("neg", b"hopeless"))
    consumer = PullConsumer(ep, "gn")
    m = consumer.pull(consumer.queues("neg")[0], 0).messages[0]
    result = consumer.send_back(m, delay_level=-1)
    assert result.dead_letter and result.topic == "%DLQ%gn"
    dead = Admin(ep).dead_letter_messages("gn")
    assert [d.body for d in dead] == [b"hopeless"] and dead[0].reconsume_times == 1
    assert "%RETRY%gn" not in Admin(ep).topic_names(include_system=True)


def test_failing_send_back_falls_back_to_a_direct_retry_send(retry_broker) -> None:
    ep = retry_broker.endpoint
    Admin(ep).create_topic("fb", queues=1)
    Producer(ep).send(Message("fb", b"payload", tags="T"))
    consumer = PullConsumer(ep, "gf")
    m = consumer.pull(consumer.queues("fb")[0], 0).messages[0]
    # the broker cannot find the message by this offset: the RPC fails
    broken = dataclasses.replace(m, commit_log_offset=10**12)
    result = consumer.send_back(broken, reason="boom")
    assert result.fallback and not result.dead_letter
    retry_mq = consumer.retry_queues()[0]
    got: list[MessageExt] = []
    deadline = time.monotonic() + 10
    while not got and time.monotonic() < deadline:
        got = consumer.pull(retry_mq, 0, 10, suspend_timeout_ms=200).messages
    assert got, "the direct retry send never arrived"
    r = got[0]
    assert r.body == b"payload" and r.retry_topic == "fb" and r.reconsume_times == 1
    assert r.tags == "T" and r.properties["CONSUME_FAILURE_REASON"] == "boom"
    assert r.properties["ORIGIN_MESSAGE_ID"] == m.offset_msg_id  # as the broker's send back sets it


def test_producer_delayed_message_arrives_no_earlier_than_its_level(retry_broker) -> None:
    ep = retry_broker.endpoint
    Admin(ep).create_topic("later", queues=4)
    consumer = PullConsumer(ep, "g")
    before = now_ms()
    r = Producer(ep).send(Message("later", b"tick", delay_level=10))
    assert r.message_queue.topic == "later"
    mq = r.message_queue
    assert consumer.max_offset(mq) == 0  # parked in SCHEDULE_TOPIC_XXXX meanwhile
    got = []
    deadline = time.monotonic() + 10
    while not got and time.monotonic() < deadline:
        got = consumer.pull(mq, 0, 1, suspend_timeout_ms=500).messages
    assert got and got[0].body == b"tick" and got[0].queue_id == mq.queue_id
    assert got[0].store_timestamp >= before + LEVEL_MS[9] - 1
    # RocketMQ's delivered copy keeps DELAY, REAL_TOPIC and REAL_QID (and the msgId)
    assert got[0].properties["DELAY"] == "10" and got[0].msg_id == r.msg_id
    assert (got[0].properties["REAL_TOPIC"], got[0].properties["REAL_QID"]) == ("later", str(mq.queue_id))
    assert got[0].offset_msg_id != r.offset_msg_id  # a new copy, written when due
    time.sleep(3 * LEVEL_MS[9] / 1000)
    assert consumer.max_offset(mq) == 1  # delivered once: the DELAY it keeps did not delay it again
    clamped = Producer(ep).send(Message("later", b"max", delay_level=99))
    assert clamped.message_queue.topic == "later"  # clamped to level 18, not refused


@pytest.mark.parametrize("crash", [False, True])
def test_restart_during_pending_delays_loses_nothing(tmp_path: Path, crash: bool) -> None:
    slow = " ".join(["1s"] * 18)
    broker = BrokerProcess(tmp_path / "b", ["--message-delay-level", slow],
                           flush_disk_type="SYNC_FLUSH").start()
    try:
        Admin(broker.endpoint).create_topic("delayed", queues=2)
        producer = Producer(broker.endpoint)
        bodies = {b"d%d" % i for i in range(40)}
        for i, b in enumerate(sorted(bodies)):
            producer.send(Message("delayed", b, delay_level=1 + i % 3))
        broker.restart(crash=crash)
        consumer = PullConsumer(broker.endpoint, "g")
        seen: list[bytes] = []
        deadline = time.monotonic() + 20
        while len(seen) < len(bodies) and time.monotonic() < deadline:
            seen = [m.body for mq in consumer.queues("delayed") for m in consumer.pull(mq, 0, 1000).messages]
            time.sleep(0.2)
        assert set(seen) == bodies  # nothing lost
        if not crash:
            assert len(seen) == len(bodies)  # and nothing doubled after a clean stop
    finally:
        broker.stop()


def test_resent_dead_letters_are_consumed_again_from_their_topic(retry_broker) -> None:
    ep = retry_broker.endpoint
    admin = Admin(ep)
    admin.create_topic("resend", queues=1)
    Producer(ep).send(Message("resend", b"fix-me", keys=["k9"], properties={"a": "1"}))
    consumer = PullConsumer(ep, "gr")
    mq = consumer.queues("resend")[0]
    m = consumer.pull(mq, 0).messages[0]
    consumer.send_back(m, delay_level=-1, reason="bad schema")
    consumer.commit(mq, 1)
    assert admin.resend_dead_letters("gr") == 1
    assert admin.resend_dead_letters("gr") == 0  # already re-sent: not twice
    again = consumer.pull(mq, 1, 10).messages
    assert [x.body for x in again] == [b"fix-me"]
    assert again[0].reconsume_times == 0 and again[0].keys == ("k9",)
    assert again[0].user_properties == {"a": "1"}


def test_dead_letters_resent_before_a_broker_crash_are_not_resent_after_it(retry_broker: Any) -> None:
    """The resend's progress was a commit the broker keeps in memory up to 5 s: a kill -9 right after
    the resend forgot it, and the next resend sent every letter again (with new msgIds)."""
    admin = Admin(retry_broker.endpoint)
    admin.create_topic("resend-crash", queues=1)
    Producer(retry_broker.endpoint).send_batch([Message("resend-crash", b"m%d" % i) for i in range(3)])
    consumer = PullConsumer(retry_broker.endpoint, "g-crash")
    (mq,) = consumer.queues("resend-crash")
    for m in consumer.pull(mq, 0, 10).messages:
        consumer.send_back(m, delay_level=-1, reason="bad schema")
    assert admin.resend_dead_letters("g-crash") == 3
    retry_broker.restart(crash=True)
    admin = Admin(retry_broker.endpoint)
    assert admin.resend_dead_letters("g-crash") == 0  # already re-sent: not twice
    again = PullConsumer(retry_broker.endpoint, "g-crash").pull(mq, 0, 10).messages
    assert sorted(m.body for m in again) == [b"m0", b"m0", b"m1", b"m1", b"m2", b"m2"]


def test_a_failing_send_back_to_the_dlq_still_goes_to_the_dlq(retry_broker: Any) -> None:
    # delay_level -1 (the DLQ at once) when the send back RPC fails: the direct copy must not
    # become an ordinary retry that comes back in 10 s
    ep = retry_broker.endpoint
    Admin(ep).create_topic("fbd", queues=1)
    Producer(ep).send(Message("fbd", b"poison"))
    consumer = PullConsumer(ep, "gfd")
    m = consumer.pull(consumer.queues("fbd")[0], 0).messages[0]
    broken = dataclasses.replace(m, commit_log_offset=10**12)  # the broker cannot find it there
    result = consumer.send_back(broken, delay_level=-1)
    assert (result.topic, result.dead_letter, result.fallback) == ("%DLQ%gfd", True, True)
    assert [d.body for d in Admin(ep).dead_letter_messages("gfd")] == [b"poison"]


def test_a_dead_letter_that_cannot_be_sent_as_it_is_stays_and_the_others_go(
    retry_broker: Any, caplog: pytest.LogCaptureFixture
) -> None:
    # a foreign producer's message whose TAGS holds \x01 (which Message refuses): read back,
    # its tags are "a\x01b"; sent again as they are they would make a property of their own
    from pyspark_pymq.client.codec import uniq_first
    from pyspark_pymq.client.message import new_uniq_key

    ep = retry_broker.endpoint
    admin = Admin(ep)
    admin.create_topic("odd", queues=1)
    producer = Producer(ep)
    uniq = new_uniq_key()
    odd_tags = uniq_first(b"TAGS\x01a\x01b\x02", uniq)
    records, sizes = producer.backend.encode_records("odd", [b"odd"], [odd_tags])
    producer.send_records("odd", records, sizes, [uniq])
    producer.send(Message("odd", b"fine"))
    consumer = PullConsumer(ep, "godd")
    mq = consumer.queues("odd")[0]
    letters = consumer.pull(mq, 0).messages
    assert [m.tags for m in letters] == ["a\x01b", None]
    for m in letters:
        consumer.send_back(m, delay_level=-1)
    with caplog.at_level(logging.WARNING, logger="pyspark_pymq.client.admin"):
        assert admin.resend_dead_letters("godd") == 1
    assert f"dead letter {letters[0].msg_id} of godd is not sent again" in caplog.text
    assert [m.body for m in consumer.pull(mq, 2, 10).messages] == [b"fine"]
    assert [m.body for m in admin.dead_letter_messages("godd")] == [b"odd", b"fine"]  # it stays
    admin.purge_dead_letters("godd")
    assert admin.dead_letter_messages("godd") == []


def _dead_letters_of(ep: str, group: str, *topic_bodies: tuple[str, bytes]) -> PullConsumer:
    """Send each (topic, body), then send it to ``group``'s DLQ at once, in that order."""
    producer = Producer(ep)
    consumer = PullConsumer(ep, group)
    for topic, body in topic_bodies:
        producer.send(Message(topic, body))
    for topic in dict.fromkeys(t for t, _ in topic_bodies):
        for m in consumer.pull(consumer.queues(topic)[0], 0, 100).messages:
            consumer.send_back(m, delay_level=-1)
    return consumer


def test_dead_letters_resent_before_one_whose_topic_is_gone_are_not_sent_again(
    retry_broker: Any, caplog: pytest.LogCaptureFixture
) -> None:
    # progress used to be committed only after the whole loop: the deleted topic's letter
    # raised, nothing was committed, and every call sent k1 and k2 again with new msgIds
    ep = retry_broker.endpoint
    admin = Admin(ep)
    for topic in ("keep", "gone", "keep2"):
        admin.create_topic(topic, queues=1)
    consumer = _dead_letters_of(ep, "gk", ("keep", b"k1"), ("keep", b"k2"), ("gone", b"g1"),
                                ("keep2", b"k3"))
    admin.delete_topic("gone")
    with caplog.at_level(logging.WARNING, logger="pyspark_pymq.client.admin"):
        assert admin.resend_dead_letters("gk") == 3  # the others go on
    assert "TOPIC_NOT_EXIST" in caplog.text
    assert admin.resend_dead_letters("gk") == 0
    assert admin.resend_dead_letters("gk") == 0
    keep = [m.body for m in consumer.pull(consumer.queues("keep")[0], 0, 100).messages]
    assert keep == [b"k1", b"k2", b"k1", b"k2"]  # the originals, then one copy each
    assert [m.body for m in consumer.pull(consumer.queues("keep2")[0], 0, 100).messages] == [b"k3"] * 2
    assert [m.body for m in admin.dead_letter_messages("gk")] == [b"k1", b"k2", b"g1", b"k3"]  # g1 stays
    admin.create_topic("gone", queues=1)
    g1 = admin.dead_letters("gk")["msg_id"][2]
    assert admin.resend_dead_letters("gk", [g1]) == 1  # still there to be picked by its msgId


def test_a_retriable_error_stops_the_resend_with_what_was_sent_committed(
    retry_broker: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pyspark_pymq.client.producer import Producer as ProducerClass
    from pyspark_pymq.errors import SystemBusyError

    ep = retry_broker.endpoint
    admin = Admin(ep)
    admin.create_topic("busy", queues=1)
    consumer = _dead_letters_of(ep, "gbusy", *[("busy", b"b%d" % i) for i in range(4)])
    real_send = ProducerClass.send_sync

    def busy_on_b2(self: Any, message: Message, *args: Any, **kwargs: Any) -> Any:
        if message.body == b"b2":
            raise SystemBusyError("broker busy")
        return real_send(self, message, *args, **kwargs)

    monkeypatch.setattr(ProducerClass, "send_sync", busy_on_b2)
    with pytest.raises(SystemBusyError):
        admin.resend_dead_letters("gbusy")
    monkeypatch.undo()
    assert admin.resend_dead_letters("gbusy") == 2  # b2 and b3: b0 and b1 are not sent twice
    bodies = [m.body for m in consumer.pull(consumer.queues("busy")[0], 4, 100).messages]
    assert bodies == [b"b0", b"b1", b"b2", b"b3"]


def test_send_back_batch_routes_each_item_and_falls_back_per_item(retry_broker) -> None:
    ep = retry_broker.endpoint
    Admin(ep).create_topic("many", queues=2)
    Producer(ep).send_batch([Message("many", b"m%d" % i) for i in range(50)])
    consumer = PullConsumer(ep, "gb")
    msgs = [m for mq in consumer.queues("many") for m in consumer.pull(mq, 0, 100).messages]
    assert len(msgs) == 50
    msgs[0] = dataclasses.replace(msgs[0], commit_log_offset=10**12)  # the broker cannot find it
    results = consumer.send_back_batch(
        msgs, delay_level=1, reasons=[f"r{i}" for i in range(50)] ,
    )
    assert results[0].fallback and not any(r.fallback for r in results[1:])
    assert all(r.topic == "%RETRY%gb" for r in results)
    dead = consumer.send_back_batch(msgs[1:3], delay_level=-1)
    assert all(r.dead_letter for r in dead)
    retry_mq = consumer.retry_queues()[0]
    got: list[MessageExt] = []
    deadline = time.monotonic() + 10
    while len(got) < 50 and time.monotonic() < deadline:
        got = consumer.pull(retry_mq, 0, 100, suspend_timeout_ms=100).messages
    assert sorted(m.body for m in got) == sorted(m.body for m in msgs)
    assert {m.properties["CONSUME_FAILURE_REASON"] for m in got} == {f"r{i}" for i in range(50)}
    assert all(m.reconsume_times == 1 and m.retry_topic == "many" for m in got)
    assert len(Admin(ep).dead_letter_messages("gb")) == 2


def _raw_records(ep: str, topic: str, queue_id: int = 0) -> list[bytes]:
    """The properties of every stored record of a queue, as the commit log holds them."""
    from pymq_proto.record import HEADER, split_tail

    consumer = PullConsumer(ep, "raw-reader")
    from pyspark_pymq import MessageQueue

    raw = consumer.pull_raw(MessageQueue(topic, "broker-a", queue_id), 0, 1000)
    out, pos, buf = [], 0, raw.records
    while pos < len(buf):
        h = HEADER.unpack_from(buf, pos)
        _, _, p0, p1 = split_tail(buf, pos, h[0], h[13])
        out.append(bytes(buf[p0:p1]))
        pos += h[0]
    return out


def test_sending_back_again_replaces_the_entries_of_the_last_send_back(retry_broker) -> None:
    """The second send back of a message keeps its first origin and user properties,
    and writes every entry it sets once, with the new values (no decode of the rest)."""
    ep = retry_broker.endpoint
    Admin(ep).create_topic("twice", queues=1)
    sent = Producer(ep).send(Message("twice", b"b", tags="T", keys=["k1"], properties={"user": "u"}))
    consumer = PullConsumer(ep, "g2")
    first = consumer.pull(consumer.queues("twice")[0], 0, 10).messages[0]
    consumer.send_back(first, delay_level=1, reason={"CONSUME_FAILURE_REASON": "one", "step": "a"})
    retry_mq = consumer.retry_queues()[0]
    got: list[MessageExt] = []
    deadline = time.monotonic() + 10
    while not got and time.monotonic() < deadline:
        got = consumer.pull(retry_mq, 0, 10, suspend_timeout_ms=100).messages
    consumer.send_back(got[0], delay_level=2, reason="two")
    while len(got) < 2 and time.monotonic() < deadline:
        got = consumer.pull(retry_mq, 0, 10, suspend_timeout_ms=100).messages
    again = got[1]
    assert again.msg_id == sent.msg_id and again.reconsume_times == 2 and again.retry_topic == "twice"
    assert again.tags == "T" and again.keys == ("k1",) and again.properties["user"] == "u"
    assert again.properties["CONSUME_FAILURE_REASON"] == "two"
    assert again.properties["step"] == "a"  # not replaced by this send back: kept
    assert again.properties["ORIGIN_MESSAGE_ID"] == sent.offset_msg_id
    stored = _raw_records(ep, retry_topic("g2"))[1]
    names = [entry.split(b"\x01")[0] for entry in stored.split(b"\x02") if entry]
    assert len(names) == len(set(names)), f"an entry is written twice: {stored!r}"
    assert b"RECONSUME_TIME\x012\x02" in stored and b"RETRY_TOPIC\x01twice\x02" in stored


def test_send_back_batch_sets_shared_and_per_message_properties(retry_broker) -> None:
    from pyspark_pymq.client.consumer import SendBackColumns

    ep = retry_broker.endpoint
    Admin(ep).create_topic("cols", queues=1)
    Producer(ep).send_batch([Message("cols", b"m%d" % i) for i in range(4)])
    consumer = PullConsumer(ep, "gc")
    msgs = consumer.pull(consumer.queues("cols")[0], 0, 10).messages
    columns = SendBackColumns(
        "broker-a", [m.commit_log_offset for m in msgs], [1, 1, -1, 1],
        properties={"CONSUME_FAILURE_STAGE": "s"},
        property_columns={"CONSUME_FAILURE_REASON": ["r0", "", "r2", "r3"]},
    )
    results = consumer.send_back_columns(columns, lambda idx: [msgs[i] for i in idx])
    assert [r.dead_letter for r in results] == [False, False, True, False]
    assert not any(r.fallback for r in results)
    dead = Admin(ep).dead_letter_messages("gc")
    assert [d.body for d in dead] == [b"m2"] and dead[0].properties["CONSUME_FAILURE_REASON"] == "r2"
    assert dead[0].properties["CONSUME_FAILURE_STAGE"] == "s" and dead[0].retry_topic == "cols"
    got: list[MessageExt] = []
    deadline = time.monotonic() + 10
    while len(got) < 3 and time.monotonic() < deadline:
        got = consumer.pull(consumer.retry_queues()[0], 0, 10, suspend_timeout_ms=100).messages
    by_body = {m.body: m.properties for m in got}
    assert [by_body[b][MC_REASON] for b in (b"m0", b"m3")] == ["r0", "r3"]
    assert MC_REASON not in by_body[b"m1"]  # an empty value sets nothing
    assert all(p["CONSUME_FAILURE_STAGE"] == "s" for p in by_body.values())


def _one_consumed(ep: str, topic: str, group: str) -> tuple[PullConsumer, MessageExt]:
    """A topic with one message ``x``, consumed by ``group``."""
    Admin(ep).create_topic(topic, queues=1)
    Producer(ep).send(Message(topic, b"x"))
    consumer = PullConsumer(ep, group)
    return consumer, consumer.pull(consumer.queues(topic)[0], 0, 10).messages[0]


def test_bad_send_back_batches_are_refused_whole_naming_the_field(retry_broker) -> None:
    import grpc
    from pymq_proto.v1 import pymq_pb2, pymq_pb2_grpc

    ep = retry_broker.endpoint
    _consumer, m = _one_consumed(ep, "bad", "gbad")
    stub = pymq_pb2_grpc.BrokerStub(grpc.insecure_channel(ep))

    def refused(**fields: object) -> str:
        req = pymq_pb2.ConsumerSendMsgBackBatchRequest(
            group="gbad", commit_log_offsets=[m.commit_log_offset], **fields)  # type: ignore[arg-type]
        with pytest.raises(grpc.RpcError) as info:
            stub.ConsumerSendMsgBackBatch(req)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        return str(info.value.details())

    assert "delay_levels has 2 values for 1" in refused(delay_levels=[1, 1])
    assert "'DELAY'" in refused(delay_levels=[1], extra_properties={"DELAY": "1"})
    assert "'CONSUME_FAILURE_REASON' value 'a\\x02b'" in refused(
        delay_levels=[1], property_columns=[pymq_pb2.PropertyColumn(name="CONSUME_FAILURE_REASON",
                                                                    values=["a\x02b"])])
    assert "origin_topics has 2 values" in refused(delay_levels=[1], origin_topics=["a", "b"])
    # nothing was stored, and the broker still serves: the classic one-message RPC works
    assert Admin(ep).topic_names(include_system=True).count(retry_topic("gbad")) == 0
    one = stub.ConsumerSendMsgBack(pymq_pb2.ConsumerSendMsgBackRequest(
        group="gbad", commit_log_offset=m.commit_log_offset, delay_level=-1,
        extra_properties={"CONSUME_FAILURE_REASON": "r"}))
    assert one.dead_letter and one.topic == "%DLQ%gbad"
    dead = Admin(ep).dead_letter_messages("gbad")
    assert [d.body for d in dead] == [b"x"] and dead[0].properties["CONSUME_FAILURE_REASON"] == "r"
    with pytest.raises(grpc.RpcError) as info:
        stub.ConsumerSendMsgBack(pymq_pb2.ConsumerSendMsgBackRequest(group="gbad", commit_log_offset=10**12))
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "no message at commit log offset 1000000000000" in str(info.value.details())


def test_reasons_are_cleaned_and_reserved_names_refused(retry_broker) -> None:
    ep = retry_broker.endpoint
    consumer, m = _one_consumed(ep, "why", "gw")
    with pytest.raises(ValueError, match="'REAL_TOPIC' cannot be a reason"):
        consumer.send_back(m, reason={"REAL_TOPIC": "x"})
    result = consumer.send_back(m, delay_level=-1, reason="line\x01with\x02separators")
    assert result.dead_letter and not result.fallback
    dead = Admin(ep).dead_letter_messages("gw")
    assert dead[0].properties["CONSUME_FAILURE_REASON"] == "line\ufffdwith\ufffdseparators"


def test_a_letter_its_topic_may_not_take_yet_stops_the_resend_and_goes_later(retry_broker: Any) -> None:
    """No permission (an ACL, a topic not writable for now) is the caller's to mend: the letter
    was taken as refused for good, committed, and never sent again by a later call."""
    from pyspark_pymq.client.route import PERM_READ, PERM_WRITE
    from pyspark_pymq.errors import NoPermissionError

    ep = retry_broker.endpoint
    admin = Admin(ep)
    admin.create_topic("paused-topic", queues=1)
    consumer = _dead_letters_of(ep, "gperm", ("paused-topic", b"p1"), ("paused-topic", b"p2"))
    admin.create_topic("paused-topic", queues=1, perm=PERM_READ)  # writes refused for now
    with pytest.raises(NoPermissionError):
        admin.resend_dead_letters("gperm")
    admin.create_topic("paused-topic", perm=PERM_READ | PERM_WRITE)  # writable again (unset: kept)
    assert admin.resend_dead_letters("gperm") == 2
    got = [m.body for m in consumer.pull(consumer.queues("paused-topic")[0], 0, 10).messages]
    assert got == [b"p1", b"p2", b"p1", b"p2"]

"""The broker as a process on loopback, through the public client."""

from __future__ import annotations

import struct
import threading
import time
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import grpc
import pytest
from broker_process import BrokerProcess
from pymq_proto.v1 import pymq_pb2, pymq_pb2_grpc
from pyspark_pymq import Admin, Message, MessageQueue, Producer, PullConsumer
from pyspark_pymq.client.message import PullStatus, SendStatus, new_uniq_key
from pyspark_pymq.client.transport import BrokerClient, map_rpc_error
from pyspark_pymq.errors import (
    BrokerUnavailableError,
    IllegalArgumentError,
    MessageIllegalError,
    NoPermissionError,
    PymqError,
    SubscriptionParseError,
    TopicNotExistError,
)


def test_send_pull_commit_round_trip(endpoint: str) -> None:
    Admin(endpoint).create_topic("orders", queues=4)
    with Producer(endpoint) as producer:
        sent = [
            producer.send(Message("orders", f"body-{i}", tags="created", keys=[f"o{i}"],
                                  properties={"region": "eu"}))
            for i in range(20)
        ]
    assert all(r.status == SendStatus.SEND_OK for r in sent)
    assert {r.queue_id for r in sent} == {0, 1, 2, 3}  # round robin
    consumer = PullConsumer(endpoint, "g1")
    got = {}
    for mq in consumer.queues("orders"):
        result = consumer.pull(mq, 0, 100)
        for m in result.messages:
            got[m.msg_id] = m
        consumer.commit(mq, result.next_begin_offset)
        assert consumer.committed(mq) == result.next_begin_offset
    assert set(got) == {r.msg_id for r in sent}
    for r in sent:
        m = got[r.msg_id]
        assert (m.queue_id, m.queue_offset) == (r.queue_id, r.queue_offset)
        assert m.offset_msg_id == r.offset_msg_id
        assert m.tags == "created" and m.user_properties == {"region": "eu"}
        assert m.keys and m.keys[0].startswith("o")
        assert m.topic == "orders" and m.broker_name == "broker-a" and m.store_timestamp > 0
    progress = Admin(endpoint).group_progress("g1")
    assert progress["lag"].sum() == 0 and progress["consumer_offset"].sum() == 20



def test_a_tag_sharing_the_wanted_tags_hash_is_not_read(endpoint: str) -> None:
    # The broker matches tags by hash code, as RocketMQ's does; the client checks the tag
    # itself, as RocketMQ's do. These two tags have the same hash.
    from pymq_proto.record import tag_hash
    from pyspark_pymq.backend import open_backend
    from pyspark_pymq.backend.base import backend_config

    wanted, other = "Tag29685295", "Tag32060020"
    assert tag_hash(wanted.encode()) == tag_hash(other.encode())
    Admin(endpoint).create_topic("tagged", queues=1)
    with Producer(endpoint) as producer:
        for tag in (wanted, other, None, wanted):
            producer.send(Message("tagged", f"{tag}", tags=tag))
    consumer = PullConsumer(endpoint, "g-tags")
    (mq,) = consumer.queues("tagged")
    assert [m.tags for m in consumer.pull(mq, 0, 32, subscription=wanted).messages] == [wanted, wanted]
    assert len(consumer.pull(mq, 0, 32, subscription=f"{other} || x").messages) == 1
    backend = open_backend(backend_config(endpoint, None))
    pulled = backend.pull("g-tags", mq, 0, 32, subscription=wanted)
    for columns in (None, ("body",)):
        rows = backend.decode_arrow(pulled, mq, retry=False, subscription=wanted, columns=columns)
        assert rows.column("body").to_pylist() == [wanted.encode()] * 2


def test_a_pull_says_the_size_of_each_record(tmp_path: Path) -> None:
    # what lets a reader find the records without following them one by one, plain and filtered
    with BrokerProcess(tmp_path / "b", ["--enable-property-filter"]) as broker:
        _check_record_sizes(broker.endpoint)


def _check_record_sizes(endpoint: str) -> None:
    Admin(endpoint).create_topic("sized", queues=1)
    with Producer(endpoint) as producer:
        for i in range(30):
            producer.send(Message("sized", b"x" * (i * 7), tags="even" if i % 2 == 0 else "odd",
                                  properties={"n": str(i)}))
    consumer = PullConsumer(endpoint, "g-sized")
    mq = MessageQueue("sized", "broker-a", 0)
    for kw in ({}, {"subscription": "even"}, {"subscription": "n > 20", "expression_type": "SQL92"}):
        pulled = consumer.pull_raw(mq, 0, 100, **kw)
        sizes = [s for (s,) in struct.iter_unpack("<i", pulled.record_sizes)]
        assert len(sizes) == pulled.message_count > 0, kw
        at = 0
        for size in sizes:  # each record's own TOTALSIZE, back to back
            assert struct.unpack_from("<i", pulled.records, at)[0] == size
            at += size
        assert at == len(pulled.records)
    assert len(consumer.pull_raw(mq, 0, 100, subscription="even").record_sizes) == 15 * 4

def test_batch_lands_in_one_queue_in_order_and_large_lists_split(endpoint: str) -> None:
    Admin(endpoint).create_topic("batch", queues=2)
    with Producer(endpoint) as producer:
        results = producer.send_batch([Message("batch", b"%05d" % i) for i in range(500)])
        assert len(results) == 1
        r = results[0]
        assert len(r.msg_ids) == 500
        big = [Message("batch", bytes(300 * 1024)) for _ in range(30)]  # ~9 MiB: split
        big_results = producer.send_batch(big)
        assert len(big_results) >= 3
    consumer = PullConsumer(endpoint, "g")
    mq = MessageQueue("batch", "broker-a", r.queue_id)
    got = consumer.pull(mq, r.queue_offset, 1000)
    bodies = [m.body for m in got.messages][:500]
    assert bodies == [b"%05d" % i for i in range(500)]


def test_sharding_key_keeps_a_key_on_one_queue(endpoint: str) -> None:
    Admin(endpoint).create_topic("sharded", queues=4)
    with Producer(endpoint) as producer:
        queues: dict[str, set[int]] = {}
        for i in range(40):
            key = f"order-{i % 5}"
            r = producer.send(Message("sharded", f"{key}:{i}", sharding_key=key))
            queues.setdefault(key, set()).add(r.queue_id)
    assert all(len(q) == 1 for q in queues.values())
    consumer = PullConsumer(endpoint, "g")
    for mq in consumer.queues("sharded"):
        seen: dict[str, int] = {}
        for m in consumer.pull(mq, 0, 100).messages:
            key, i = m.body.decode().split(":")
            assert seen.get(key, -1) < int(i)  # per-key order kept
            seen[key] = int(i)


def test_a_producer_keeps_sending_to_its_queues_while_write_queues_are_cut(endpoint: str) -> None:
    """The safe scale-in cuts write queues first: a producer's route lags it by up to 30 s, and
    every send to a cut queue failed meanwhile, not retried (probe helper-92). As RocketMQ's
    msgCheck, a send may name any queue the topic still has."""
    Admin(endpoint).create_topic("scale-in", queues=4)
    with Producer(endpoint) as producer:
        key = next(k for k in (f"k{i}" for i in range(100)) if producer.queue_for_key("scale-in", k) == 3)
        assert producer.send(Message("scale-in", b"before", sharding_key=key)).queue_id == 3
        Admin(endpoint).create_topic("scale-in", write_queues=2)
        assert producer.send(Message("scale-in", b"after", sharding_key=key)).queue_id == 3
    got = PullConsumer(endpoint, "g").pull(MessageQueue("scale-in", "broker-a", 3), 0, 10)
    assert [m.body for m in got.messages] == [b"before", b"after"]
    with Producer(endpoint) as fresh, pytest.raises(
            IllegalArgumentError, match=r"queue id 3 is not a writable queue of topic 'scale-in': its "
                                        r"writable queues are broker-a 0\.\.1"):
        fresh.send_encoded("scale-in", [b"pinned"], [b""], [new_uniq_key()], queue_id=3)


def test_a_batch_goes_to_one_queue_so_it_holds_one_sharding_key(endpoint: str) -> None:
    """A batch of several keys went whole to the first key's queue: the other keys' order
    broke (probe helper-92)."""
    Admin(endpoint).create_topic("batch-keys", queues=4)
    with Producer(endpoint) as producer:
        mixed = [Message("batch-keys", b"a", sharding_key="A"), Message("batch-keys", b"c", sharding_key="C")]
        with pytest.raises(ValueError, match="message 1 has sharding_key 'C', message 0 'A'"):
            producer.send_batch(mixed)
        with pytest.raises(ValueError, match="message 1 has sharding_key 'C', message 0 None"):
            producer.send_batch([Message("batch-keys", b"x"), mixed[1]])
        with pytest.raises(TypeError, match="expected a Message at position 0, got str"):
            producer.send("hello")  # type: ignore[arg-type]
        [same] = producer.send_batch([Message("batch-keys", b"c%d" % i, sharding_key="C") for i in range(3)])
        assert same.queue_id == producer.queue_for_key("batch-keys", "C")


def test_async_sends_can_be_flushed_and_closed_around_their_callbacks(endpoint: str) -> None:
    """flush() in a done callback waited for itself (the callback runs on the thread that
    completes sends); cancel() took back a send already on its way; close() never returned while
    other threads kept sending (probe helper-92)."""
    Admin(endpoint).create_topic("callbacks", queues=2)
    producer = Producer(endpoint, send_mode="async")
    seen: list[tuple[bool, str]] = []  # (on the thread that completes sends, what flush() said)

    def flush_in_callback(_f: Future[Any]) -> None:
        on_answer = threading.current_thread() is not threading.main_thread()  # else: done already
        try:
            producer.flush(5)
            seen.append((on_answer, ""))
        except PymqError as err:
            seen.append((on_answer, str(err)))

    futures = []
    for _ in range(10):  # 2 MiB each: on their way still when their callback is added
        futures.append(producer.send(Message("callbacks", bytes(2 << 20))))
        futures[-1].add_done_callback(flush_in_callback)
    assert futures[-1].cancel() is False  # on its way: it is sent whatever the caller does
    assert all(f.result(10).msg_id for f in futures)
    assert len(seen) == 10 and any(on_answer for on_answer, _ in seen)
    for on_answer, said in seen:
        assert ("called from an async send's callback" in said) == on_answer

    sent, refused = [], threading.Event()

    def keep_sending() -> None:
        while True:
            try:
                sent.append(producer.send(Message("callbacks", b"more")))
            except PymqError as err:
                assert "closed" in str(err)
                refused.set()
                return

    sender = threading.Thread(target=keep_sending)
    sender.start()
    time.sleep(0.3)
    began = time.monotonic()
    producer.close()
    assert time.monotonic() - began < 10
    sender.join(10)
    assert refused.is_set() and all(f.done() for f in sent)

    # a close() from a callback refuses new sends only; a later close() still waits for those
    # in flight (it returned at once: the process could exit with sends unanswered, review helper-94)
    again = Producer(endpoint, send_mode="async")
    first = again.send(Message("callbacks", bytes(3 << 20)))
    in_flight = [again.send(Message("callbacks", bytes(3 << 20))) for _ in range(3)]
    first.add_done_callback(lambda _f: again.close())
    first.result(10)
    again.close()
    assert all(f.done() for f in in_flight)


def test_a_message_with_a_delivery_time_arrives_then_and_not_before(endpoint: str) -> None:
    """RocketMQ 5's Message.setDeliverTimeMs: the client refused TIMER_DELIVER_MS as a property the
    broker sets, and had no field for it (probe helper-93)."""
    Admin(endpoint).create_topic("timed-client", queues=1)
    mq = MessageQueue("timed-client", "broker-a", 0)
    consumer = PullConsumer(endpoint, "g")
    with Producer(endpoint) as producer:
        at = int(time.time() * 1000) + 1500
        producer.send(Message("timed-client", b"later", deliver_time_ms=at))
        producer.send(Message("timed-client", b"now"))
        assert [m.body for m in consumer.pull(mq, 0, 10).messages] == [b"now"]
        while time.time() * 1000 < at + 3000 and len(consumer.pull(mq, 0, 10).messages) < 2:
            time.sleep(0.05)
        arrived = time.time() * 1000
        assert [m.body for m in consumer.pull(mq, 0, 10).messages] == [b"now", b"later"]
        assert at <= arrived  # never early (how late is the machine's business: the loop waits 3 s)
        with pytest.raises(ValueError, match=r"message 1 has deliver_time_ms=\d+; send it alone"):
            producer.send_batch([Message("timed-client", b"a"),
                                 Message("timed-client", b"b", deliver_time_ms=at)])
        with pytest.raises(ValueError, match="delay_level or deliver_time_ms, not both"):
            Message("timed-client", b"x", delay_level=2, deliver_time_ms=at)
        with pytest.raises(ValueError, match=r"'TIMER_DELIVER_MS' is reserved .* use "
                                             r"Message\(deliver_time_ms"):
            producer.send(Message("timed-client", b"x", properties={"TIMER_DELIVER_MS": str(at)}))
        ahead = int(time.time() * 1000) + 60_000
        with pytest.raises(MessageIllegalError, match="message 1 of the batch has a delivery time ahead"):
            producer.send_encoded("timed-client", [b"a", b"b"], [b"", b"TIMER_DELIVER_MS\x01%d\x02" % ahead],
                                  [new_uniq_key(), new_uniq_key()])
        # a time past is delivered now, as the store does with one message (review helper-94)
        assert producer.send_encoded("timed-client", [b"c", b"d"], [b"", b"TIMER_DELIVER_MS\x01%d\x02" % at],
                                     [new_uniq_key(), new_uniq_key()])[0].status is SendStatus.SEND_OK


def test_async_and_oneway_modes(endpoint: str) -> None:
    Admin(endpoint).create_topic("modes", queues=2)
    with Producer(endpoint, send_mode="async", max_in_flight=8) as producer:
        futures: list[Future] = [producer.send(Message("modes", b"a%d" % i)) for i in range(50)]
        results = [f.result(10) for f in futures]
    assert len({r.msg_id for r in results}) == 50
    with Producer(endpoint, send_mode="oneway") as producer:
        for i in range(10):
            assert producer.send(Message("modes", b"o%d" % i)) is None
    consumer = PullConsumer(endpoint, "g")
    total = sum(len(consumer.pull(mq, 0, 1000).messages) for mq in consumer.queues("modes"))
    assert total == 60


def test_async_send_reports_failure_on_its_future(endpoint: str) -> None:
    with Producer(endpoint, send_mode="async") as producer:
        fut = producer.send(Message("missing-topic", b"x"))
        with pytest.raises(TopicNotExistError):
            fut.result(10)


def test_long_polling_answers_when_a_message_arrives(endpoint: str) -> None:
    Admin(endpoint).create_topic("lp", queues=1)
    consumer = PullConsumer(endpoint, "g")
    mq = consumer.queues("lp")[0]
    timer = threading.Timer(0.5, lambda: Producer(endpoint).send(Message("lp", b"wake")))
    timer.start()
    t0 = time.monotonic()
    result = consumer.pull(mq, 0, 10, suspend_timeout_ms=10_000)
    waited = time.monotonic() - t0
    assert result.status == PullStatus.FOUND and result.messages[0].body == b"wake"
    assert waited < 9  # answered by the arrival, not by the suspend timeout
    empty = consumer.pull(mq, 1, 10, suspend_timeout_ms=200)
    assert empty.status == PullStatus.NO_NEW_MSG and empty.next_begin_offset == 1


def test_offsets_min_max_and_search_by_timestamp(endpoint: str) -> None:
    Admin(endpoint).create_topic("ts", queues=1)
    producer = Producer(endpoint)
    consumer = PullConsumer(endpoint, "g")
    mq = consumer.queues("ts")[0]
    for i in range(3):
        producer.send(Message("ts", b"early%d" % i))
    time.sleep(0.05)
    middle = int(time.time() * 1000)
    time.sleep(0.05)
    for i in range(2):
        producer.send(Message("ts", b"late%d" % i))
    assert consumer.min_offset(mq) == 0 and consumer.max_offset(mq) == 5
    assert consumer.search_offset(mq, middle) == 3
    assert consumer.search_offset(mq, 0) == 0
    assert consumer.search_offset(mq, middle + 10**9) == 5
    assert consumer.committed(mq) == -1


def test_bad_input_gets_clear_errors_and_the_broker_keeps_serving(endpoint: str) -> None:
    admin = Admin(endpoint)
    admin.create_topic("ok", queues=2)
    producer = Producer(endpoint, retry_times_when_send_failed=0)
    consumer = PullConsumer(endpoint, "g")
    with pytest.raises(TopicNotExistError, match="'nope'"):
        producer.send(Message("nope", b"x"))
    with pytest.raises(IllegalArgumentError, match="characters outside"):
        admin.create_topic("bad name!")
    with pytest.raises(IllegalArgumentError, match="127"):
        admin.create_topic("x" * 200)
    with pytest.raises(NoPermissionError, match="reserved"):
        admin.create_topic("%RETRY%mine")
    with pytest.raises(NoPermissionError):
        admin.create_topic("SCHEDULE_TOPIC_XXXX")
    big = bytes(4 * 1024 * 1024 + 1)
    with pytest.raises(MessageIllegalError, match=r"\] message body of 4194305 bytes is over maxMessageSize"):
        producer.send(Message("ok", big))
    with pytest.raises(MessageIllegalError, match=r"\] message 1 of the batch: its body of 4194305 bytes "
                                                  r"is over maxMessageSize 4194304 \(topic 'ok'\)"):
        producer.send_batch([Message("ok", b"a"), Message("ok", big), Message("ok", b"c")])
    with pytest.raises(ValueError, match="cannot be delayed"):
        producer.send_batch([Message("ok", b"a"), Message("ok", b"b", delay_level=2)])
    with pytest.raises(IllegalArgumentError, match="queue id 7 is out of range"):
        consumer.pull(MessageQueue("ok", "broker-a", 7), 0)
    with pytest.raises(SubscriptionParseError, match="empty tag"):
        consumer.pull(MessageQueue("ok", "broker-a", 0), 0, subscription="A || ")
    # raw gRPC with out-of-range fields: the broker answers with an error, not a crash
    stub = pymq_pb2_grpc.BrokerStub(grpc.insecure_channel(endpoint))
    with pytest.raises(grpc.RpcError) as info:
        stub.UpdateOffset(pymq_pb2.UpdateOffsetRequest(consumer_group="g", offsets=[pymq_pb2.QueueOffset(
            message_queue=pymq_pb2.MessageQueue(topic="ok", queue_id=0), offset=-1)]))
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "must be >= 0" in str(info.value.details())
    with pytest.raises(grpc.RpcError) as info:
        stub.PullMessage(pymq_pb2.PullMessageRequest(
            message_queue=pymq_pb2.MessageQueue(topic="ok", queue_id=0), queue_offset=-5,
            max_msg_nums=1))
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    with pytest.raises(grpc.RpcError) as info:
        stub.SendMessage(pymq_pb2.SendMessageRequest(topic="ok", queue_id=0))
    assert "no message" in (info.value.details() or "")
    with pytest.raises(grpc.RpcError):  # bytes that are not a request at all
        grpc.insecure_channel(endpoint).unary_unary("/pymq_proto.v1.Broker/SendMessage")(b"\xff\xff\xff")
    # ...and it still serves
    assert producer.send(Message("ok", b"still alive")).status == SendStatus.SEND_OK
    assert sum(admin.topic_stats("ok")["messages"]) == 1


def test_max_message_size_is_a_broker_flag_and_the_errors_say_where_to_raise_it(tmp_path: Path) -> None:
    """"over maxMessageSize 4194304" named no way to raise it, and pymq-broker had no flag for it."""
    with BrokerProcess(tmp_path / "b", ["--max-message-size", "1024"]) as broker:
        Admin(broker.endpoint).create_topic("sized", queues=1)
        with Producer(broker.endpoint, max_message_size=4096) as producer:
            producer.send(Message("sized", bytes(1024)))
            refused = (r"body of 1025 bytes is over maxMessageSize 1024 \(topic 'sized'; the broker's "
                       r"--max-message-size")
            with pytest.raises(MessageIllegalError, match=refused):
                producer.send(Message("sized", bytes(1025)))  # the broker refuses it
        before = (r"over maxMessageSize 512 \(topic 'sized'\); a larger message needs a larger "
                  r"max_message_size here \(the Spark sink's option maxMessageSize\) and on the broker "
                  r"\(pymq-broker --max-message-size")
        with Producer(broker.endpoint, max_message_size=512) as producer, pytest.raises(
                MessageIllegalError, match=before):
            producer.send(Message("sized", bytes(1024)))  # refused before it is sent
    with pytest.raises(RuntimeError, match="maxMessageSize must be at least 1 byte, got 0"):
        BrokerProcess(tmp_path / "c", ["--max-message-size", "0"], startup_timeout=20).start()


def test_unreachable_broker_names_the_endpoint() -> None:
    producer = Producer("127.0.0.1:1", send_msg_timeout_ms=2000, retry_times_when_send_failed=0)
    with pytest.raises(BrokerUnavailableError, match=r"127\.0\.0\.1:1"):
        producer.send(Message("t", b"x"))
    with pytest.raises(ValueError, match="host:port"):
        PullConsumer("localhost", "g")


def test_auto_create_topic_and_admin_tables(tmp_path) -> None:
    with BrokerProcess(tmp_path / "b", ["--auto-create-topic-enable"]) as broker:
        admin = Admin(broker.endpoint)
        r = Producer(broker.endpoint).send(Message("fresh", b"x"))
        assert r.status == SendStatus.SEND_OK
        topics = admin.topics()
        row = topics[topics["topic"] == "fresh"].iloc[0]
        assert row["read_queues"] == 4 and row["messages"] == 1
        stats = admin.topic_stats("fresh")
        assert list(stats["queue_id"]) == [0, 1, 2, 3] and stats["messages"].sum() == 1
        # the store time as a UTC time a notebook shows as one (not ms since the epoch); none where
        # nothing is stored
        stored = row["last_store_timestamp"]
        stored_ms = admin.view_message(r.offset_msg_id).store_timestamp
        assert str(stored.tz) == "UTC" and stored.value // 1_000_000 == stored_ms  # (ns)
        assert list(stats["last_store_timestamp"].isna()) == list(stats["messages"] == 0)
        found = admin.view_message(r.offset_msg_id)
        assert found.body == b"x" and found.msg_id == r.msg_id
        assert admin.view_message(r.msg_id, topic="fresh").commit_log_offset == found.commit_log_offset
        admin.delete_topic("fresh")
        assert "fresh" not in admin.topic_names()
        with pytest.raises(PymqError):
            admin.topic_stats("fresh")


def test_a_topic_keeps_its_id_until_it_is_created_again(tmp_path: Path) -> None:
    """The id a stream's checkpoint keeps to tell a re-created topic from the one it read."""
    broker = BrokerProcess(tmp_path / "b").start()
    try:
        admin = Admin(broker.endpoint)
        first = admin.create_topic("kept", queues=2).topic_id
        assert first > 0
        assert admin.create_topic("kept", queues=4, update_if_exists=True).topic_id == first
        other = admin.create_topic("other", queues=1).topic_id
        assert other not in (0, first)
        # the broker's own topics have none: it makes them again itself (a %RETRY% topic's config
        # lost in a crash while its messages are on disk is not a new topic)
        PullConsumer(broker.endpoint, "gid").register("kept")
        assert admin.topic_config("%RETRY%gid").topic_id == 0
        assert broker.stop() == 0
        broker.start()
        admin = Admin(broker.endpoint)
        assert admin.topic_config("kept").topic_id == first  # stored with the topic
        client = BrokerClient(broker.endpoint)
        assert client.topic_stats(pymq_pb2.TopicStatsRequest(topic="kept")).topic_id == first
        admin.delete_topic("kept")
        again = admin.create_topic("kept", queues=2).topic_id
        assert again not in (0, first)
        assert client.topic_stats(pymq_pb2.TopicStatsRequest(topic="kept")).topic_id == again
    finally:
        broker.stop()


def test_state_survives_a_clean_restart(tmp_path) -> None:
    broker = BrokerProcess(tmp_path / "b").start()
    try:
        admin = Admin(broker.endpoint)
        admin.create_topic("keep", queues=2)
        sent = Producer(broker.endpoint).send_batch([Message("keep", b"%d" % i) for i in range(10)])[0]
        consumer = PullConsumer(broker.endpoint, "g")
        consumer.commit(sent.message_queue, 4)
        assert broker.stop() == 0
        broker.start()
        consumer = PullConsumer(broker.endpoint, "g")
        mq = MessageQueue("keep", "broker-a", sent.queue_id)
        assert consumer.committed(mq) == 4
        assert [m.body for m in consumer.pull(mq, 0, 100).messages] == [b"%d" % i for i in range(10)]
        assert Admin(broker.endpoint).topic_config("keep").read_queue_nums == 2
    finally:
        broker.stop()


def _raw_send(
    stub: pymq_pb2_grpc.BrokerStub, topic: str, *messages: pymq_pb2.MessageData
) -> pymq_pb2.SendMessageResponse:
    return stub.SendMessage(pymq_pb2.SendMessageRequest(
        topic=topic, queue_id=0, born_timestamp=int(time.time() * 1000), messages=list(messages),
        batch=len(messages) > 1))


def _raw_message(body: bytes, **props: str) -> pymq_pb2.MessageData:
    from pymq_proto.record import encode_properties

    return pymq_pb2.MessageData(body=body, properties=encode_properties(props))


@pytest.mark.parametrize("refused", ["a delayed message in the batch", "properties over 65535 bytes"])
def test_a_refused_send_leaves_no_key_in_the_dedup_window(endpoint: str, refused: str) -> None:
    """Its corrected retry (same UNIQ_KEY) was answered SEND_OK as a duplicate and never stored."""
    Admin(endpoint).create_topic("dd", queues=1, dedup_window_ms=60_000)
    stub = pymq_pb2_grpc.BrokerStub(grpc.insecure_channel(endpoint))
    if refused.startswith("a delayed"):
        bad = [_raw_message(b"a", UNIQ_KEY="A"), _raw_message(b"b", UNIQ_KEY="B", DELAY="3")]
    else:
        bad = [_raw_message(b"a", UNIQ_KEY="A", X="v" * 70_000)]
    with pytest.raises(grpc.RpcError) as refusal:
        _raw_send(stub, "dd", *bad)
    error = map_rpc_error(refusal.value, endpoint, "SendMessage")
    assert isinstance(error, MessageIllegalError)
    assert "delay level" in str(error) or "over the limit of 32767" in str(error)
    again = _raw_send(stub, "dd", _raw_message(b"a", UNIQ_KEY="A"))
    assert (again.duplicates_dropped, again.queue_offset) == (0, 0)
    got = PullConsumer(endpoint, "g").pull(MessageQueue("dd", "", 0), 0, 10)
    assert [m.body for m in got.messages] == [b"a"]


def test_a_group_with_consumption_disabled_cannot_pull(endpoint: str) -> None:
    admin = Admin(endpoint)
    admin.create_topic("ce", queues=1)
    Producer(endpoint).send(Message("ce", b"x"))
    assert admin.update_group("paused", consume_enable=False).consume_enable is False
    consumer = PullConsumer(endpoint, "paused")
    with pytest.raises(NoPermissionError, match="'paused' has consumption disabled"):
        consumer.pull(MessageQueue("ce", "", 0), 0, 10)
    assert admin.update_group("paused", consume_enable=True).consume_enable is True
    assert len(consumer.pull(MessageQueue("ce", "", 0), 0, 10).messages) == 1
    from pyspark_pymq.admin_cli import main as admin_main

    assert admin_main(["-e", endpoint, "update-group", "paused", "--no-consume-enable"]) == 0
    assert admin.group_config("paused").consume_enable is False


def test_a_long_poll_at_an_offset_the_queue_cannot_reach_is_answered_at_once(endpoint: str) -> None:
    """RocketMQ answers PULL_OFFSET_MOVED at once; the pull was held for its whole suspend time."""
    Admin(endpoint).create_topic("lp", queues=1)
    stub = pymq_pb2_grpc.BrokerStub(grpc.insecure_channel(endpoint))
    started = time.monotonic()
    resp = stub.PullMessage(pymq_pb2.PullMessageRequest(  # offset 5 of a queue never written to
        consumer_group="g", message_queue=pymq_pb2.MessageQueue(topic="lp", queue_id=0),
        queue_offset=5, max_msg_nums=10, suspend_timeout_ms=5_000))
    assert resp.status == pymq_pb2.OFFSET_ILLEGAL
    assert time.monotonic() - started < 2.0


def test_a_missing_dlq_topic_says_the_group_has_no_dead_letters_yet(endpoint: str) -> None:
    with pytest.raises(TopicNotExistError) as info:
        Admin(endpoint).topic_stats("%DLQ%fresh")
    assert "group 'fresh' has no dead letters yet" in str(info.value)
    assert "create it first" not in str(info.value)

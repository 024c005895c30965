"""apache.rocketmq.v2 on the embedded broker, judged by RocketMQ 5's official Python client.

``rocketmq-python-client`` (PyPI, pinned in setup.cfg's dev extra) talks to a
real broker process; pymq's own clients read and write the same topics, so a
message reads the same whichever way it came. Status codes are checked with
the v2 gRPC stub where the official client would refuse the bad input itself.
"""

from __future__ import annotations

import contextlib
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar, cast

import grpc
import pytest
from broker_process import BrokerProcess
from pymq_proto.rocketmq_v2 import definition_pb2 as v2
from pymq_proto.rocketmq_v2 import service_pb2 as sv
from pymq_proto.rocketmq_v2 import service_pb2_grpc
from pymq_proto.v1 import pymq_pb2, pymq_pb2_grpc
from pyspark_pymq.client import Admin, Producer, PullConsumer
from pyspark_pymq.client import Message as PymqMessage
from rocketmq import (
    ClientConfiguration,
    ConsumeResult,
    Credentials,
    FilterExpression,
    Message,
    MessageListener,
    PushConsumer,
    SimpleConsumer,
    TransactionChecker,
    TransactionResolution,
)
from rocketmq import Producer as V2Producer
from rocketmq.v5.exception import BadRequestException

T = TypeVar("T")
# Delay levels of a few seconds, so that delivery timestamps are honoured within a test.
DELAY_LEVELS = "500ms 1s 2s 3s 5s"


@pytest.fixture(scope="module")
def v2_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    """One broker for the module: 1 s minimum invisible time, short delays, quick check-backs."""
    data = tmp_path_factory.mktemp("v2-broker")
    args = ["--min-invisible-time-mills-for-recv", "1000", "--message-delay-level", DELAY_LEVELS,
            "--transaction-timeout", "500", "--transaction-check-interval", "1000"]
    with BrokerProcess(data, extra_args=args) as proc:
        yield proc


def _name(prefix: str) -> str:
    return f"{prefix}{uuid.uuid4().hex[:8]}"


def _topic(endpoint: str, queues: int = 2, message_type: str = "MIXED") -> str:
    """A new topic; MIXED, as these tests send every message type to one (a topic created without
    a type is NORMAL and refuses the others: tests/test_v2_message_types.py)."""
    topic = _name("v2T")
    Admin(endpoint).create_topic(topic, queues, message_type=message_type)
    return topic


def _config(endpoint: str) -> ClientConfiguration:
    # receives poll at least 5 s (RocketMQ's minimum): the call's deadline must leave that
    return ClientConfiguration(endpoint, Credentials(), request_timeout=5)


def _message(topic: str, body: bytes, **fields: Any) -> Message:
    m = Message()
    m.topic = topic
    m.body = body
    for key, value in fields.items():
        if key == "properties":
            for k, v in value.items():
                m.add_property(k, v)
        else:
            setattr(m, key, value)
    return m


def _until(fn: Callable[[], T | None], timeout: float = 20.0, what: str = "condition") -> T:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = fn()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


class _Clients:
    """Official clients started for a test and shut down after it."""

    def __init__(self) -> None:
        self.started: list[Any] = []

    def start(self, make: Callable[[], Any]) -> Any:
        """``make()`` started. rocketmq-python-client 5.1.2 races at start-up: its first route query
        may write to the telemetry stream before the stream is registered ("'NoneType' object has no
        attribute 'stream_write'"), and startup() then fails waiting for the settings that never
        went out (seen once in a loaded CI run). A client instance cannot start twice: a new one."""
        for attempt in (1, 2):
            client = make()
            try:
                client.startup()
            except Exception as err:
                # a PushConsumer's clean-up after it fails too: the cause is then the context
                if attempt == 2 or "initial settings" not in f"{err} {err.__context__}":
                    raise
                with contextlib.suppress(Exception):
                    client.shutdown()
                continue
            self.started.append(client)
            return client
        raise AssertionError("unreachable")

    def producer(self, endpoint: str, *topics: str, checker: TransactionChecker | None = None) -> V2Producer:
        return cast(V2Producer, self.start(lambda: V2Producer(_config(endpoint), topics, checker)))

    def consumer(self, endpoint: str, group: str, topic: str, expression: str = "*",
                 await_s: int = 2) -> SimpleConsumer:
        return cast(SimpleConsumer, self.start(lambda: SimpleConsumer(
            _config(endpoint), group, {topic: FilterExpression(expression)}, await_duration=await_s)))

    def close(self) -> None:
        for client in reversed(self.started):
            client.shutdown()


@pytest.fixture
def clients() -> Iterator[_Clients]:
    c = _Clients()
    yield c
    c.close()


def _receive(consumer: SimpleConsumer, n: int, invisible_s: int = 30, timeout: float = 20.0) -> list[Any]:
    """At least ``n`` messages, over as many receives as it takes."""
    got: list[Any] = []
    deadline = time.monotonic() + timeout
    while len(got) < n and time.monotonic() < deadline:
        got.extend(consumer.receive(16, invisible_s))
    assert len(got) >= n, f"received {len(got)} of {n} messages"
    return got


def _pymq_read(endpoint: str, topic: str, n: int) -> list[Any]:
    consumer = PullConsumer(endpoint, _name("pymqG"))
    out: list[Any] = []
    deadline = time.monotonic() + 20
    while len(out) < n and time.monotonic() < deadline:
        out = []
        for mq in consumer.queues(topic):
            out.extend(consumer.pull(mq, 0, 100).messages)
        if len(out) < n:
            time.sleep(0.1)
    assert len(out) == n, f"pymq read {len(out)} messages of {topic}, expected {n}"
    return out


def test_send_receive_ack_with_official_client(v2_broker: BrokerProcess, clients: _Clients) -> None:
    endpoint = v2_broker.endpoint
    topic, group = _topic(endpoint), _name("v2G")
    producer = clients.producer(endpoint, topic)
    ids = []
    for i in range(5):
        receipt = producer.send(_message(topic, f"m{i}".encode(), tag="TagA", keys=f"k{i}",
                                         properties={"n": str(i)}))
        ids.append(receipt.message_id)
    consumer = clients.consumer(endpoint, group, topic)
    got = _receive(consumer, 5)
    assert sorted(m.body for m in got) == [f"m{i}".encode() for i in range(5)]
    for m in got:
        assert m.tag == "TagA"
        assert m.keys == {f"k{m.properties['n']}"}
        assert m.properties == {"n": m.body.decode()[1:]}
        assert m.delivery_attempt == 1
        assert m.topic == topic
        consumer.ack(m)
    assert sorted(m.message_id for m in got) == sorted(ids)
    assert consumer.receive(16, 30) == []  # all acked: MESSAGE_NOT_FOUND after the long poll
    # the acks are the group's progress, as pymq's offsets show it
    progress = Admin(endpoint).group_progress(group, topic)
    assert int(progress["consumer_offset"].sum()) == 5


def test_sends_are_spread_over_the_topics_queues(v2_broker: BrokerProcess, clients: _Clients) -> None:
    """rocketmq-python-client never sets a message's queue id, and the proxy does not read it: it
    picks the next writable queue (SendMessageQueueSelector). Its default 0 put every message in
    queue 0, so a topic's other queues, and the Spark source's partitions of them, stayed empty."""
    endpoint = v2_broker.endpoint
    topic = _topic(endpoint, 4)
    producer = clients.producer(endpoint, topic)
    for i in range(8):
        producer.send(_message(topic, f"s{i}".encode()))
    stored = _pymq_read(endpoint, topic, 8)
    assert {m.queue_id for m in stored} == {0, 1, 2, 3}  # round robin (the broker's, shared by topics)


def test_tag_filter(v2_broker: BrokerProcess, clients: _Clients) -> None:
    endpoint = v2_broker.endpoint
    topic, group = _topic(endpoint), _name("v2G")
    producer = clients.producer(endpoint, topic)
    for tag in ("A", "B", "C", "A"):
        producer.send(_message(topic, tag.encode(), tag=tag))
    consumer = clients.consumer(endpoint, group, topic, "A || C")
    got = _receive(consumer, 3)
    assert sorted(m.body for m in got) == [b"A", b"A", b"C"]
    for m in got:
        consumer.ack(m)
    assert consumer.receive(16, 30) == []


def test_unacked_message_comes_back_with_higher_delivery_attempt(
    v2_broker: BrokerProcess, clients: _Clients
) -> None:
    endpoint = v2_broker.endpoint
    topic, group = _topic(endpoint, 1), _name("v2G")
    clients.producer(endpoint, topic).send(_message(topic, b"again"))
    consumer = clients.consumer(endpoint, group, topic)
    first = _receive(consumer, 1, invisible_s=1)[0]
    assert first.delivery_attempt == 1
    second = _until(lambda: consumer.receive(16, 30), what="the redelivery")[0]
    assert (second.body, second.message_id, second.delivery_attempt) == (b"again", first.message_id, 2)
    with pytest.raises(BadRequestException) as err:  # the first handle expired with its invisible time
        consumer.ack(first)
    assert err.value.code == v2.INVALID_RECEIPT_HANDLE
    consumer.ack(second)
    assert consumer.receive(16, 30) == []


def test_change_invisible_duration(v2_broker: BrokerProcess, clients: _Clients) -> None:
    endpoint = v2_broker.endpoint
    topic, group = _topic(endpoint, 1), _name("v2G")
    clients.producer(endpoint, topic).send(_message(topic, b"slow"))
    consumer = clients.consumer(endpoint, group, topic)
    m = _receive(consumer, 1, invisible_s=1)[0]
    old_handle = m.receipt_handle
    consumer.change_invisible_duration(m, 30)
    assert m.receipt_handle != old_handle
    time.sleep(1.5)
    assert consumer.receive(16, 30) == []  # the 1 s it had would have passed: still invisible
    consumer.ack(m)


def test_change_invisible_duration_takes_0_up_to_the_maximum(
        v2_broker: BrokerProcess, clients: _Clients) -> None:
    """RocketMQ 5.3.3's ChangeInvisibleDurationActivity checks 0 <= t <= maxInvisibleTimeMills: the
    receive's minimum (here 1 s) is not its (a push consumer's nack asks for its retry delay)."""
    endpoint = v2_broker.endpoint
    topic, group = _topic(endpoint, 1), _name("v2G")
    clients.producer(endpoint, topic).send(_message(topic, b"nack"))
    consumer = clients.consumer(endpoint, group, topic)
    m = _receive(consumer, 1)[0]
    stub = service_pb2_grpc.MessagingServiceStub(grpc.insecure_channel(endpoint))

    def change(handle: str, ms: int) -> Any:
        req = sv.ChangeInvisibleDurationRequest(group=v2.Resource(name=group), topic=v2.Resource(name=topic),
                                                receipt_handle=handle, message_id=m.message_id)
        req.invisible_duration.FromMilliseconds(ms)
        return stub.ChangeInvisibleDuration(req, timeout=10)

    too_long = change(m.receipt_handle, 12 * 3600 * 1000 + 1)
    assert too_long.status.code == v2.ILLEGAL_INVISIBLE_TIME
    short = change(m.receipt_handle, 500)  # under the receive's minimum
    assert short.status.code == v2.OK, short.status.message
    now = change(short.receipt_handle, 0)
    assert now.status.code == v2.OK, now.status.message
    again = _receive(consumer, 1, timeout=5)[0]  # due at once
    assert (again.body, again.delivery_attempt) == (b"nack", 2)
    consumer.ack(again)


def test_dead_letter_after_max_delivery_attempts(v2_broker: BrokerProcess, clients: _Clients) -> None:
    endpoint = v2_broker.endpoint
    topic, group = _topic(endpoint, 1), _name("v2G")
    _set_retry_max_times(endpoint, group, 1)  # two delivery attempts
    clients.producer(endpoint, topic).send(_message(topic, b"poison", tag="P"))
    consumer = clients.consumer(endpoint, group, topic)
    attempts = [m.delivery_attempt for m in _receive(consumer, 1, invisible_s=1)]
    attempts += [m.delivery_attempt for m in _until(lambda: consumer.receive(16, 1), what="attempt 2")]
    assert attempts == [1, 2]
    time.sleep(1.2)
    assert consumer.receive(16, 1) == []  # dead-lettered, not delivered a third time
    dead = _until(lambda: Admin(endpoint).dead_letter_messages(group), what="the dead letter")
    assert [(d.body, d.tags, d.properties.get("DLQ_ORIGIN_TOPIC")) for d in dead] == [(b"poison", "P", topic)]


def test_v2_message_reads_the_same_in_pymq(v2_broker: BrokerProcess, clients: _Clients) -> None:
    endpoint = v2_broker.endpoint
    topic = _topic(endpoint)
    receipt = clients.producer(endpoint, topic).send(
        _message(topic, b"from-v2", tag="T1", keys="a", properties={"color": "red", "size": "L"})
    )
    [m] = _pymq_read(endpoint, topic, 1)
    assert (m.topic, m.body, m.tags, m.keys, m.user_properties) == (
        topic, b"from-v2", "T1", ("a",), {"color": "red", "size": "L"}
    )
    assert m.msg_id == receipt.message_id


def test_pymq_message_reads_the_same_in_v2(v2_broker: BrokerProcess, clients: _Clients) -> None:
    endpoint = v2_broker.endpoint
    topic, group = _topic(endpoint), _name("v2G")
    consumer = clients.consumer(endpoint, group, topic)
    result = Producer(endpoint).send(PymqMessage(topic, b"from-pymq", tags="T2", keys=["x", "y"],
                                                 properties={"color": "blue"}))
    [m] = _receive(consumer, 1)
    assert (m.topic, m.body, m.tag, m.keys, m.properties) == (
        topic, b"from-pymq", "T2", {"x", "y"}, {"color": "blue"}
    )
    assert m.message_id == result.msg_id
    consumer.ack(m)


def test_fifo_message_group_is_the_sharding_key(v2_broker: BrokerProcess, clients: _Clients) -> None:
    endpoint = v2_broker.endpoint
    topic, group = _topic(endpoint, 4), _name("v2G")
    producer = clients.producer(endpoint, topic)
    for i in range(6):
        producer.send(_message(topic, f"o{i}".encode(), message_group="order-7"))
    stored = _pymq_read(endpoint, topic, 6)
    assert {m.queue_id for m in stored} == {stored[0].queue_id}  # one group, one queue, in order
    in_order = sorted(stored, key=lambda m: m.queue_offset)
    assert [m.body for m in in_order] == [f"o{i}".encode() for i in range(6)]
    assert {m.properties["__SHARDINGKEY"] for m in stored} == {"order-7"}
    consumer = clients.consumer(endpoint, group, topic)
    got = _receive(consumer, 6)
    assert {m.message_group for m in got} == {"order-7"}
    for m in got:
        consumer.ack(m)


def test_delay_by_delivery_timestamp(v2_broker: BrokerProcess, clients: _Clients) -> None:
    endpoint = v2_broker.endpoint
    topic, group = _topic(endpoint, 1), _name("v2G")
    consumer = clients.consumer(endpoint, group, topic, await_s=1)
    # rocketmq-python-client 5.1.2 puts Message.delivery_timestamp into the Timestamp's seconds (its
    # docstring says ms): seconds are what reaches the broker as the intended time
    deliver_at_s = int(time.time()) + 2
    clients.producer(endpoint, topic).send(_message(topic, b"later", delivery_timestamp=deliver_at_s))
    got = _until(lambda: consumer.receive(16, 30), what="the delayed message")
    arrived = time.time()
    assert [m.body for m in got] == [b"later"]
    assert arrived >= deliver_at_s  # the delay level rounds up: never early
    assert got[0].delivery_timestamp == deliver_at_s * 1000
    consumer.ack(got[0])


class _Listener(MessageListener):
    """Fails every message of the body ``fail``; records each delivery attempt."""

    def __init__(self) -> None:
        self.seen: list[tuple[bytes, int]] = []

    def consume(self, message: Any) -> ConsumeResult:
        self.seen.append((message.body, message.delivery_attempt))
        return ConsumeResult.FAILURE if message.body == b"fail" else ConsumeResult.SUCCESS


def test_push_consumer_acks_and_dead_letters_a_failing_message(
    v2_broker: BrokerProcess, clients: _Clients
) -> None:
    endpoint = v2_broker.endpoint
    topic, group = _topic(endpoint, 2), _name("v2G")
    _set_retry_max_times(endpoint, group, 2)  # three delivery attempts, retried after 2 s and 3 s
    listener = _Listener()
    clients.start(lambda: PushConsumer(_config(endpoint), group, listener, {topic: FilterExpression("*")},
                                       consumption_thread_count=2))
    producer = clients.producer(endpoint, topic)
    producer.send(_message(topic, b"ok"))
    producer.send(_message(topic, b"fail"))
    dead = _until(lambda: Admin(endpoint).dead_letter_messages(group), timeout=30, what="the dead letter")
    assert [d.body for d in dead] == [b"fail"]
    assert sorted(a for body, a in listener.seen if body == b"fail") == [1, 2, 3]
    assert [a for body, a in listener.seen if body == b"ok"] == [1]
    progress = Admin(endpoint).group_progress(group, topic)
    assert int(progress["consumer_offset"].sum()) == 2  # both consumed: one acked, one dead-lettered


def _set_retry_max_times(endpoint: str, group: str, times: int) -> None:
    with grpc.insecure_channel(endpoint) as channel:
        config = pymq_pb2.SubscriptionGroupConfig(
            group_name=group, retry_max_times=times, retry_queue_nums=1,
            consume_from_where="CONSUME_FROM_LAST_OFFSET", consume_enable=True,
        )
        pymq_pb2_grpc.BrokerStub(channel).UpdateSubscriptionGroup(
            pymq_pb2.UpdateSubscriptionGroupRequest(config=config)
        )


class _Checker(TransactionChecker):
    def __init__(self) -> None:
        self.checked: list[str] = []

    def check(self, message: Any) -> TransactionResolution:
        self.checked.append(message.message_id)
        return TransactionResolution.COMMIT


def test_transactions_commit_rollback_and_check_back(v2_broker: BrokerProcess, clients: _Clients) -> None:
    endpoint = v2_broker.endpoint
    topic = _topic(endpoint, 1)
    checker = _Checker()
    producer = clients.producer(endpoint, topic, checker=checker)
    for body, end in ((b"commit", "commit"), (b"rollback", "rollback"), (b"orphan", None)):
        transaction = producer.begin_transaction()
        producer.send(_message(topic, body), transaction)
        if end is not None:
            getattr(transaction, end)()
    # the orphan is checked back over Telemetry after transactionTimeout, and the checker commits it
    stored = _until(lambda: len(_pymq_read_some(endpoint, topic)) == 2 and _pymq_read_some(endpoint, topic),
                    what="the committed and the checked-back messages")
    assert sorted(m.body for m in stored) == [b"commit", b"orphan"]
    assert len(checker.checked) == 1


def _pymq_read_some(endpoint: str, topic: str) -> list[Any]:
    consumer = PullConsumer(endpoint, "readers")
    return [m for mq in consumer.queues(topic) for m in consumer.pull(mq, 0, 100).messages]


# -- bad input, with the v2 stub: the codes of definition.proto, nothing stored -------------------------

def _v2_message(topic: str, body: bytes = b"x", **system: Any) -> v2.Message:
    m = v2.Message(body=body)
    m.topic.name = topic
    m.system_properties.message_id = system.pop("message_id", uuid.uuid4().hex)
    m.system_properties.message_type = system.pop("message_type", v2.NORMAL)
    for key, value in system.items():
        setattr(m.system_properties, key, value)
    return m


def test_bad_input_codes(v2_broker: BrokerProcess) -> None:
    endpoint = v2_broker.endpoint
    topic, group = _topic(endpoint, 1), _name("v2G")
    with grpc.insecure_channel(endpoint) as channel:
        stub = service_pb2_grpc.MessagingServiceStub(channel)

        def send(m: v2.Message) -> int:
            return int(stub.SendMessage(sv.SendMessageRequest(messages=[m])).status.code)

        assert send(_v2_message("nosuchtopic")) == v2.TOPIC_NOT_FOUND
        assert send(_v2_message("bad topic!")) == v2.ILLEGAL_TOPIC
        assert send(_v2_message(topic, b"")) == v2.MESSAGE_BODY_EMPTY
        assert send(_v2_message(topic, b"x" * (4 * 1024 * 1024 + 1))) == v2.MESSAGE_BODY_TOO_LARGE
        assert send(_v2_message(topic, message_type=v2.FIFO)) == v2.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE
        assert send(_v2_message(topic, tag="a|b")) == v2.ILLEGAL_MESSAGE_TAG
        reserved = _v2_message(topic)
        reserved.user_properties["TAGS"] = "sneaky"
        assert send(reserved) == v2.ILLEGAL_MESSAGE_PROPERTY_KEY
        far = _v2_message(topic, message_type=v2.DELAY)
        far.system_properties.delivery_timestamp.FromMilliseconds(int(time.time() * 1000) + 2 * 86_400_000)
        assert send(far) == v2.ILLEGAL_DELIVERY_TIME
        route = stub.QueryRoute(sv.QueryRouteRequest(topic=v2.Resource(name="nosuchtopic")))
        assert route.status.code == v2.TOPIC_NOT_FOUND

        queue = v2.MessageQueue(topic=v2.Resource(name=topic), id=0)
        receive = sv.ReceiveMessageRequest(group=v2.Resource(name=group), message_queue=queue, batch_size=1)
        receive.invisible_duration.FromMilliseconds(100)  # under the broker's 1 s minimum
        [answer] = list(stub.ReceiveMessage(receive, timeout=10))
        assert answer.status.code == v2.ILLEGAL_INVISIBLE_TIME
        receive.invisible_duration.FromMilliseconds(5000)  # but a deadline under the 5 s minimum poll:
        [answer] = list(stub.ReceiveMessage(receive, timeout=3))
        assert answer.status.code == v2.ILLEGAL_POLLING_TIME
        ack = stub.AckMessage(sv.AckMessageRequest(
            group=v2.Resource(name=group), topic=v2.Resource(name=topic),
            entries=[sv.AckMessageEntry(message_id="m", receipt_handle="not-a-handle")]))
        assert ack.entries[0].status.code == v2.INVALID_RECEIPT_HANDLE
        change = sv.ChangeInvisibleDurationRequest(
            group=v2.Resource(name=group), topic=v2.Resource(name=topic), receipt_handle="not-a-handle",
            message_id="m",
        )
        change.invisible_duration.FromMilliseconds(5000)
        assert stub.ChangeInvisibleDuration(change).status.code == v2.INVALID_RECEIPT_HANDLE
        offset = stub.GetOffset(sv.GetOffsetRequest(group=v2.Resource(name=group), message_queue=queue))
        assert offset.status.code == v2.OFFSET_NOT_FOUND
        recall = stub.RecallMessage(sv.RecallMessageRequest(topic=v2.Resource(name=topic), recall_handle="h"))
        assert recall.status.code == v2.BAD_REQUEST  # not a handle this broker gave
    # nothing of the refused sends was stored; the topic was not created either
    assert _pymq_read_some(endpoint, topic) == []
    assert "nosuchtopic" not in set(Admin(endpoint).topics()["topic"])


def test_forward_to_dead_letter_queue(v2_broker: BrokerProcess) -> None:
    endpoint = v2_broker.endpoint
    topic, group = _topic(endpoint, 1), _name("v2G")
    with grpc.insecure_channel(endpoint) as channel:
        stub = service_pb2_grpc.MessagingServiceStub(channel)
        sent = stub.SendMessage(sv.SendMessageRequest(messages=[_v2_message(topic, b"give-up")]))
        assert sent.status.code == v2.OK
        receive = sv.ReceiveMessageRequest(group=v2.Resource(name=group), batch_size=4,
                                           message_queue=v2.MessageQueue(topic=v2.Resource(name=topic), id=0))
        receive.invisible_duration.FromMilliseconds(1000)
        receive.long_polling_timeout.FromMilliseconds(1000)
        answers = list(stub.ReceiveMessage(receive, timeout=10))
        [m] = [a.message for a in answers if a.HasField("message")]
        forward = stub.ForwardMessageToDeadLetterQueue(sv.ForwardMessageToDeadLetterQueueRequest(
            group=v2.Resource(name=group), topic=v2.Resource(name=topic),
            receipt_handle=m.system_properties.receipt_handle, message_id=m.system_properties.message_id,
            delivery_attempt=1, max_delivery_attempts=16))
        assert forward.status.code == v2.OK
        time.sleep(1.2)  # past its invisible time: it would be due again, were it not dead-lettered
        answers = list(stub.ReceiveMessage(receive, timeout=10))
        assert [a.status.code for a in answers] == [v2.MESSAGE_NOT_FOUND]
    dead = Admin(endpoint).dead_letter_messages(group)
    assert [(d.body, d.msg_id) for d in dead] == [(b"give-up", m.system_properties.message_id)]


def test_pull_and_offsets_which_rocketmqs_proxy_does_not_serve(v2_broker: BrokerProcess) -> None:
    endpoint = v2_broker.endpoint
    topic, group = _topic(endpoint, 1), _name("v2G")
    Producer(endpoint).send_batch([PymqMessage(topic, f"p{i}".encode(), tags="A" if i % 2 else "B")
                                   for i in range(5)])
    queue = v2.MessageQueue(topic=v2.Resource(name=topic), id=0)
    with grpc.insecure_channel(endpoint) as channel:
        stub = service_pb2_grpc.MessagingServiceStub(channel)

        def pull(offset: int, expression: str = "*", batch: int = 10) -> tuple[int, list[bytes], int]:
            req = sv.PullMessageRequest(group=v2.Resource(name=group), message_queue=queue, offset=offset,
                                        batch_size=batch, filter_expression=v2.FilterExpression(
                                            type=v2.TAG, expression=expression))
            answers = list(stub.PullMessage(req, timeout=10))
            codes = [a.status.code for a in answers if a.HasField("status")]
            bodies = [a.message.body for a in answers if a.HasField("message")]
            [next_offset] = [a.next_offset for a in answers if a.HasField("next_offset")]
            return codes[0], bodies, next_offset

        assert pull(0, batch=3) == (v2.OK, [b"p0", b"p1", b"p2"], 3)
        assert pull(3) == (v2.OK, [b"p3", b"p4"], 5)
        assert pull(0, "A") == (v2.OK, [b"p1", b"p3"], 5)
        assert pull(5) == (v2.MESSAGE_NOT_FOUND, [], 5)
        assert pull(9)[0] == v2.ILLEGAL_OFFSET

        def query(policy: int) -> int:
            answer = stub.QueryOffset(sv.QueryOffsetRequest(message_queue=queue, query_offset_policy=policy))
            assert answer.status.code == v2.OK
            return int(answer.offset)

        assert (query(v2.BEGINNING), query(v2.END)) == (0, 5)
        update = stub.UpdateOffset(sv.UpdateOffsetRequest(group=v2.Resource(name=group), message_queue=queue,
                                                          offset=3))
        assert update.status.code == v2.OK
        got = stub.GetOffset(sv.GetOffsetRequest(group=v2.Resource(name=group), message_queue=queue))
        assert (got.status.code, got.offset) == (v2.OK, 3)
    # the committed offset is the group's progress as pymq shows it
    progress = Admin(endpoint).group_progress(group, topic)
    assert int(progress["consumer_offset"].sum()) == 3


def _receive_raw(endpoint: str, topic: str, group: str, invisible_ms: int = 1000,
                 long_polling_ms: int = 5000) -> list[v2.Message]:
    """A receive of up to 4 messages of queue 0, without a client: the raw gRPC request."""
    with grpc.insecure_channel(endpoint) as channel:
        receive = sv.ReceiveMessageRequest(group=v2.Resource(name=group), batch_size=4,
                                           message_queue=v2.MessageQueue(topic=v2.Resource(name=topic), id=0))
        receive.invisible_duration.FromMilliseconds(invisible_ms)
        receive.long_polling_timeout.FromMilliseconds(long_polling_ms)
        answers = service_pb2_grpc.MessagingServiceStub(channel).ReceiveMessage(receive, timeout=10)
        return [a.message for a in answers if a.HasField("message")]


def test_a_blank_born_host_is_the_senders_address(v2_broker: BrokerProcess) -> None:
    """SendMessageActivity: a message without a born host gets the sender's address (host:port, from
    the gRPC peer); it was left empty. One the client sets is kept."""
    endpoint = v2_broker.endpoint
    topic, group = _topic(endpoint, 1), _name("v2G")
    with grpc.insecure_channel(endpoint) as channel:
        stub = service_pb2_grpc.MessagingServiceStub(channel)
        for body, born_host in ((b"blank", ""), (b"set", "10.1.2.3")):
            m = v2.Message(topic=v2.Resource(name=topic), body=body)
            sp = m.system_properties
            sp.message_id, sp.message_type, sp.born_host = uuid.uuid4().hex.upper(), v2.NORMAL, born_host
            assert stub.SendMessage(sv.SendMessageRequest(messages=[m]), timeout=10).status.code == v2.OK
    got = {m.body: m.system_properties.born_host for m in _receive_raw(endpoint, topic, group)}
    host, _, port = got[b"blank"].rpartition(":")
    assert (host, port.isdigit(), got[b"set"]) == ("127.0.0.1", True, "10.1.2.3")


@pytest.mark.parametrize("crash", [False, True])
def test_delivery_attempts_survive_a_broker_restart(tmp_path: Path, crash: bool) -> None:
    """Unacked messages come back after a restart (clean or kill -9) with their attempts counted on."""
    args = ["--min-invisible-time-mills-for-recv", "1000"]
    with BrokerProcess(tmp_path / "broker", extra_args=args) as broker:
        topic, group = _topic(broker.endpoint, 1), _name("v2G")
        _set_retry_max_times(broker.endpoint, group, 2)  # three attempts, then the DLQ
        Producer(broker.endpoint).send(PymqMessage(topic, b"crashy"))
        def attempts() -> list[int]:
            return [m.system_properties.delivery_attempt for m in _receive_raw(broker.endpoint, topic, group)]

        assert attempts() == [1]
        time.sleep(1.5)  # the attempt count is written within a second (and at a clean shutdown)
        assert attempts() == [2]
        time.sleep(1.1)
        broker.restart(crash=crash)
        again = _receive_raw(broker.endpoint, topic, group)
        assert [(m.body, m.system_properties.delivery_attempt) for m in again] == [(b"crashy", 3)]
        time.sleep(1.2)  # the third attempt expires too: dead-lettered, not delivered a fourth time
        assert _receive_raw(broker.endpoint, topic, group) == []
        dead = Admin(broker.endpoint).dead_letter_messages(group)
        assert [d.body for d in dead] == [b"crashy"]


def _ack_raw(endpoint: str, topic: str, group: str, messages: list[v2.Message]) -> list[int]:
    """Each message's ack status code."""
    with grpc.insecure_channel(endpoint) as channel:
        ack = sv.AckMessageRequest(group=v2.Resource(name=group), topic=v2.Resource(name=topic))
        for m in messages:
            ack.entries.add(message_id=m.system_properties.message_id,
                            receipt_handle=m.system_properties.receipt_handle)
        resp = service_pb2_grpc.MessagingServiceStub(channel).AckMessage(ack, timeout=10)
        return [e.status.code for e in resp.entries]


@pytest.mark.parametrize("crash", [False, True])
def test_messages_acked_above_the_committed_offset_are_not_delivered_after_a_restart(
        tmp_path: Path, crash: bool) -> None:
    """The committed offset stays at the lowest unacked message: a restart delivered every message
    acked above it again. Now only the unacked ones come back, after a clean shutdown or, once
    the acks are a second old (written within a second), a kill -9."""
    args = ["--min-invisible-time-mills-for-recv", "1000"]
    with BrokerProcess(tmp_path / "broker", extra_args=args) as broker:
        topic, group = _topic(broker.endpoint, 1), _name("v2G")
        for i in range(4):
            Producer(broker.endpoint).send(PymqMessage(topic, b"m%d" % i))
        got = _receive_raw(broker.endpoint, topic, group)
        assert [m.body for m in got] == [b"m0", b"m1", b"m2", b"m3"]
        assert _ack_raw(broker.endpoint, topic, group, [got[1], got[3]]) == [v2.OK] * 2
        time.sleep(1.5 if crash else 0)
        broker.restart(crash=crash)
        again = _receive_raw(broker.endpoint, topic, group)
        assert [(m.body, m.system_properties.delivery_attempt) for m in again] == [(b"m0", 2), (b"m2", 2)]


@pytest.mark.parametrize("crash", [False, True])
def test_a_consumer_acks_with_its_handles_across_a_broker_restart(tmp_path: Path, crash: bool) -> None:
    """A restart refused the receipt handles its consumers held (INVALID_RECEIPT_HANDLE) and handed
    every unacked message out again at once: what a consumer was working on came twice. As on
    RocketMQ, the handle acks the message after the restart, and an unacked one stays hidden until
    its invisible time (after a clean shutdown, or a kill -9 a second after the receive)."""
    args = ["--min-invisible-time-mills-for-recv", "1000"]
    with BrokerProcess(tmp_path / "broker", extra_args=args) as broker:
        topic, group = _topic(broker.endpoint, 1), _name("v2G")
        for body in (b"done", b"slow"):
            Producer(broker.endpoint).send(PymqMessage(topic, body))
        received_at = time.time()
        done, slow = _receive_raw(broker.endpoint, topic, group, invisible_ms=10_000)
        time.sleep(1.5 if crash else 0)  # the in-flight state is written within a second
        broker.restart(crash=crash)
        assert _ack_raw(broker.endpoint, topic, group, [done]) == [v2.OK]
        again: list[v2.Message] = []
        while not again and time.time() < received_at + 30:
            again = _receive_raw(broker.endpoint, topic, group, long_polling_ms=1000)
        assert time.time() >= received_at + 10.0 - 0.2  # not before its invisible time
        assert [(m.body, m.system_properties.delivery_attempt) for m in again] == [(b"slow", 2)]
        assert _ack_raw(broker.endpoint, topic, group, [slow]) == [v2.INVALID_RECEIPT_HANDLE]  # replaced


class _PushClient:
    """A push consumer's raw gRPC side: a Telemetry stream with its settings, auto-renewed receives."""

    def __init__(self, endpoint: str, group: str, client_id: str) -> None:
        self.group, self.metadata = group, (("x-mq-client-id", client_id),)
        self.channel = grpc.insecure_channel(endpoint)
        self.stub = service_pb2_grpc.MessagingServiceStub(self.channel)
        self.stop = threading.Event()
        self.open_stream()

    def open_stream(self) -> None:
        self.stop = threading.Event()
        stop = self.stop

        def commands() -> Iterator[sv.TelemetryCommand]:
            settings = v2.Settings(client_type=v2.PUSH_CONSUMER)
            settings.subscription.group.name = self.group
            yield sv.TelemetryCommand(settings=settings)
            stop.wait(30)

        self.telemetry = self.stub.Telemetry(commands(), metadata=self.metadata)
        next(self.telemetry)  # the settings' answer: the stream is open

    def close_stream(self) -> None:
        self.stop.set()
        self.telemetry.cancel()

    def receive(self, topic: str) -> list[v2.Message]:
        receive = sv.ReceiveMessageRequest(
            group=v2.Resource(name=self.group), batch_size=4, auto_renew=True,
            message_queue=v2.MessageQueue(topic=v2.Resource(name=topic), id=-1))
        receive.long_polling_timeout.FromMilliseconds(5000)
        return [a.message for a in self.stub.ReceiveMessage(receive, timeout=10, metadata=self.metadata)
                if a.HasField("message")]

    def close(self) -> None:
        self.close_stream()
        self.channel.close()


def test_a_push_consumer_that_shuts_down_has_its_messages_delivered_again_within_a_second(
        v2_broker: BrokerProcess) -> None:
    """A push consumer's messages (auto renew: invisible 60 s) stayed hidden that long after it
    unregistered; RocketMQ's DefaultReceiptHandleManager makes them visible in 1 s
    (invisibleTimeMillisWhenClear), for the group's other consumers."""
    endpoint = v2_broker.endpoint
    topic, group = _topic(endpoint, 1), _name("v2G")
    Producer(endpoint).send(PymqMessage(topic, b"cached"))
    client = _PushClient(endpoint, group, _name("push-client@"))
    try:
        assert [m.body for m in client.receive(topic)] == [b"cached"]
        client.stub.NotifyClientTermination(sv.NotifyClientTerminationRequest(group=v2.Resource(name=group)),
                                            timeout=10, metadata=client.metadata)
    finally:
        client.close()
    start = time.monotonic()
    again = _until(lambda: _receive_raw(endpoint, topic, group), timeout=4, what="the message again")
    assert [(m.body, m.system_properties.delivery_attempt) for m in again] == [(b"cached", 2)]
    assert time.monotonic() - start < 3


def test_a_push_consumer_that_reconnects_keeps_its_messages(v2_broker: BrokerProcess) -> None:
    """A closed Telemetry stream made a push consumer's messages visible in 1 s: one that reconnected
    at once, still working on them, saw them go to another consumer and its ack refused. RocketMQ
    clears a client's handles when it unregisters or its channel expires, not when a stream closes."""
    endpoint = v2_broker.endpoint
    topic, group = _topic(endpoint, 1), _name("v2G")
    Producer(endpoint).send(PymqMessage(topic, b"working-on-it"))
    client = _PushClient(endpoint, group, _name("push-client@"))
    try:
        [m] = client.receive(topic)
        client.close_stream()
        client.open_stream()  # the same client id, at once
        time.sleep(1.5)
        with grpc.insecure_channel(endpoint) as channel:  # another consumer of the group: nothing
            queue = v2.MessageQueue(topic=v2.Resource(name=topic), id=0)
            other = sv.ReceiveMessageRequest(group=v2.Resource(name=group), batch_size=4, message_queue=queue)
            other.invisible_duration.FromMilliseconds(10_000)
            other.long_polling_timeout.FromMilliseconds(5000)
            answers = list(service_pb2_grpc.MessagingServiceStub(channel).ReceiveMessage(other, timeout=10))
            assert [a.message.body for a in answers if a.HasField("message")] == []
        assert _ack_raw(endpoint, topic, group, [m]) == [v2.OK]  # its handle still holds
    finally:
        client.close()


def test_an_auto_renew_receive_hides_messages_for_the_proxys_time(v2_broker: BrokerProcess) -> None:
    """ReceiveMessageActivity: an auto-renewed receive (a push consumer) hides its messages for
    defaultInvisibleTimeMills (60 s), whatever invisible duration it asks for; pymq took the request's."""
    endpoint = v2_broker.endpoint
    topic, group = _topic(endpoint, 1), _name("v2G")
    Producer(endpoint).send(PymqMessage(topic, b"renewed"))
    with grpc.insecure_channel(endpoint) as channel:
        receive = sv.ReceiveMessageRequest(
            group=v2.Resource(name=group), batch_size=4, auto_renew=True,
            message_queue=v2.MessageQueue(topic=v2.Resource(name=topic), id=-1))
        receive.invisible_duration.FromMilliseconds(1000)
        receive.long_polling_timeout.FromMilliseconds(5000)
        answers = service_pb2_grpc.MessagingServiceStub(channel).ReceiveMessage(
            receive, timeout=10, metadata=(("x-mq-client-id", _name("push-client@")),))
        [m] = [a.message for a in answers if a.HasField("message")]
    assert (m.body, m.system_properties.invisible_duration.ToMilliseconds()) == (b"renewed", 60_000)


def test_delivery_attempts_changed_together_survive_a_crash_after_idling(tmp_path: Path) -> None:
    """Two attempts counted within a second, then nothing: the broker writes them within a second
    (a write used to come only with a change a second after the last write), so kill -9 keeps both."""
    args = ["--min-invisible-time-mills-for-recv", "1000"]
    with BrokerProcess(tmp_path / "broker", extra_args=args) as broker:
        topic, group = _topic(broker.endpoint, 1), _name("v2G")
        Producer(broker.endpoint).send(PymqMessage(topic, b"one"))
        Producer(broker.endpoint).send(PymqMessage(topic, b"two"))
        first = _receive_raw(broker.endpoint, topic, group)
        assert [(m.body, m.system_properties.delivery_attempt) for m in first] == [(b"one", 1), (b"two", 1)]
        time.sleep(2.5)  # idle: the periodic write has run
        broker.restart(crash=True)
        again = _receive_raw(broker.endpoint, topic, group)
        assert [(m.body, m.system_properties.delivery_attempt) for m in again] == [(b"one", 2), (b"two", 2)]


def test_a_topic_deleted_and_created_again_is_received_from_its_start(v2_broker: BrokerProcess) -> None:
    """DeleteTopic cleaned the group's stored offsets but not the v2 proxy's pop state: a group read the
    topic created again from its old next offset, past every new message, and counted a new message's
    deliveries on from the old unacked message at its offset. RocketMQ cleans both with the topic."""
    endpoint = v2_broker.endpoint
    topic, group = _topic(endpoint, 1), _name("v2G")
    for i in range(4):
        Producer(endpoint).send(PymqMessage(topic, b"old-%d" % i))
    assert len(_receive_raw(endpoint, topic, group)) == 4  # none acked
    time.sleep(1.1)
    assert [m.system_properties.delivery_attempt for m in _receive_raw(endpoint, topic, group)] == [2] * 4
    Admin(endpoint).delete_topic(topic)
    Admin(endpoint).create_topic(topic, 1, message_type="MIXED")
    for i in range(2):
        Producer(endpoint).send(PymqMessage(topic, b"new-%d" % i))
    got = _receive_raw(endpoint, topic, group)
    assert [(m.body, m.system_properties.delivery_attempt) for m in got] == [(b"new-0", 1), (b"new-1", 1)]


def test_a_paused_group_receives_nothing(v2_broker: BrokerProcess, clients: _Clients) -> None:
    """consumeEnable=false refuses the official clients' receives too (RocketMQ's pop: NO_PERMISSION)."""
    endpoint = v2_broker.endpoint
    topic, group = _topic(endpoint), _name("v2Paused")
    clients.producer(endpoint, topic).send(_message(topic, b"held"))
    consumer = clients.consumer(endpoint, group, topic)
    Admin(endpoint).update_group(group, consume_enable=False)
    with pytest.raises(Exception, match="consumption disabled"):
        consumer.receive(16, 30)
    Admin(endpoint).update_group(group, consume_enable=True)
    assert [m.body for m in _receive(consumer, 1)] == [b"held"]

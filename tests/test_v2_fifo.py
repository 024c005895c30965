"""FIFO consumption for RocketMQ 5's official clients: a group with consumeMessageOrderly receives each
queue in order, held until its messages are acked; a message not acked in time comes back before
anything after it; past the group's delivery attempts it is dead-lettered and the queue moves on."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from broker_process import BrokerProcess
from pymq_broker import EmbeddedBroker
from pymq_proto.rocketmq_v2 import definition_pb2 as v2
from pymq_proto.rocketmq_v2 import service_pb2 as sv
from pymq_proto.rocketmq_v2 import service_pb2_grpc
from pyspark_pymq.admin_cli import main as admin_main
from pyspark_pymq.client import Admin
from pyspark_pymq.client.route import PERM_WRITE
from rocketmq import (
    ClientConfiguration,
    ConsumeResult,
    Credentials,
    FilterExpression,
    Message,
    MessageListener,
    PushConsumer,
    SimpleConsumer,
)
from rocketmq import Producer as V2Producer


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    with BrokerProcess(tmp_path_factory.mktemp("v2-fifo"),
                       ["--min-invisible-time-mills-for-recv", "1000"]) as proc:
        yield proc


def _name(prefix: str) -> str:
    return f"{prefix}{uuid.uuid4().hex[:8]}"


class _Fifo:
    """A FIFO topic of one queue, an orderly group, the official producer and simple consumer."""

    def __init__(self, endpoint: str, orderly: bool = True, retry_max_times: int = 16) -> None:
        self.topic, self.group = _name("fifoT"), _name("fifoG")
        admin = Admin(endpoint)
        admin.create_topic(self.topic, 1, message_type="FIFO")
        admin.update_group(self.group, consume_message_orderly=orderly, retry_max_times=retry_max_times)
        config = ClientConfiguration(endpoint, Credentials(), request_timeout=8)
        self.producer = V2Producer(config, (self.topic,))
        self.producer.startup()
        self.consumer = SimpleConsumer(config, self.group, {self.topic: FilterExpression("*")},
                                       await_duration=1)
        self.consumer.startup()

    def send(self, *bodies: str, group: str = "order-1") -> None:
        for body in bodies:
            m = Message()
            m.topic, m.body, m.message_group = self.topic, body.encode(), group
            self.producer.send(m)

    def receive(self, invisible_s: int) -> list[Any]:
        return list(self.consumer.receive(16, invisible_s))

    def close(self) -> None:
        self.consumer.shutdown()
        self.producer.shutdown()


def _bodies(messages: list[Any]) -> list[str]:
    return [m.body.decode() for m in messages]


def test_an_orderly_group_holds_the_queue_until_its_messages_are_acked(broker: BrokerProcess) -> None:
    fifo = _Fifo(broker.endpoint)
    try:
        fifo.send("a1", "a2", "a3")
        first = fifo.receive(30)
        assert _bodies(first) == ["a1", "a2", "a3"]
        fifo.send("a4")
        assert fifo.receive(30) == []  # a1..a3 in flight: the queue is held
        for m in first:
            fifo.consumer.ack(m)
        assert _bodies(fifo.receive(30)) == ["a4"]
    finally:
        fifo.close()


def test_a_group_that_is_not_orderly_is_not_held(broker: BrokerProcess) -> None:
    plain = _Fifo(broker.endpoint, orderly=False)
    try:
        plain.send("b1")
        assert _bodies(plain.receive(30)) == ["b1"]
        plain.send("b2")
        assert _bodies(plain.receive(30)) == ["b2"]  # delivered while b1 is in flight
    finally:
        plain.close()


def test_unacked_messages_come_back_first_then_the_dlq_and_the_next(broker: BrokerProcess) -> None:
    fifo = _Fifo(broker.endpoint, retry_max_times=1)  # two delivery attempts
    try:
        fifo.send("c1", "c2")
        assert [(m.body, m.delivery_attempt) for m in fifo.receive(1)] == [(b"c1", 1), (b"c2", 1)]
        fifo.send("c3")
        time.sleep(1.3)  # invisible time over, not acked
        again = fifo.receive(1)
        assert [(m.body, m.delivery_attempt) for m in again] == [(b"c1", 2), (b"c2", 2)]  # before c3
        time.sleep(1.3)  # not acked again: two attempts spent
        deadline = time.monotonic() + 20
        got: list[Any] = []
        while not got and time.monotonic() < deadline:
            got = fifo.receive(30)
        assert _bodies(got) == ["c3"]  # c1, c2 dead-lettered, the queue moves on
        dead = Admin(broker.endpoint).dead_letter_messages(fifo.group)
        assert sorted(d.body for d in dead) == [b"c1", b"c2"]
        # RocketMQ: each redelivery a copy with reconsume times + 1, the dead letter one more
        assert [d.reconsume_times for d in dead] == [2, 2]
        assert {d.properties["RECONSUME_TIME"] for d in dead} == {"2"}
    finally:
        fifo.close()


def test_settings_say_fifo_and_the_cli_sets_it(
        broker: BrokerProcess, capsys: pytest.CaptureFixture[str]) -> None:
    group = _name("cliG")
    args = ["-e", broker.endpoint, "update-group", group, "--orderly", "--retry-max-times", "3"]
    assert admin_main(args) == 0
    assert "orderly (FIFO)" in capsys.readouterr().out
    config = Admin(broker.endpoint).group_config(group)
    assert (config.consume_message_orderly, config.retry_max_times) == (True, 3)
    stub = service_pb2_grpc.MessagingServiceStub(grpc.insecure_channel(broker.endpoint))
    settings = v2.Settings(client_type=v2.SIMPLE_CONSUMER,
                           subscription=v2.Subscription(group=v2.Resource(name=group)))
    answers = stub.Telemetry(iter([sv.TelemetryCommand(settings=settings)]),
                             metadata=(("x-mq-client-id", "fifo-test"),), timeout=10)
    first = next(iter(answers))
    assert first.settings.subscription.fifo is True
    assert first.settings.backoff_policy.max_attempts == 4
    # RocketMQ's CustomizedRetryPolicy default: the client's attempt 2 waits 1 s, attempt 3 5 s, ... 2 h
    delays = [d.ToMilliseconds() for d in first.settings.backoff_policy.customized_backoff.next]
    assert delays[:5] == [1000, 5000, 10_000, 30_000, 60_000]
    assert (len(delays), delays[-1]) == (18, 7_200_000)
    Admin(broker.endpoint).update_group(group, consume_message_orderly=False)
    assert Admin(broker.endpoint).group_config(group).consume_message_orderly is False


def test_a_message_due_again_waits_for_the_one_before_it(broker: BrokerProcess) -> None:
    fifo = _Fifo(broker.endpoint)
    try:
        fifo.send("d1", "d2", "d3")
        assert _bodies(fifo.receive(1)) == ["d1", "d2", "d3"]
        time.sleep(1.3)  # all three due again
        [a] = fifo.consumer.receive(1, 30)  # consumer A, one at a time
        assert (a.body, a.delivery_attempt) == (b"d1", 2)
        assert list(fifo.consumer.receive(1, 30)) == []  # consumer B: not d2 while d1 is in flight
        fifo.consumer.ack(a)
        [b] = fifo.consumer.receive(1, 30)
        assert (b.body, b.delivery_attempt) == (b"d2", 2)
        fifo.consumer.ack(b)
        assert [(m.body, m.delivery_attempt) for m in fifo.receive(30)] == [(b"d3", 2)]
    finally:
        fifo.close()


def _assigned_queues(endpoint: str, topic: str, group: str) -> list[int] | int:
    """QueryAssignment's queue ids, or its status code when it is not OK."""
    stub = service_pb2_grpc.MessagingServiceStub(grpc.insecure_channel(endpoint))
    answer = stub.QueryAssignment(sv.QueryAssignmentRequest(
        topic=v2.Resource(name=topic), group=v2.Resource(name=group)), timeout=10)
    if answer.status.code != v2.OK:
        return answer.status.code
    return [a.message_queue.id for a in answer.assignments]


def test_an_orderly_group_is_assigned_each_readable_queue(broker: BrokerProcess) -> None:
    """RouteActivity.queryAssignment: an orderly group gets one assignment per readable queue (a FIFO
    push consumer consumes each in order), another group one with queue id -1; FORBIDDEN without a
    readable queue. An orderly group got queue -1 too. The official push consumer, given the queues,
    consumes each message group in order and every message once."""
    admin = Admin(broker.endpoint)
    topic, orderly, plain = _name("fifoT"), _name("fifoG"), _name("plainG")
    admin.create_topic(topic, 3, message_type="FIFO")
    admin.update_group(orderly, consume_message_orderly=True)
    admin.update_group(plain, consume_message_orderly=False)
    assert _assigned_queues(broker.endpoint, topic, orderly) == [0, 1, 2]
    assert _assigned_queues(broker.endpoint, topic, plain) == [-1]
    write_only = _name("fifoW")
    admin.create_topic(write_only, 3, message_type="FIFO", perm=PERM_WRITE)
    assert _assigned_queues(broker.endpoint, write_only, orderly) == v2.FORBIDDEN

    seen: list[tuple[str, str]] = []

    class Listener(MessageListener):
        def consume(self, message: Any) -> ConsumeResult:
            seen.append((message.message_group, message.body.decode()))
            return ConsumeResult.SUCCESS

    config = ClientConfiguration(broker.endpoint, Credentials(), request_timeout=8)
    consumer = PushConsumer(config, orderly, Listener(), {topic: FilterExpression("*")})
    consumer.startup()
    producer = V2Producer(config, (topic,))
    producer.startup()
    try:
        for group in ("g1", "g2", "g3"):
            for i in range(3):
                m = Message()
                m.topic, m.body, m.message_group = topic, f"{group}-{i}".encode(), group
                producer.send(m)
        deadline = time.monotonic() + 20
        while len(seen) < 9 and time.monotonic() < deadline:
            time.sleep(0.05)
        for group in ("g1", "g2", "g3"):
            assert [b for g, b in seen if g == group] == [f"{group}-{i}" for i in range(3)]
        assert len(seen) == 9
    finally:
        producer.shutdown()
        consumer.shutdown()


def _send_fifo(stub: Any, topic: str, *bodies: str) -> None:
    for body in bodies:
        m = v2.Message(topic=v2.Resource(name=topic), body=body.encode())
        sp = m.system_properties
        sp.message_id, sp.body_encoding, sp.message_type = uuid.uuid4().hex.upper(), v2.IDENTITY, v2.FIFO
        sp.message_group = "order-1"
        assert stub.SendMessage(sv.SendMessageRequest(messages=[m]), timeout=10).status.code == v2.OK


def test_a_cancelled_receive_leaves_the_due_messages_it_took(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with EmbeddedBroker(tmp_path / "b", min_invisible_time_mills_for_recv=1000) as embedded:
        messaging, loop = embedded.controller.messaging, embedded._loop
        assert messaging is not None and loop is not None
        topic, group = _name("cancelT"), _name("cancelG")
        admin = Admin(embedded.endpoint)
        admin.create_topic(topic, 1, message_type="FIFO")
        admin.update_group(group, consume_message_orderly=True, retry_max_times=0)  # one attempt
        stub = service_pb2_grpc.MessagingServiceStub(grpc.insecure_channel(embedded.endpoint))
        _send_fifo(stub, topic, "e1", "e2", "e3")
        request = sv.ReceiveMessageRequest(
            group=v2.Resource(name=group), batch_size=16,
            message_queue=v2.MessageQueue(topic=v2.Resource(name=topic), id=-1),
            filter_expression=v2.FilterExpression(type=v2.TAG, expression="*"))
        request.invisible_duration.FromMilliseconds(1000)
        request.long_polling_timeout.FromMilliseconds(5000)

        def receive() -> list[bytes]:
            answers = asyncio.run_coroutine_threadsafe(messaging.receive_message(request), loop).result(30)
            return [r.message.body for r in answers if r.HasField("message")]

        assert receive() == [b"e1", b"e2", b"e3"]
        time.sleep(1.2)  # all three due, their one attempt spent: the next receive dead-letters them
        writing, release = threading.Event(), asyncio.Event()
        send_back = messaging.send_back.consumer_send_msg_back_batch

        async def slow_dlq_write(req: Any, **kwargs: Any) -> Any:  # stands in for a SYNC_FLUSH wait
            answer = await send_back(req, **kwargs)
            writing.set()
            await release.wait()
            return answer

        monkeypatch.setattr(messaging.send_back, "consumer_send_msg_back_batch", slow_dlq_write)
        cancelled = asyncio.run_coroutine_threadsafe(messaging.receive_message(request), loop)
        assert writing.wait(10)  # e1 is in the DLQ, not yet off the books
        cancelled.cancel()  # the client's deadline
        time.sleep(0.2)
        loop.call_soon_threadsafe(release.set)
        monkeypatch.undo()
        deadline = time.monotonic() + 20
        while len(admin.dead_letter_messages(group)) < 3 and time.monotonic() < deadline:
            receive()
        assert sorted(d.body for d in admin.dead_letter_messages(group)) == [b"e1", b"e2", b"e3"]
        assert messaging.pop.in_flight(group, topic) == 0
        _send_fifo(stub, topic, "e4")
        assert receive() == [b"e4"]  # the queue moved on

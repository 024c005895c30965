"""Exact delivery times (RocketMQ 5's timer) and RecallMessage, through apache.rocketmq.v2, against a
real broker process: on time and never early, recalled durably, and neither lost nor doubled by kill -9."""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from typing import Any

import grpc
from broker_process import BrokerProcess
from pymq_broker.proxy.message_converter import recall_handle
from pymq_proto.rocketmq_v2 import definition_pb2 as v2
from pymq_proto.rocketmq_v2 import service_pb2 as sv
from pymq_proto.rocketmq_v2 import service_pb2_grpc
from pyspark_pymq.client import Admin, MessageQueue, PullConsumer


def _stub(endpoint: str) -> Any:
    return service_pb2_grpc.MessagingServiceStub(grpc.insecure_channel(endpoint))


def _send_at(stub: Any, topic: str, body: bytes, deliver_ms: int) -> Any:
    msg = v2.Message(topic=v2.Resource(name=topic), body=body)
    sp = msg.system_properties
    sp.message_id, sp.body_encoding, sp.message_type = uuid.uuid4().hex.upper(), v2.IDENTITY, v2.DELAY
    sp.delivery_timestamp.FromMilliseconds(deliver_ms)
    entry = stub.SendMessage(sv.SendMessageRequest(messages=[msg]), timeout=10).entries[0]
    assert entry.status.code == v2.OK, entry.status.message
    return entry


def _recall(stub: Any, topic: str, handle: str) -> Any:
    return stub.RecallMessage(sv.RecallMessageRequest(topic=v2.Resource(name=topic), recall_handle=handle),
                              timeout=10)


def _bodies(endpoint: str, topic: str) -> list[bytes]:
    result = PullConsumer(endpoint, "timer-reader").pull(MessageQueue(topic, "broker-a", 0), 0, 100)
    return [m.body for m in result.messages]


def _now_ms() -> int:
    return int(time.time() * 1000)


def test_a_delivery_time_is_kept_to_the_millisecond_not_a_delay_level(tmp_path: Path) -> None:
    with BrokerProcess(tmp_path / "b") as broker:  # delay levels 1s 5s 10s ...: 2.6 s is none of them
        Admin(broker.endpoint).create_topic("timed", 1, message_type="DELAY")
        stub = _stub(broker.endpoint)
        deliver_ms = _now_ms() + 2_600
        entry = _send_at(stub, "timed", b"at 2.6 s", deliver_ms)
        assert entry.recall_handle
        assert _bodies(broker.endpoint, "timed") == []
        while not _bodies(broker.endpoint, "timed") and _now_ms() < deliver_ms + 5_000:
            time.sleep(0.02)
        arrived = _now_ms()
        assert deliver_ms <= arrived <= deliver_ms + 700  # never early, not rounded up to 5 s
        mq = MessageQueue("timed", "broker-a", 0)
        message = PullConsumer(broker.endpoint, "r").pull(mq, 0, 1).messages[0]
        assert message.properties["TIMER_DELIVER_MS"] == str(deliver_ms)
        assert "DELAY" not in message.properties
        far = v2.Message(topic=v2.Resource(name="timed"), body=b"too far")
        far.system_properties.message_id, far.system_properties.message_type = "FAR", v2.DELAY
        far.system_properties.body_encoding = v2.IDENTITY
        far.system_properties.delivery_timestamp.FromMilliseconds(_now_ms() + 2 * 24 * 3600 * 1000)
        refused = stub.SendMessage(sv.SendMessageRequest(messages=[far]), timeout=10).entries[0].status
        assert refused.code == v2.ILLEGAL_DELIVERY_TIME and "maxDelayTimeMills" in refused.message


def test_a_recalled_message_is_never_delivered_even_after_kill_9(tmp_path: Path) -> None:
    with BrokerProcess(tmp_path / "b") as broker:
        Admin(broker.endpoint).create_topic("recall", 1, message_type="DELAY")
        stub = _stub(broker.endpoint)
        deliver_ms = _now_ms() + 3_000
        kept = _send_at(stub, "recall", b"kept", deliver_ms)
        gone = _send_at(stub, "recall", b"recalled", deliver_ms)
        answer = _recall(stub, "recall", gone.recall_handle)
        assert answer.status.code == v2.OK and answer.message_id == gone.message_id
        again = _recall(stub, "recall", gone.recall_handle)
        assert again.status.code == v2.MESSAGE_NOT_FOUND
        assert _recall(stub, "recall", "not-a-handle").status.code == v2.BAD_REQUEST
        broker.restart(crash=True)  # kill -9 before the delivery time
        stub = _stub(broker.endpoint)
        assert _bodies(broker.endpoint, "recall") == []  # not delivered early by the restart
        while _now_ms() < deliver_ms + 1_500:
            time.sleep(0.1)
        assert _bodies(broker.endpoint, "recall") == [b"kept"]  # once, and never the recalled one
        late = _recall(stub, "recall", kept.recall_handle)
        assert late.status.code == v2.MESSAGE_NOT_FOUND
        assert "delivered or recalled already" in late.status.message


def test_a_recall_names_the_topic_of_the_stored_message(tmp_path: Path) -> None:
    with BrokerProcess(tmp_path / "b") as broker:
        admin = Admin(broker.endpoint)
        admin.create_topic("victim", 1, message_type="DELAY")
        admin.create_topic("mine", 1, message_type="DELAY")
        stub = _stub(broker.endpoint)
        deliver_ms = _now_ms() + 2_500
        _send_at(stub, "victim", b"first", deliver_ms)
        target = _send_at(stub, "victim", b"payroll", deliver_ms)
        # a handle of the caller's own topic naming the victim's message id: the caller chooses
        # both the handle's topic and the request's, so only the stored REAL_TOPIC decides
        forged = recall_handle("mine", "broker-a", deliver_ms, target.message_id)
        answer = _recall(stub, "mine", forged)
        assert answer.status.code == v2.MESSAGE_NOT_FOUND
        # a timer of the caller's own topic with the victim's id is recalled, the victim's is not
        msg = v2.Message(topic=v2.Resource(name="mine"), body=b"mine")
        sp = msg.system_properties
        sp.message_id, sp.body_encoding, sp.message_type = target.message_id, v2.IDENTITY, v2.DELAY
        sp.delivery_timestamp.FromMilliseconds(deliver_ms)
        sent = stub.SendMessage(sv.SendMessageRequest(messages=[msg]), timeout=10).entries[0]
        assert sent.status.code == v2.OK
        assert _recall(stub, "mine", forged).status.code == v2.OK
        while _now_ms() < deliver_ms + 1_500:
            time.sleep(0.1)
        assert _bodies(broker.endpoint, "victim") == [b"first", b"payroll"]
        assert _bodies(broker.endpoint, "mine") == []
        assert _recall(stub, "victim", target.recall_handle).status.code == v2.MESSAGE_NOT_FOUND


def test_a_recall_of_the_oldest_pending_timer_holds(tmp_path: Path) -> None:
    with BrokerProcess(tmp_path / "b") as broker:
        Admin(broker.endpoint).create_topic("oldest", 1, message_type="DELAY")
        stub = _stub(broker.endpoint)
        deliver_ms = _now_ms() + 2_000
        first = _send_at(stub, "oldest", b"recalled", deliver_ms)  # offset 0 of the timer queue
        _send_at(stub, "oldest", b"kept", deliver_ms + 200)
        # finishing offset 0 moves lowWater past it (and drops it from "done"): its heap entry
        # must still count as done
        assert _recall(stub, "oldest", first.recall_handle).status.code == v2.OK
        while _now_ms() < deliver_ms + 1_700:
            time.sleep(0.1)
        assert _bodies(broker.endpoint, "oldest") == [b"kept"]


def test_a_recall_cancels_every_copy_of_a_retried_send_even_after_kill_9(tmp_path: Path) -> None:
    """A producer that retries a send (its answer lost) stores the message twice with one message id:
    the recall answered OK and cancelled the later copy only; the first was delivered."""
    with BrokerProcess(tmp_path / "b") as broker:
        Admin(broker.endpoint).create_topic("retried", 1, message_type="DELAY")
        stub = _stub(broker.endpoint)
        deliver_ms = _now_ms() + 3_000
        msg = v2.Message(topic=v2.Resource(name="retried"), body=b"sent twice")
        sp = msg.system_properties
        sp.message_id, sp.body_encoding, sp.message_type = uuid.uuid4().hex.upper(), v2.IDENTITY, v2.DELAY
        sp.delivery_timestamp.FromMilliseconds(deliver_ms)
        first, retried = (stub.SendMessage(sv.SendMessageRequest(messages=[msg]), timeout=10).entries[0]
                          for _ in range(2))
        assert first.status.code == retried.status.code == v2.OK and first.message_id == retried.message_id
        _send_at(stub, "retried", b"another", deliver_ms)
        assert _recall(stub, "retried", retried.recall_handle).status.code == v2.OK
        broker.restart(crash=True)  # kill -9: the recall of both copies was on disk when answered
        stub = _stub(broker.endpoint)
        assert _recall(stub, "retried", first.recall_handle).status.code == v2.MESSAGE_NOT_FOUND
        while _now_ms() < deliver_ms + 1_500:
            time.sleep(0.1)
        assert _bodies(broker.endpoint, "retried") == [b"another"]

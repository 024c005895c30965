"""Topic message types (RocketMQ 5's TopicMessageType): set through Admin and pymq-admin, kept across a
restart, and checked by apache.rocketmq.v2 as RocketMQ's proxy checks them (official client as judge)."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import grpc
import pytest
from broker_process import BrokerProcess
from pymq_proto.rocketmq_v2 import definition_pb2 as v2
from pymq_proto.rocketmq_v2 import service_pb2 as sv
from pymq_proto.rocketmq_v2 import service_pb2_grpc
from pymq_proto.v1 import pymq_pb2, pymq_pb2_grpc
from pyspark_pymq.admin_cli import main as admin_main
from pyspark_pymq.client import Admin
from rocketmq import ClientConfiguration, Credentials, Message
from rocketmq import Producer as V2Producer


def _name(prefix: str) -> str:
    return f"{prefix}{uuid.uuid4().hex[:8]}"


def _v2_send(stub: Any, topic: str, kind: int, **fields: Any) -> v2.Status:
    msg = v2.Message(topic=v2.Resource(name=topic), body=b"x")
    sp = msg.system_properties
    sp.message_id, sp.body_encoding, sp.message_type = uuid.uuid4().hex, v2.IDENTITY, kind
    for key, value in fields.items():
        setattr(sp, key, value)
    entry: Any = stub.SendMessage(sv.SendMessageRequest(messages=[msg]), timeout=10).entries[0]
    return entry.status


def _route_types(stub: Any, topic: str) -> set[int]:
    resp = stub.QueryRoute(sv.QueryRouteRequest(topic=v2.Resource(name=topic)), timeout=10)
    return {t for q in resp.message_queues for t in q.accept_message_types}


def test_topics_accept_the_messages_of_their_type_only(tmp_path: Path) -> None:
    with BrokerProcess(tmp_path / "b") as broker:
        ep = broker.endpoint
        admin = Admin(ep)
        plain, fifo, mixed = _name("plain"), _name("fifo"), _name("mixed")
        assert admin.create_topic(plain, 1).message_type == "NORMAL"  # RocketMQ's default
        assert admin.create_topic(fifo, 1, message_type="fifo").message_type == "FIFO"
        admin.create_topic(mixed, 1, message_type="MIXED")
        stub = service_pb2_grpc.MessagingServiceStub(grpc.insecure_channel(ep))
        assert _route_types(stub, plain) == {v2.NORMAL}
        assert _route_types(stub, fifo) == {v2.FIFO}
        assert _route_types(stub, mixed) == {v2.NORMAL, v2.FIFO, v2.DELAY, v2.TRANSACTION}
        refused = _v2_send(stub, plain, v2.FIFO, message_group="g1")
        assert refused.code == v2.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE
        assert "expected type is NORMAL, but actual type is FIFO" in refused.message
        assert _v2_send(stub, fifo, v2.NORMAL).code == v2.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE
        assert _v2_send(stub, fifo, v2.FIFO, message_group="g1").code == v2.OK
        assert _v2_send(stub, plain, v2.NORMAL).code == v2.OK
        assert _v2_send(stub, mixed, v2.FIFO, message_group="g1").code == v2.OK
        assert _v2_send(stub, mixed, v2.NORMAL).code == v2.OK
        stats = {t: int(admin.topic_stats(t)["max_offset"].sum()) for t in (plain, fifo, mixed)}
        assert stats == {plain: 1, fifo: 1, mixed: 2}  # nothing refused was stored
        # the official producer: a FIFO message to a NORMAL topic fails, a normal one goes
        producer = V2Producer(ClientConfiguration(ep, Credentials(), request_timeout=5), (plain,))
        producer.startup()
        try:
            m = Message()
            m.topic, m.body, m.message_group = plain, b"ordered", "g2"
            with pytest.raises(Exception, match=r"(?i)type"):
                producer.send(m)
            n = Message()
            n.topic, n.body = plain, b"plain"
            assert producer.send(n).message_id
        finally:
            producer.shutdown()


def test_message_types_are_kept_validated_and_set_from_the_cli(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with BrokerProcess(tmp_path / "b") as broker:
        admin = Admin(broker.endpoint)
        admin.create_topic("typed", 2, message_type="DELAY")
        assert admin.create_topic("typed", 4).message_type == "DELAY"  # an update without a type keeps it
        with pytest.raises(ValueError, match=r"message_type must be one of NORMAL, FIFO, DELAY, TRANSACTION, "
                                             r"MIXED .*'ORDERED'"):
            admin.create_topic("typed", 2, message_type="ORDERED")
        raw = pymq_pb2_grpc.BrokerStub(grpc.insecure_channel(broker.endpoint))
        with pytest.raises(grpc.RpcError) as err:
            raw.CreateTopic(pymq_pb2.CreateTopicRequest(config=pymq_pb2.TopicConfig(
                topic_name="bad", read_queue_nums=1, write_queue_nums=1, perm=6, message_type="ORDERED")))
        assert "message type 'ORDERED' for topic 'bad' is not one of NORMAL, FIFO" in str(err.value.details())
        assert admin_main(["-e", broker.endpoint, "create-topic", "cli-fifo", "--message-type", "fifo"]) == 0
        assert "FIFO messages" in capsys.readouterr().out
        broker.restart()
        again = Admin(broker.endpoint)
        assert again.topic_config("typed").message_type == "DELAY"
        assert again.topic_config("cli-fifo").message_type == "FIFO"

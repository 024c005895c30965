"""apache.rocketmq.v2 with authentication and authorization on: the official Python client signs its
requests with a user's access key / secret key and the broker checks them against the same users and
ACLs as its own RPCs (RocketMQ 5's ACL 2.0 rules for gRPC requests)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import grpc
import pytest
from broker_process import BrokerProcess
from pymq_proto.rocketmq_v2 import definition_pb2 as v2
from pymq_proto.rocketmq_v2 import service_pb2 as sv
from pymq_proto.rocketmq_v2 import service_pb2_grpc
from pyspark_pymq.client import Admin
from pyspark_pymq.client.transport import sign_metadata
from rocketmq import ClientConfiguration, Credentials, FilterExpression, Message, SimpleConsumer
from rocketmq import Producer as V2Producer

ROOT, ROOT_PW = "root", "root-secret"


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    args = ["--authentication-enabled", "--authorization-enabled", "--init-authentication-user",
            f"{ROOT}:{ROOT_PW}", "--min-invisible-time-mills-for-recv", "1000"]
    with BrokerProcess(tmp_path_factory.mktemp("v2-auth"), args) as proc:
        yield proc


def _name(prefix: str) -> str:
    return f"{prefix}{uuid.uuid4().hex[:8]}"


def _config(endpoint: str, user: str = "", password: str = "") -> ClientConfiguration:
    return ClientConfiguration(endpoint, Credentials(user, password), request_timeout=5)


def _message(topic: str, body: bytes) -> Message:
    m = Message()
    m.topic = topic
    m.body = body
    return m


def _stub(endpoint: str) -> Any:
    return service_pb2_grpc.MessagingServiceStub(grpc.insecure_channel(endpoint))


def test_signed_official_clients_send_and_receive_within_their_acls(broker: BrokerProcess) -> None:
    ep = broker.endpoint
    admin = Admin(ep, access_key=ROOT, secret_key=ROOT_PW)
    topic, group = _name("v2aT"), _name("v2aG")
    admin.create_topic(topic, 1)
    admin.create_user("app", "app-pw")
    admin.create_acl("User:app", [f"Topic:{topic}"], ["Pub", "Sub"])
    admin.create_acl("User:app", [f"Group:{group}"], ["Sub"])
    producer = V2Producer(_config(ep, "app", "app-pw"), (topic,))
    producer.startup()
    consumer = SimpleConsumer(_config(ep, "app", "app-pw"), group, {topic: FilterExpression("*")},
                              await_duration=2)
    consumer.startup()
    try:
        sent = producer.send(_message(topic, b"signed"))
        assert sent.message_id
        got: list[Any] = []
        for _ in range(20):
            got += consumer.receive(16, 10)
            if got:
                break
        assert [m.body for m in got] == [b"signed"]
        consumer.ack(got[0])
    finally:
        consumer.shutdown()
        producer.shutdown()


def test_v2_requests_are_refused_without_rights_or_a_valid_signature(broker: BrokerProcess) -> None:
    ep = broker.endpoint
    admin = Admin(ep, access_key=ROOT, secret_key=ROOT_PW)
    topic, other = _name("v2aT"), _name("v2aT")
    admin.create_topic(topic, 1)
    admin.create_topic(other, 1)
    admin.create_user("reader", "reader-pw")
    admin.create_acl("User:reader", [f"Topic:{topic}"], ["Sub"])
    stub = _stub(ep)

    def send(to: str, metadata: Any) -> v2.Status:
        msg = v2.Message(topic=v2.Resource(name=to), body=b"x")
        msg.system_properties.message_id = uuid.uuid4().hex
        msg.system_properties.body_encoding = v2.IDENTITY
        msg.system_properties.message_type = v2.NORMAL
        resp = stub.SendMessage(sv.SendMessageRequest(messages=[msg]), metadata=metadata, timeout=10)
        return resp.status

    unsigned = send(topic, ())
    assert unsigned.code == v2.UNAUTHORIZED and "not signed" in unsigned.message
    wrong = send(topic, sign_metadata("reader", "not-the-password"))
    assert wrong.code == v2.UNAUTHORIZED and "not-the-password" not in wrong.message
    denied = send(topic, sign_metadata("reader", "reader-pw"))  # Sub, not Pub
    assert denied.code == v2.FORBIDDEN
    assert "reader" in denied.message and f"Topic:{topic}" in denied.message and "Pub" in denied.message
    assert send(other, sign_metadata(ROOT, ROOT_PW)).code == v2.OK  # a Super user may
    # a consumer's receive needs Sub on its group too
    receive = sv.ReceiveMessageRequest(
        group=v2.Resource(name="no-rights-group"),
        message_queue=v2.MessageQueue(topic=v2.Resource(name=topic), id=-1),
        filter_expression=v2.FilterExpression(type=v2.TAG, expression="*"), batch_size=1,
        auto_renew=True)
    answers = list(stub.ReceiveMessage(receive, metadata=sign_metadata("reader", "reader-pw"), timeout=10))
    assert answers[0].status.code == v2.FORBIDDEN and "Group:no-rights-group" in answers[0].status.message
    # the official producer of a user without Pub is refused at its first send
    producer = V2Producer(_config(ep, "reader", "reader-pw"), (topic,))
    producer.startup()
    try:
        with pytest.raises(Exception, match=r"(?i)forbidden|may not"):
            producer.send(_message(topic, b"refused"))
    finally:
        producer.shutdown()
    stats = Admin(ep, access_key=ROOT, secret_key=ROOT_PW).topic_stats(topic)
    assert int(stats["max_offset"].sum()) == 0  # nothing refused was stored


def test_every_v2_rpc_has_an_authorization_rule() -> None:
    from pymq_broker.auth.rpc_resources import RULES

    served = {m.name for m in sv.DESCRIPTOR.services_by_name["MessagingService"].methods}
    missing = {name for name in served if f"v2/{name}" not in RULES} - {"SyncLiteSubscription"}
    assert not missing, f"v2 RPCs without a rule (Super-only): {sorted(missing)}"

"""apache.rocketmq.v2 with authentication and authorization on: the official Python client signs its
requests with a user's access key / secret key and the broker checks them against the same users and
ACLs as its own RPCs (RocketMQ 5's ACL 2.0 rules for gRPC requests)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from broker_process import BrokerProcess
from pymq_proto.rocketmq_v2 import definition_pb2 as v2
from pymq_proto.rocketmq_v2 import service_pb2 as sv
from pymq_proto.rocketmq_v2 import service_pb2_grpc
from pyspark_pymq.client import Admin, LocalTransactionState
from pyspark_pymq.client import Message as PymqMessage
from pyspark_pymq.client.transaction import TransactionProducer
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

    # each rule reads only fields its request has (QueryOffset's has no group: an AttributeError
    # failed every QueryOffset, a Super user's too, as INTERNAL)
    for method in sv.DESCRIPTOR.services_by_name["MessagingService"].methods:
        rule = RULES.get(f"v2/{method.name}")
        if callable(rule):
            # (Telemetry's rule reads the settings a command carries)
            request = v2.Settings() if method.name == "Telemetry" else getattr(sv, method.input_type.name)()
            assert isinstance(rule(request, "broker-a"), list), method.name


def test_v2_query_offset_needs_sub_or_get_on_the_topic(broker: BrokerProcess) -> None:
    ep = broker.endpoint
    admin = Admin(ep, access_key=ROOT, secret_key=ROOT_PW)
    topic = _name("v2qoT")
    admin.create_topic(topic, 1)
    admin.create_user("qo-reader", "pw")
    admin.create_acl("User:qo-reader", [f"Topic:{topic}"], ["Get"])
    admin.create_user("qo-none", "pw")
    stub = _stub(ep)
    query = sv.QueryOffsetRequest(message_queue=v2.MessageQueue(topic=v2.Resource(name=topic), id=0),
                                  query_offset_policy=v2.END)
    for user, password in ((ROOT, ROOT_PW), ("qo-reader", "pw")):
        answer = stub.QueryOffset(query, metadata=sign_metadata(user, password), timeout=10)
        assert answer.status.code == v2.OK and answer.offset == 0, (user, answer.status)
    denied = stub.QueryOffset(query, metadata=sign_metadata("qo-none", "pw"), timeout=10).status
    assert denied.code == v2.FORBIDDEN and f"Sub or Get on Topic:{topic}" in denied.message, denied


def test_a_v2_publisher_hears_only_its_topics_check_backs_while_it_may_publish(tmp_path: Path) -> None:
    """A Telemetry stream publishing topic X hears the check-backs of v2 transactions sent to X, not
    those of v1 producer group X (another namespace: Pub on Topic:X is no right on Group:X), and
    none once its user lost Pub on X."""
    import asyncio

    args = ["--authentication-enabled", "--authorization-enabled", "--init-authentication-user",
            f"{ROOT}:{ROOT_PW}", "--transaction-timeout", "300", "--transaction-check-interval", "200",
            "--transaction-check-max", "100"]
    with BrokerProcess(tmp_path / "b", args) as proc:
        ep = proc.endpoint
        admin = Admin(ep, access_key=ROOT, secret_key=ROOT_PW)
        admin.create_topic("cb-tx", 1)
        admin.create_topic("cb-v2", 1, message_type="TRANSACTION")
        # a v1 transaction of producer group cb-group in cb-tx, left to the check-back
        v1 = TransactionProducer(ep, "cb-group", lambda m: LocalTransactionState.UNKNOW, access_key=ROOT,
                                 secret_key=ROOT_PW)
        try:
            v1.send_message_in_transaction(PymqMessage("cb-tx", b"v1 half"),
                                           lambda m, a: LocalTransactionState.UNKNOW)
        finally:
            v1.close()
        admin.create_user("pub", "pw")
        admin.create_acl("User:pub", ["Topic:cb-group", "Topic:cb-v2"], ["Pub"])

        async def watch() -> tuple[list[str], list[int]]:
            channel = grpc.aio.insecure_channel(ep)
            stub = service_pb2_grpc.MessagingServiceStub(channel)
            # a v2 transaction in cb-v2, left to the check-back too
            msg = v2.Message(topic=v2.Resource(name="cb-v2"), body=b"v2 half")
            msg.system_properties.message_id = uuid.uuid4().hex.upper()
            msg.system_properties.body_encoding = v2.IDENTITY
            msg.system_properties.message_type = v2.TRANSACTION
            sent = await stub.SendMessage(sv.SendMessageRequest(messages=[msg]),
                                          metadata=sign_metadata(ROOT, ROOT_PW), timeout=10)
            assert sent.status.code == v2.OK, sent.status.message
            commands: asyncio.Queue[sv.TelemetryCommand] = asyncio.Queue()
            settings = v2.Settings(client_type=v2.PRODUCER, publishing=v2.Publishing(
                topics=[v2.Resource(name="cb-group"), v2.Resource(name="cb-v2")]))

            async def requests() -> Any:
                yield sv.TelemetryCommand(settings=settings)
                await asyncio.Event().wait()  # the stream stays open

            metadata = (*sign_metadata("pub", "pw"), ("x-mq-client-id", "cb-client"))
            call = stub.Telemetry(requests(), metadata=metadata)

            async def read() -> None:
                async for command in call:
                    await commands.put(command)

            reader = asyncio.ensure_future(read())
            topics: list[str] = []
            codes: list[int] = []
            revoked = False
            loop = asyncio.get_running_loop()
            deadline = loop.time() + 15
            quiet_until = None
            while loop.time() < deadline:
                try:
                    command = await asyncio.wait_for(commands.get(), 0.5)
                except asyncio.TimeoutError:
                    if quiet_until is not None and loop.time() > quiet_until:
                        break
                    continue
                if command.HasField("recover_orphaned_transaction_command"):
                    topics.append(command.recover_orphaned_transaction_command.message.topic.name)
                    if not revoked and topics.count("cb-v2") >= 2:  # a while of checks: none of cb-group's
                        revoked = True
                        await asyncio.to_thread(admin.delete_acl, "User:pub", ["Topic:cb-v2"])
                elif command.status.code != v2.OK:
                    codes.append(command.status.code)
                    quiet_until = loop.time() + 1.5  # then no more check-backs
                    topics.append("--revoked--")
            call.cancel()
            reader.cancel()
            await channel.close()
            return topics, codes

        topics, codes = asyncio.run(watch())
        assert "cb-tx" not in topics, topics  # v1 group cb-group's half message never reached Topic:cb-group
        assert topics[:2] == ["cb-v2", "cb-v2"], topics
        assert codes[:1] == [v2.FORBIDDEN], codes
        assert topics[-1] == "--revoked--", topics  # nothing after Pub was revoked


def test_a_v2_failure_status_echoes_a_bounded_message() -> None:
    """An unexpected error's repr (which may hold a request's value) is cut as a BrokerException's
    remark is: the Status must not carry megabytes back."""
    from pymq_broker.common.broker_exception import MAX_REMARK_BYTES, BrokerException
    from pymq_broker.proxy.grpc_messaging_service import _failure_status
    from pymq_broker.proxy.status import ProxyException

    for err in (ValueError("x" * 100_000), ProxyException(v2.BAD_REQUEST, "y" * 100_000),
                BrokerException(1, "z" * 100_000)):
        answer = _failure_status(err, "SendMessage")
        assert len(answer.message.encode()) <= MAX_REMARK_BYTES and "more bytes cut" in answer.message

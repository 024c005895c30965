"""Authentication (RocketMQ 5's gRPC signature) and authorization (ACL 2.0) against a real broker process."""

from __future__ import annotations

import asyncio
import os
import stat
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from broker_process import BrokerProcess
from pymq_broker.auth.auth_admin_processor import AuthAdminProcessor
from pymq_broker.auth.authentication import AuthenticationHeader, DefaultAuthenticationProvider
from pymq_broker.auth.metadata_provider import AuthenticationMetadataProvider, AuthorizationMetadataProvider
from pymq_broker.auth.model import User, UserType
from pymq_broker.common.broker_exception import BrokerException
from pymq_proto.topics import get_dlq_topic, get_retry_topic
from pymq_proto.v1 import pymq_pb2, pymq_pb2_grpc
from pyspark_pymq.admin_cli import main as admin_main
from pyspark_pymq.backend.base import BackendConfig, parse_backend_options
from pyspark_pymq.client import Admin, LocalTransactionState, Message, MessageQueue, Producer, PullConsumer
from pyspark_pymq.client.transaction import TransactionProducer
from pyspark_pymq.client.transport import BrokerClient, sign_metadata
from pyspark_pymq.errors import AccessDeniedError, AuthenticationError, NoPermissionError, PymqError

ROOT, ROOT_PW = "root", "root-secret"
HALF_TOPIC = "RMQ_SYS_TRANS_HALF_TOPIC"
AUTH_ARGS = ["--authentication-enabled", "--authorization-enabled",
             "--init-authentication-user", f"{ROOT}:{ROOT_PW}",
             "--message-delay-level", "100ms 200ms 300ms", "--transaction-timeout", "60000"]


@pytest.fixture(scope="module")
def auth_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    with BrokerProcess(tmp_path_factory.mktemp("auth-broker"), AUTH_ARGS) as proc:
        yield proc


def root_admin(endpoint: str) -> Admin:
    return Admin(endpoint, access_key=ROOT, secret_key=ROOT_PW)


def raw_stub(endpoint: str) -> pymq_pb2_grpc.BrokerStub:
    return pymq_pb2_grpc.BrokerStub(grpc.insecure_channel(endpoint))


def rpc_code(err: Any) -> str:
    """The broker's ResponseCode of a failed raw gRPC call."""
    return str(dict(err.trailing_metadata() or ())["pymq-response-code"])


def details(err: Any) -> str:
    return str(err.details())


# -- the signature ---------------------------------------------------------------------------


def test_signature_is_rocketmq_clients_format_and_checked_by_openssl() -> None:
    """x-mq-date-time + MQv2-HMAC-SHA1 authorization, as rocketmq-clients' Signature.sign writes
    them; the hex is HMAC-SHA1(secret, date-time), computed independently by openssl here."""
    when = 1703706379.0  # 2023-12-27T19:46:19Z
    md = dict(sign_metadata("abc", "s3cret", now=when))
    assert md["x-mq-date-time"] == "20231227T194619Z"
    expected = subprocess.run(
        ["openssl", "dgst", "-sha1", "-hmac", "s3cret"], input=b"20231227T194619Z",
        capture_output=True, check=True,
    ).stdout.decode().split("=")[-1].strip()
    assert md["authorization"] == (
        f"MQv2-HMAC-SHA1 Credential=abc, SignedHeaders=x-mq-date-time, Signature={expected}"
    )
    header = AuthenticationHeader.parse(md["authorization"])
    assert (header.access_key, header.signed_headers, header.signature) == ("abc", "x-mq-date-time", expected)
    # Go / C++ clients: Credential=<ak>//Rocketmq, and upper-case hex from some clients
    go = AuthenticationHeader.parse(
        "MQv2-HMAC-SHA1 Credential=abc//Rocketmq, SignedHeaders=x-mq-date-time, "
        f"Signature={expected.upper()}")
    assert (go.access_key, go.signature) == ("abc", expected)


def test_authentication_provider_bounds_the_date_time(tmp_path: Path) -> None:
    users = AuthenticationMetadataProvider(tmp_path / "users.json")
    users.users["abc"] = User("abc", "s3cret")
    provider = DefaultAuthenticationProvider(users, clock_skew_ms=60_000)
    assert provider.authenticate(dict(sign_metadata("abc", "s3cret"))).username == "abc"
    for now, word in ((time.time() - 120, "old"), (time.time() + 120, "ahead")):
        with pytest.raises(BrokerException, match=f"s {word}") as info:
            provider.authenticate(dict(sign_metadata("abc", "s3cret", now=now)))
        assert info.value.code == pymq_pb2.UNAUTHORIZED
    with pytest.raises(BrokerException, match="signature of user 'abc' is wrong"):
        provider.authenticate(dict(sign_metadata("abc", "other")))
    with pytest.raises(BrokerException, match="not yyyyMMdd"):
        provider.authenticate({**dict(sign_metadata("abc", "s3cret")), "x-mq-date-time": "yesterday"})


def test_signed_clients_end_to_end(auth_broker: BrokerProcess) -> None:
    ep = auth_broker.endpoint
    admin = root_admin(ep)
    admin.create_topic("auth-orders", 2)
    admin.create_user("alice", "alice-pw")
    admin.create_acl("User:alice", ["Topic:auth-orders", "Group:auth-g"], ["Pub", "Sub"])
    with Producer(ep, access_key="alice", secret_key="alice-pw") as producer:
        sent = producer.send(Message("auth-orders", b"signed body", keys=["k1"]))
    consumer = PullConsumer(ep, "auth-g", access_key="alice", secret_key="alice-pw")
    mq = MessageQueue("auth-orders", sent.message_queue.broker_name, sent.message_queue.queue_id)
    assert [m.body for m in consumer.pull(mq, 0).messages] == [b"signed body"]
    consumer.commit(mq, 1)
    assert consumer.committed(mq) == 1

    # unsigned, unknown user, wrong secret: refused before anything is done, and say why
    with pytest.raises(AuthenticationError, match="not signed: give the client access_key"):
        Admin(ep).topics()
    with pytest.raises(AuthenticationError, match="user 'mallory' does not exist"):
        Admin(ep, access_key="mallory", secret_key="x").topics()
    with pytest.raises(AuthenticationError, match="signature of user 'alice' is wrong") as info:
        PullConsumer(ep, "auth-g", access_key="alice", secret_key="guess").pull(mq, 0)
    assert "guess" not in str(info.value)
    with pytest.raises(AuthenticationError):
        Producer(ep).send(Message("auth-orders", b"anonymous"))
    assert consumer.max_offset(mq) == 1  # nothing anonymous got in

    # a disabled user is refused; a changed password takes effect at once
    admin.update_user("alice", user_status="disable")
    with pytest.raises(AuthenticationError, match="user 'alice' is disabled"):
        consumer.pull(mq, 0)
    admin.update_user("alice", password="new-pw", user_status="enable")
    with pytest.raises(AuthenticationError, match="signature of user 'alice' is wrong"):
        consumer.pull(mq, 0)
    assert PullConsumer(ep, "auth-g", access_key="alice", secret_key="new-pw").pull(mq, 0).messages
    log = "".join(auth_broker.output)  # the broker's log: no password, no secret a client tried
    assert all(secret not in log for secret in ("alice-pw", "new-pw", "guess", ROOT_PW))


def test_expired_and_replayed_signatures_are_refused(auth_broker: BrokerProcess, tmp_path: Path) -> None:
    stub = raw_stub(auth_broker.endpoint)
    fresh = sign_metadata(ROOT, ROOT_PW)
    assert stub.ListTopics(pymq_pb2.ListTopicsRequest(), metadata=fresh) is not None
    for age in (600, -600):  # 10 minutes old, or ahead: outside the 5-minute window
        with pytest.raises(grpc.RpcError) as info:
            stub.ListTopics(pymq_pb2.ListTopicsRequest(),
                            metadata=sign_metadata(ROOT, ROOT_PW, time.time() - age))
        assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert rpc_code(info.value) == "UNAUTHORIZED"
        assert "x-mq-date-time" in details(info.value)

    # a captured header replayed: valid within the broker's window only (2 s here)
    with BrokerProcess(tmp_path / "short", [*AUTH_ARGS, "--authentication-clock-skew-ms", "2000"]) as short:
        captured = sign_metadata(ROOT, ROOT_PW)
        short_stub = raw_stub(short.endpoint)
        short_stub.ListTopics(pymq_pb2.ListTopicsRequest(), metadata=captured)
        time.sleep(3.2)
        with pytest.raises(grpc.RpcError) as info:
            short_stub.DeleteTopic(pymq_pb2.DeleteTopicRequest(topic="whatever"), metadata=captured)
        assert rpc_code(info.value) == "UNAUTHORIZED"
        assert "old" in details(info.value)
        # a tampered signature (same date-time) is refused too
        date_time, authorization = captured[0][1], captured[1][1]
        forged = ((captured[0][0], date_time), ("authorization", authorization[:-4] + "0000"))
        with pytest.raises(grpc.RpcError) as info:
            short_stub.ListTopics(pymq_pb2.ListTopicsRequest(), metadata=forged)
        assert rpc_code(info.value) == "UNAUTHORIZED"


# -- the ACL matrix --------------------------------------------------------------------------

Op = Callable[[str, str, str], Any]  # (endpoint, access key, secret key) -> result
# MATRIX: (name, the allowed user's grants [(resources, actions)], operation,
#          (resource, action) of the denial)


def op_send(topic: str) -> Op:
    def run(ep: str, ak: str, sk: str) -> Any:
        with Producer(ep, access_key=ak, secret_key=sk, retry_times_when_send_failed=0) as p:
            return p.send(Message(topic, b"matrix"))
    return run


def op_pull(topic: str, group: str) -> Op:
    def run(ep: str, ak: str, sk: str) -> Any:
        consumer = PullConsumer(ep, group, access_key=ak, secret_key=sk)
        return consumer.pull(MessageQueue(topic, "broker-a", 0), 0)
    return run


def op_commit(topic: str, group: str) -> Op:
    def run(ep: str, ak: str, sk: str) -> Any:
        PullConsumer(ep, group, access_key=ak, secret_key=sk).commit(MessageQueue(topic, "broker-a", 0), 0)
    return run


def op_send_back(topic: str, group: str) -> Op:
    def run(ep: str, ak: str, sk: str) -> Any:
        msg = PullConsumer(ep, "matrix-root", access_key=ROOT, secret_key=ROOT_PW).pull(
            MessageQueue(topic, "broker-a", 0), 0).messages[0]
        return PullConsumer(ep, group, access_key=ak, secret_key=sk).send_back(msg)
    return run


def op_send_back_naming_another_topic(topic: str, group: str, claimed_topic: str) -> Op:
    """A send back whose request claims another origin topic than the stored message's."""
    def run(ep: str, ak: str, sk: str) -> Any:
        msg = PullConsumer(ep, "matrix-root", access_key=ROOT, secret_key=ROOT_PW).pull(
            MessageQueue(topic, "broker-a", 0), 0).messages[0]
        return BrokerClient(ep, access_key=ak, secret_key=sk).consumer_send_msg_back(
            pymq_pb2.ConsumerSendMsgBackRequest(group=group, commit_log_offset=msg.commit_log_offset,
                                                origin_topic=claimed_topic, origin_msg_id=msg.msg_id))
    return run


def op_admin(call: Callable[[Admin], Any]) -> Op:
    def run(ep: str, ak: str, sk: str) -> Any:
        return call(Admin(ep, access_key=ak, secret_key=sk))
    return run


# (name, grants of the allowed user: [(resources, actions)], operation, resource and action a denial names)
MATRIX: list[tuple[str, list[tuple[list[str], list[str]]], Op, tuple[str, str]]] = [
    ("send", [(["Topic:mx-t"], ["Pub"])], op_send("mx-t"), ("Topic:mx-t", "Pub")),
    ("pull needs the topic", [(["Topic:mx-t", "Group:mx-g"], ["Sub"])], op_pull("mx-t", "mx-g"),
     ("Topic:mx-t", "Sub")),
    ("pull needs the group", [(["Topic:mx-t", "Group:mx-g"], ["Sub"])], op_pull("mx-t", "mx-g"),
     ("Group:mx-g", "Sub")),
    ("commit", [(["Topic:mx-t", "Group:mx-g"], ["Sub"])], op_commit("mx-t", "mx-g"), ("Group:mx-g", "Sub")),
    ("send back", [(["Topic:mx-t", "Group:mx-g"], ["Sub"])], op_send_back("mx-t", "mx-g"),
     ("Group:mx-g", "Sub")),
    ("send back of another topic's message", [(["Topic:mx-t", "Topic:mx-other", "Group:mx-g"], ["Sub"])],
     op_send_back_naming_another_topic("mx-t", "mx-g", "mx-other"), ("", "send back the message at")),
    ("pull the retry topic", [(["Group:mx-g"], ["Sub"])], op_pull(get_retry_topic("mx-g"), "mx-g"),
     ("Group:mx-g", "Sub")),
    ("send to the retry topic", [(["Group:mx-g"], ["Sub"])], op_send(get_retry_topic("mx-g")),
     ("Group:mx-g", "Sub")),
    ("pull the dead letters", [(["Group:mx-g"], ["Sub"])], op_pull(get_dlq_topic("mx-g"), "mx-g"),
     ("Group:mx-g", "Sub")),
    ("delete the dead letters", [(["Group:mx-g"], ["Delete"])],
     op_admin(lambda a: a._client.delete_topic(pymq_pb2.DeleteTopicRequest(topic=get_dlq_topic("mx-g")))),
     ("Group:mx-g", "Delete")),
    ("pull the half topic", [([f"Topic:{HALF_TOPIC}", "Group:mx-g"], ["Sub"])],
     op_pull(HALF_TOPIC, "mx-g"), (f"Topic:{HALF_TOPIC}", "Pub or Sub or Get")),
    ("create a topic", [(["Topic:mx-new"], ["Create"])], op_admin(lambda a: a.create_topic("mx-new", 1)),
     ("Topic:mx-new", "Create")),
    ("update a topic", [(["Topic:mx-t"], ["Update"])], op_admin(lambda a: a.create_topic("mx-t", 1)),
     ("Topic:mx-t", "Update")),
    ("delete a topic", [(["Topic:mx-del"], ["Delete"])], op_admin(lambda a: a.delete_topic("mx-del")),
     ("Topic:mx-del", "Delete")),
    ("update a group", [(["Group:mx-g"], ["Update"])], op_admin(
        lambda a: a._client.update_subscription_group(pymq_pb2.UpdateSubscriptionGroupRequest(
            config=pymq_pb2.SubscriptionGroupConfig(group_name="mx-g", retry_max_times=3, retry_queue_nums=1,
                                                    consume_enable=True)))),
     ("Group:mx-g", "Update")),
    ("reset offsets needs the group", [(["Topic:mx-t", "Group:mx-g"], ["Update"])],
     op_admin(lambda a: a.reset_offset("mx-g", "mx-t", 0)), ("Group:mx-g", "Update")),
    ("reset offsets needs the topic", [(["Topic:mx-t", "Group:mx-g"], ["Update"])],
     op_admin(lambda a: a.reset_offset("mx-g", "mx-t", 0)), ("Topic:mx-t", "Update")),
    ("get a group", [(["Group:mx-g"], ["Get"])], op_admin(lambda a: a._client.get_subscription_group(
        pymq_pb2.GetSubscriptionGroupRequest(group_name="mx-g"))), ("Group:mx-g", "Get")),
    ("topic stats", [(["Topic:mx-t"], ["Get"])], op_admin(lambda a: a._client.topic_stats(
        pymq_pb2.TopicStatsRequest(topic="mx-t"))), ("Topic:mx-t", "Sub or Get")),
    ("list topics", [(["Cluster:*"], ["List"])], op_admin(lambda a: a._client.list_topics(
        pymq_pb2.ListTopicsRequest())), ("Cluster:broker-a", "List")),
    ("broker info", [(["Cluster:broker-a"], ["Get"])], op_admin(lambda a: a.broker_info()),
     ("Cluster:broker-a", "Get")),
]


def test_a_topic_updated_by_a_user_who_may_not_list_topics_keeps_what_is_not_given(
    auth_broker: BrokerProcess,
) -> None:
    """The client read the topic's settings with ListTopics (Cluster List): for a user without it
    an update reset the permission and the de-duplication window and cut queues holding unread
    messages. The broker now keeps what is not given and checks the cut itself."""
    ep = auth_broker.endpoint
    admin = root_admin(ep)
    admin.create_topic("kp-t", 4, dedup_window_ms=60000)
    with Producer(ep, access_key=ROOT, secret_key=ROOT_PW) as p:
        for _ in range(8):
            p.send(Message("kp-t", b"m"))
    admin.create_topic("kp-t", perm=4)  # read only
    admin.create_user("kp-alice", "pw-alice")
    admin.create_acl("User:kp-alice", ["Topic:kp-t"], ["Create", "Update", "Get", "Sub", "Pub"])
    alice = Admin(ep, access_key="kp-alice", secret_key="pw-alice")
    with pytest.raises(AccessDeniedError):
        alice.topic_config("kp-t")  # she cannot list
    with pytest.raises(PymqError, match=r"queue\(s\) \[2, 3\] hold messages no consumer group has read"):
        alice.create_topic("kp-t", 2)
    kept = alice.create_topic("kp-t", message_type="FIFO")
    assert (kept.read_queue_nums, kept.perm, kept.dedup_window_ms, kept.message_type) == (4, 4, 60000, "FIFO")


@pytest.mark.parametrize("case", range(len(MATRIX)), ids=[m[0] for m in MATRIX])
def test_acl_matrix(auth_broker: BrokerProcess, case: int) -> None:
    """Each action: a user with exactly its grants may; a user without (or with the grants on
    other resources) gets AccessDeniedError naming user, resource and action, and no data."""
    name, grants, op, (resource, action) = MATRIX[case]
    ep = auth_broker.endpoint
    admin = root_admin(ep)
    for topic in ("mx-t", "mx-other"):
        admin.create_topic(topic, 1)
    admin.create_topic("mx-del", 1)
    with Producer(ep, access_key=ROOT, secret_key=ROOT_PW) as p:
        p.send(Message("mx-t", b"private payload"))
        p.send(Message("mx-other", b"other payload"))
    if "dead letters" in name or "retry" in name:  # %RETRY%mx-g (registration) and %DLQ%mx-g (a dead letter)
        root = PullConsumer(ep, "mx-g", access_key=ROOT, secret_key=ROOT_PW)
        root.register("mx-t")
        first = root.pull(MessageQueue("mx-t", "broker-a", 0), 0).messages[0]
        root.send_back(first, delay_level=-1)
    admin._client.update_subscription_group(pymq_pb2.UpdateSubscriptionGroupRequest(
        config=pymq_pb2.SubscriptionGroupConfig(group_name="mx-g", retry_max_times=3, retry_queue_nums=1,
                                                consume_enable=True)))
    if "half topic" in name:  # a pending transaction's half message
        tp = TransactionProducer(ep, "mx-pg", lambda m: LocalTransactionState.UNKNOW, access_key=ROOT,
                                 secret_key=ROOT_PW)
        tp.send_message_in_transaction(Message("mx-t", b"half secret"),
                                       lambda m, a: LocalTransactionState.UNKNOW)
        tp.close()

    allowed, denied = f"ok{case}", f"no{case}"
    admin.create_user(allowed, "pw-ok")
    admin.create_user(denied, "pw-no")
    for resources, actions in grants:
        admin.create_acl(f"User:{allowed}", resources, actions)
    # the denied user holds every action on other resources, and the grants minus the one checked
    admin.create_acl(f"User:{denied}", ["Topic:mx-other", "Group:mx-other-g"], ["All"])
    partial = {  # what lets the denied user get as far as the request checked (routes need Get)
        "send": [(["Topic:mx-t"], ["Get", "Sub"])],
        "update a topic": [(["Topic:mx-t"], ["Create"])],
        "send to the retry topic": [(["Group:mx-g"], ["Get"])],
        "pull the retry topic": [(["Group:mx-g"], ["Get"])],
        "pull the dead letters": [(["Group:mx-g"], ["Get"])],
        "delete the dead letters": [(["Group:mx-g"], ["Sub", "Get"])],
        "pull needs the topic": [(["Group:mx-g"], ["Sub"]), (["Topic:mx-t"], ["Get"])],
        "pull needs the group": [(["Topic:mx-t"], ["Sub"])],
        "commit": [(["Topic:mx-t"], ["Sub"])],
        "reset offsets needs the group": [(["Topic:mx-t"], ["Update"]), (["Group:mx-g"], ["Sub", "Get"])],
        "reset offsets needs the topic": [(["Group:mx-g"], ["Update"]), (["Topic:mx-t"], ["Sub", "Get"])],
        "send back": [(["Topic:mx-t"], ["Sub"])],
        "send back of another topic's message": [(["Group:mx-g"], ["Sub"])],
        "pull the half topic": [(["Topic:*", "Group:mx-g"], ["Sub"])],  # a pattern never covers it
    }.get(name, [])
    for resources, actions in partial:
        admin.create_acl(f"User:{denied}", resources, actions)

    with pytest.raises(AccessDeniedError) as info:  # first: the allowed call may change what is there
        op(ep, denied, "pw-no")
    if "half topic" in name:  # even Topic:* does not open a system topic; a literal grant does
        assert op(ep, allowed, "pw-ok").messages
    else:
        op(ep, allowed, "pw-ok")
    err = info.value
    assert isinstance(err, NoPermissionError) and err.code == "FORBIDDEN"
    # (a send back's refusal names the offset, not the stored record's topic: test_send_back_...)
    expected = f"user '{denied}' may not {action}" + (f" on {resource} (" if resource else "")
    assert expected in str(err), str(err)
    assert "payload" not in str(err) and "secret" not in str(err)


def test_a_send_back_refusal_names_no_topic_or_group_the_user_cannot_read(auth_broker: BrokerProcess) -> None:
    """A send back names records by commit-log offset: its refusal named the stored record's topic
    (or %RETRY%/%DLQ% group), so probing offsets listed names the user may not see."""
    ep = auth_broker.endpoint
    admin = root_admin(ep)
    admin.create_topic("sb-hidden-orders", 1)
    admin.create_topic("sb-mine", 1)
    with Producer(ep, access_key=ROOT, secret_key=ROOT_PW) as p:
        hidden = p.send(Message("sb-hidden-orders", b"x"))
    retry = raw_stub(ep).SendMessage(pymq_pb2.SendMessageRequest(  # (a retry topic: created at a send)
        producer_group="sb-p", topic=get_retry_topic("sb-hidden-payroll"), queue_id=0,
        messages=[pymq_pb2.MessageData(body=b"y", properties=b"UNIQ_KEY\x01SBRETRY1\x02")]),
        metadata=sign_metadata(ROOT, ROOT_PW))
    admin.create_user("sb-con", "pw")
    admin.create_acl("User:sb-con", ["Topic:sb-mine", "Group:sb-mine"], ["Sub"])
    client = BrokerClient(ep, access_key="sb-con", secret_key="pw")
    for sent in (hidden, retry):
        offset = sent.commit_log_offsets[0]
        one = pymq_pb2.ConsumerSendMsgBackRequest(group="sb-mine", origin_topic="sb-mine",
                                                  commit_log_offset=offset, delay_level=1)
        batch = pymq_pb2.ConsumerSendMsgBackBatchRequest(group="sb-mine", origin_topics=["sb-mine"],
                                                         commit_log_offsets=[offset], delay_levels=[1])
        send_back = client.consumer_send_msg_back, client.consumer_send_msg_back_batch
        for call, request in zip(send_back, (one, batch), strict=True):
            with pytest.raises(AccessDeniedError) as info:
                call(request)
            assert f"may not send back the message at commit log offset {offset}:" in str(info.value)
            assert "sb-hidden" not in str(info.value), str(info.value)


def test_a_send_to_a_retry_or_dead_letter_topic_needs_sub_on_its_origin(auth_broker: BrokerProcess) -> None:
    """A message in %RETRY%<g> / %DLQ%<g> goes back to its origin topic (RETRY_TOPIC, DLQ_ORIGIN_TOPIC):
    a consumer with rights on its group only planted one naming any topic, and an operator's
    Admin.resend_dead_letters published it there."""
    from pyspark_pymq.client.codec import encode_records

    ep = auth_broker.endpoint
    admin = root_admin(ep)
    admin.create_topic("og-payments", 1)
    admin.create_topic("og-mine", 1)
    admin.create_user("og-eve", "pw")
    admin.create_acl("User:og-eve", ["Topic:og-mine", "Group:og-g"], ["Sub"])
    stub = raw_stub(ep)

    def send(to: str, props: bytes, *, encoded: bool = False) -> pymq_pb2.SendMessageResponse:
        req = pymq_pb2.SendMessageRequest(producer_group="og-p", topic=to, queue_id=0, reconsume_times=1)
        if encoded:
            records, sizes = encode_records(to, [b"pay eve"], [props])
            req.encoded.CopyFrom(pymq_pb2.EncodedBatch(records=records, sizes=sizes.tobytes()))
        else:
            req.messages.append(pymq_pb2.MessageData(body=b"pay eve", properties=props))
        return stub.SendMessage(req, metadata=sign_metadata("og-eve", "pw"))

    def uniq() -> bytes:
        return f"UNIQ_KEY\x01{uuid.uuid4().hex.upper()}\x02".encode()

    for to, name in ((get_retry_topic("og-g"), "RETRY_TOPIC"), (get_dlq_topic("og-g"), "DLQ_ORIGIN_TOPIC")):
        for props in (f"{name}\x01og-payments\x02".encode(),
                      f"{name}\x01og-mine\x02{name}\x01og-payments\x02".encode()):  # the last entry counts
            for encoded in (False, True):
                with pytest.raises(grpc.RpcError) as info:
                    send(to, uniq() + props, encoded=encoded)
                assert rpc_code(info.value) == "FORBIDDEN", details(info.value)
                assert (f"may not send to {to} a message whose origin topic (RETRY_TOPIC / DLQ_ORIGIN_TOPIC) "
                        "is 'og-payments': it needs Sub on Topic:og-payments") in details(info.value)
    # the client's send-back fallback: a copy of a message of a topic it reads
    assert send(get_retry_topic("og-g"), uniq() + b"RETRY_TOPIC\x01og-mine\x02").status == pymq_pb2.SEND_OK
    assert admin.dead_letters("og-g").empty


def test_deny_wins_prefix_patterns_and_source_ips(auth_broker: BrokerProcess) -> None:
    ep = auth_broker.endpoint
    admin = root_admin(ep)
    for t in ("ord-1", "ord-secret", "other-1"):
        admin.create_topic(t, 1)
    admin.create_user("bob", "bob-pw")
    admin.create_acl("User:bob", ["Topic:ord-*"], ["Pub"])
    admin.create_acl("User:bob", ["Topic:ord-secret"], ["Pub"], decision="Deny")
    send = op_send
    send("ord-1")(ep, "bob", "bob-pw")
    with pytest.raises(AccessDeniedError, match="denied by the ACL entry for Topic:ord-secret"):
        send("ord-secret")(ep, "bob", "bob-pw")
    with pytest.raises(AccessDeniedError, match="on Topic:other-1"):
        send("other-1")(ep, "bob", "bob-pw")
    # an entry limited to other source addresses does not hold for 127.0.0.1
    admin.create_acl("User:bob", ["Topic:other-1"], ["Pub"], source_ips=["10.0.0.0/8"])
    with pytest.raises(AccessDeniedError, match="on Topic:other-1"):
        send("other-1")(ep, "bob", "bob-pw")
    admin.create_acl("User:bob", ["Topic:other-1"], ["Pub"], source_ips=["127.0.0.0/8"])
    send("other-1")(ep, "bob", "bob-pw")
    # a Deny for All beats any Allow
    admin.create_acl("User:bob", ["Topic:*"], ["All"], decision="Deny")
    with pytest.raises(AccessDeniedError, match="denied by the ACL entry for Topic:\\*"):
        send("ord-1")(ep, "bob", "bob-pw")
    rows = admin.list_acls(subject="User:bob", decision="Deny")
    assert sorted(rows["resource"]) == ["Topic:*", "Topic:ord-secret"]
    assert list(admin.list_acls(resources=["Topic:ord-*"])["actions"]) == ["Pub"]
    assert admin.list_acls(subject="User:bob", actions=["Sub"]).empty
    admin.delete_acl("User:bob", ["Topic:*"])
    send("ord-1")(ep, "bob", "bob-pw")


def test_peer_ip_reads_the_peers_grpc_reports() -> None:
    """gRPC reports an IPv6 peer percent-encoded (``ipv6:%5B::1%5D:port``): read as ``%5B::1%5D``,
    no source-IP entry ever covered an IPv6 client."""
    import asyncio

    from grpc import aio
    from pymq_broker.auth.auth_service import peer_ip

    async def peers() -> list[str]:
        seen: list[str] = []

        async def handler(_request: bytes, context: Any) -> bytes:
            seen.append(context.peer())
            return b""

        server = aio.server()
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(
            "t.S", {"M": grpc.unary_unary_rpc_method_handler(handler)}),))
        port = server.add_insecure_port("[::]:0")
        await server.start()
        try:
            for target in (f"[::1]:{port}", f"127.0.0.1:{port}"):
                async with aio.insecure_channel(target) as channel:
                    await channel.unary_unary("/t.S/M")(b"")
        finally:
            await server.stop(0)
        return seen

    assert [peer_ip(p) for p in asyncio.run(peers())] == ["::1", "127.0.0.1"]
    assert peer_ip("ipv6:[::1]:5123") == "::1"  # older gRPC: literal brackets
    assert peer_ip("ipv6:%5B::ffff:10.0.0.7%5D:5123") == "10.0.0.7"  # a dual-stack listener's IPv4 client
    assert peer_ip("ipv6:%5Bfe80::1%25eth0%5D:5123") == "fe80::1%eth0"
    assert peer_ip("unix:/tmp/sock") is None


def test_source_ip_entries_hold_for_ipv6_clients(tmp_path: Path) -> None:
    """A Deny limited to source IPs held for IPv4 clients only: over IPv6 it was bypassed (and an
    Allow limited to source IPs never held)."""
    with BrokerProcess(tmp_path, [*AUTH_ARGS, "--host", "[::]"]) as proc:
        port = proc.endpoint.rpartition(":")[2]
        ep4, ep6 = f"127.0.0.1:{port}", f"[::1]:{port}"
        admin = root_admin(ep4)
        admin.create_topic("ip6-secret", 1)
        admin.create_topic("ip6-open", 1)
        admin.create_user("ip6", "pw")
        admin.create_acl("User:ip6", ["Topic:*"], ["Pub"])
        admin.create_acl("User:ip6", ["Topic:ip6-secret"], ["Pub"], decision="Deny",
                         source_ips=["127.0.0.0/8", "::1/128"])
        admin.create_acl("User:ip6", ["Topic:ip6-open"], ["Pub"], decision="Deny", source_ips=["10.0.0.0/8"])
        admin.create_acl("User:ip6", ["Topic:ip6-open"], ["Sub"], source_ips=["::1/128"])
        for ep in (ep4, ep6):
            with pytest.raises(AccessDeniedError, match="denied by the ACL entry for Topic:ip6-secret"):
                op_send("ip6-secret")(ep, "ip6", "pw")
            op_send("ip6-open")(ep, "ip6", "pw")  # a Deny of other addresses does not hold
        # the Allow of ::1 holds for the IPv6 client only (a raw stub: a client follows the route's address)
        query = pymq_pb2.QueryOffsetRequest(message_queue=pymq_pb2.MessageQueue(
            topic="ip6-open", broker_name="broker-a", queue_id=0), type=pymq_pb2.END)
        assert raw_stub(ep6).QueryOffset(query, metadata=sign_metadata("ip6", "pw")).offset == 2
        with pytest.raises(grpc.RpcError) as info:
            raw_stub(ep4).QueryOffset(query, metadata=sign_metadata("ip6", "pw"))
        assert rpc_code(info.value) == "FORBIDDEN" and "on Topic:ip6-open" in details(info.value)


def test_transactions_end_only_under_their_producer_group(auth_broker: BrokerProcess) -> None:
    ep = auth_broker.endpoint
    admin = root_admin(ep)
    admin.create_topic("tx-t", 1)
    for user in ("tx-owner", "tx-other"):
        admin.create_user(user, "pw")
        admin.create_acl(f"User:{user}", ["Topic:tx-t"], ["Pub"])
    admin.create_acl("User:tx-owner", ["Group:pg-owner"], ["Pub"])
    admin.create_acl("User:tx-other", ["Group:pg-other"], ["Pub"])
    owner = TransactionProducer(ep, "pg-owner", lambda m: LocalTransactionState.UNKNOW, access_key="tx-owner",
                                secret_key="pw")
    try:
        result = owner.send_message_in_transaction(Message("tx-t", b"tx body"),
                                                   lambda m, a: LocalTransactionState.UNKNOW)
    finally:
        owner.close()
    # another producer group (its user may act for pg-other only) cannot commit or roll it back
    other = BrokerClient(ep, access_key="tx-other", secret_key="pw")
    for state in (pymq_pb2.COMMIT_MESSAGE, pymq_pb2.ROLLBACK_MESSAGE):
        with pytest.raises(AccessDeniedError, match="only the producer group that sent a transaction"):
            other.end_transaction(pymq_pb2.EndTransactionRequest(
                producer_group="pg-other", msg_id=result.msg_id, state=state))
    with pytest.raises(AccessDeniedError, match="Pub on Group:pg-owner"):  # nor name the owner's group
        other.end_transaction_batch(pymq_pb2.EndTransactionBatchRequest(
            producer_group="pg-owner", msg_ids=[result.msg_id], state=pymq_pb2.COMMIT_MESSAGE))
    with pytest.raises(AccessDeniedError, match="Pub on Group:pg-owner"):  # nor receive its check-backs
        list(other.transaction_stream(pymq_pb2.TransactionStreamRequest(producer_group="pg-owner"),
                                      timeout=5))
    consumer = PullConsumer(ep, "tx-reader", access_key=ROOT, secret_key=ROOT_PW)
    assert consumer.max_offset(MessageQueue("tx-t", "broker-a", 0)) == 0  # still pending
    owner_client = BrokerClient(ep, access_key="tx-owner", secret_key="pw")
    assert owner_client.end_transaction(pymq_pb2.EndTransactionRequest(
        producer_group="pg-owner", msg_id=result.msg_id, state=pymq_pb2.COMMIT_MESSAGE)).resolved
    assert consumer.max_offset(MessageQueue("tx-t", "broker-a", 0)) == 1


def test_view_message_by_offset_needs_the_cluster_and_by_msg_id_the_topic(auth_broker: BrokerProcess) -> None:
    """ViewMessage is a look-up by msgId in a topic (commit_log_offset -1, as the client sends it:
    Sub and Get on the topic) or a read by offset (any record: Get on the cluster). Offset 0 plus a
    readable topic once passed as a look-up and returned the commit log's first record."""
    ep = auth_broker.endpoint
    admin = root_admin(ep)
    admin.create_topic("vw-secret", 1)
    admin.create_topic("vw-mine", 1)
    with Producer(ep, access_key=ROOT, secret_key=ROOT_PW) as p:
        p.send(Message("vw-secret", b"secret payload"))
        mine = p.send(Message("vw-mine", b"my payload"))
    admin.create_user("viewer", "pw")
    admin.create_acl("User:viewer", ["Topic:vw-mine"], ["Sub", "Get"])
    viewer = Admin(ep, access_key="viewer", secret_key="pw")
    assert viewer.view_message(mine.msg_id, topic="vw-mine").body == b"my payload"
    assert [m.body for m in viewer.query_message("vw-mine", mine.msg_id)] == [b"my payload"]
    with pytest.raises(AccessDeniedError, match="Topic:vw-secret"):
        viewer.view_message(mine.msg_id, topic="vw-secret")
    stub = raw_stub(ep)
    for offset in (0, mine.commit_log_offsets[0]):  # whatever record is there, with or without a topic
        claims_mine = pymq_pb2.ViewMessageRequest(commit_log_offset=offset, topic="vw-mine",
                                                  msg_id=mine.msg_id)
        for req in (claims_mine, pymq_pb2.ViewMessageRequest(commit_log_offset=offset)):
            with pytest.raises(grpc.RpcError) as info:
                stub.ViewMessage(req, metadata=sign_metadata("viewer", "pw"))
            assert rpc_code(info.value) == "FORBIDDEN" and "Get on Cluster:broker-a" in details(info.value)
    assert admin.view_message(mine.offset_msg_id).body == b"my payload"  # the cluster's Get (Super) may
    with pytest.raises(PymqError, match="commit_log_offset"):  # neither a look-up nor an offset
        admin._client.view_message(pymq_pb2.ViewMessageRequest(commit_log_offset=-1, topic="vw-mine"))


def test_a_half_message_is_sent_only_under_its_own_producer_group(auth_broker: BrokerProcess) -> None:
    """A half message (TRAN_MSG=true) belongs to its PGROUP, whichever RPC carries it: SendMessage too
    needs Pub on the request's producer group, and the PGROUP must be that group (a half message
    planted for another group would reach that group's check-backs)."""
    from pymq_proto.record import encode_properties
    from pyspark_pymq.client.codec import encode_records

    ep = auth_broker.endpoint
    admin = root_admin(ep)
    admin.create_topic("hm-t", 1)
    admin.create_user("hm", "pw")
    admin.create_acl("User:hm", ["Topic:hm-t", "Group:hm-mine"], ["Pub"])
    stub = raw_stub(ep)

    def half(pgroup: str, uniq_key: str = "") -> bytes:
        return encode_properties({"UNIQ_KEY": uniq_key or uuid.uuid4().hex.upper(), "TRAN_MSG": "true",
                                  "PGROUP": pgroup})

    def refused(rpc: str, req: pymq_pb2.SendMessageRequest) -> str:
        with pytest.raises(grpc.RpcError) as info:
            getattr(stub, rpc)(req, metadata=sign_metadata("hm", "pw"))
        assert rpc_code(info.value) == "FORBIDDEN"
        return details(info.value)

    for rpc in ("SendMessage", "SendHalfMessageBatch"):
        as_owner = pymq_pb2.SendMessageRequest(producer_group="hm-owner", topic="hm-t", queue_id=0, messages=[
            pymq_pb2.MessageData(body=b"x", properties=half("hm-owner"))])
        assert "may not Pub on Group:hm-owner" in refused(rpc, as_owner)
        forged = pymq_pb2.SendMessageRequest(producer_group="hm-mine", topic="hm-t", queue_id=0, messages=[
            pymq_pb2.MessageData(body=b"x", properties=half("hm-owner"))])
        assert "of producer group 'hm-owner' (PGROUP) as producer group 'hm-mine'" in refused(rpc, forged)
        records, sizes = encode_records("hm-t", [b"x"], [half("hm-owner")])
        encoded = pymq_pb2.SendMessageRequest(
            producer_group="hm-mine", topic="hm-t", queue_id=0,
            encoded=pymq_pb2.EncodedBatch(records=records, sizes=sizes.tobytes()))
        assert "(PGROUP)" in refused(rpc, encoded)
        # a name given twice reads as the store reads it (the last entry): PGROUP of its own group
        # first, or TRAN_MSG=false first, does not hide the other group's PGROUP
        uniq = f"UNIQ_KEY\x01{uuid.uuid4().hex.upper()}\x02"
        for props in (uniq + "TRAN_MSG\x01true\x02PGROUP\x01hm-mine\x02PGROUP\x01hm-owner\x02",
                      uniq + "TRAN_MSG\x01false\x02TRAN_MSG\x01true\x02PGROUP\x01hm-owner\x02"):
            twice = pymq_pb2.SendMessageRequest(producer_group="hm-mine", topic="hm-t", queue_id=0, messages=[
                pymq_pb2.MessageData(body=b"x", properties=props.encode())])
            assert "of producer group 'hm-owner' (PGROUP)" in refused(rpc, twice), props
            records, sizes = encode_records("hm-t", [b"x"], [props.encode()])
            twice_encoded = pymq_pb2.SendMessageRequest(
                producer_group="hm-mine", topic="hm-t", queue_id=0,
                encoded=pymq_pb2.EncodedBatch(records=records, sizes=sizes.tobytes()))
            assert "of producer group 'hm-owner' (PGROUP)" in refused(rpc, twice_encoded), props
    # TRAN_MSG=true then false is no half message (the last entry), on the encoded fast path too
    tran_true_then_false = half("hm-owner") + b"TRAN_MSG\x01false\x02"
    records, sizes = encode_records("hm-t", [b"x"], [tran_true_then_false])
    with pytest.raises(grpc.RpcError) as info:
        stub.SendHalfMessageBatch(pymq_pb2.SendMessageRequest(
            producer_group="hm-mine", topic="hm-t", queue_id=0,
            encoded=pymq_pb2.EncodedBatch(records=records, sizes=sizes.tobytes())),
            metadata=sign_metadata("hm", "pw"))
    assert rpc_code(info.value) == "MESSAGE_ILLEGAL" and "lacks TRAN_MSG=true" in details(info.value)
    # a plain send needs the topic only; a half message of the user's own group is sent and ended
    admin.create_user("hm-plain", "pw")
    admin.create_acl("User:hm-plain", ["Topic:hm-t"], ["Pub"])
    op_send("hm-t")(ep, "hm-plain", "pw")
    msg_id = uuid.uuid4().hex.upper()
    own = pymq_pb2.SendMessageRequest(producer_group="hm-mine", topic="hm-t", queue_id=0, messages=[
        pymq_pb2.MessageData(body=b"mine", properties=half("hm-mine", msg_id))])
    assert stub.SendMessage(own, metadata=sign_metadata("hm", "pw")).status == pymq_pb2.SEND_OK
    assert BrokerClient(ep, access_key="hm", secret_key="pw").end_transaction(pymq_pb2.EndTransactionRequest(
        producer_group="hm-mine", msg_id=msg_id, state=pymq_pb2.ROLLBACK_MESSAGE)).resolved


def test_a_pending_msg_id_of_another_producer_group_refuses_a_half_message(
        auth_broker: BrokerProcess) -> None:
    """Pending transactions are found by msgId: a user who sent a half message with the msgId of
    another group's coming one had that one skipped as a retried send, answered PUT_OK (its
    producer then ran its local transaction, and its end was refused or ended the other one)."""
    from pymq_proto.record import encode_properties
    from pyspark_pymq.client.codec import encode_records

    ep = auth_broker.endpoint
    admin = root_admin(ep)
    admin.create_topic("mc-pay", 1)
    admin.create_topic("mc-mine", 1)
    admin.create_user("mc-victim", "pw")
    admin.create_acl("User:mc-victim", ["Topic:mc-pay", "Group:mc-victim-pg"], ["Pub"])
    admin.create_user("mc-mallory", "pw")
    admin.create_acl("User:mc-mallory", ["Topic:mc-mine", "Group:mc-mal-pg"], ["Pub"])
    stub = raw_stub(ep)
    msg_id = uuid.uuid4().hex.upper()

    def half(user: str, group: str, topic: str) -> pymq_pb2.SendMessageResponse:
        props = encode_properties({"UNIQ_KEY": msg_id, "TRAN_MSG": "true", "PGROUP": group})
        return stub.SendMessage(pymq_pb2.SendMessageRequest(
            producer_group=group, topic=topic, queue_id=0,
            messages=[pymq_pb2.MessageData(body=group.encode(), properties=props)]),
            metadata=sign_metadata(user, "pw"))

    assert half("mc-mallory", "mc-mal-pg", "mc-mine").status == pymq_pb2.SEND_OK
    with pytest.raises(grpc.RpcError) as info:
        half("mc-victim", "mc-victim-pg", "mc-pay")
    assert rpc_code(info.value) == "MESSAGE_ILLEGAL"
    assert f"msgId (UNIQ_KEY) {msg_id} is a pending transaction of another producer group" in details(
        info.value)
    records, sizes = encode_records("mc-pay", [b"v"], [encode_properties(
        {"UNIQ_KEY": msg_id, "TRAN_MSG": "true", "PGROUP": "mc-victim-pg"})])
    with pytest.raises(grpc.RpcError) as info:  # the encoded batch's fast path too
        stub.SendHalfMessageBatch(pymq_pb2.SendMessageRequest(
            producer_group="mc-victim-pg", topic="mc-pay", queue_id=0,
            encoded=pymq_pb2.EncodedBatch(records=records, sizes=sizes.tobytes())),
            metadata=sign_metadata("mc-victim", "pw"))
    assert rpc_code(info.value) == "MESSAGE_ILLEGAL", details(info.value)
    again = half("mc-mallory", "mc-mal-pg", "mc-mine")  # a retried send of the same group: skipped, as before
    assert again.status == pymq_pb2.SEND_OK and again.queue_offset == -1
    mallory = BrokerClient(ep, access_key="mc-mallory", secret_key="pw")
    assert mallory.end_transaction(pymq_pb2.EndTransactionRequest(
        producer_group="mc-mal-pg", msg_id=msg_id, state=pymq_pb2.ROLLBACK_MESSAGE)).resolved
    assert half("mc-victim", "mc-victim-pg", "mc-pay").status == pymq_pb2.SEND_OK  # once ended, free again


def test_acl_entries_on_retry_and_dead_letter_topics_are_refused(auth_broker: BrokerProcess) -> None:
    """A retry or dead-letter topic is checked as its group (Sub on Group:<g>): an entry on
    Topic:%DLQ%<g> was stored and listed, and never applied (a Deny on it let the DLQ be read)."""
    admin = root_admin(auth_broker.endpoint)
    admin.create_user("dlq-eve", "pw")
    for resource, instead in (("Topic:%DLQ%payroll", "Group:payroll"),
                              ("Topic:%RETRY%payroll", "Group:payroll"),
                              ("Topic:%RETRY%pay-*", "Group:pay-*"), ("Topic:%DLQ%*", "Group:*")):
        with pytest.raises(PymqError) as info:
            admin.create_acl("User:dlq-eve", ["Topic:payroll-t", resource], ["All"], decision="Deny")
        assert (f"resource {resource} is a retry or dead-letter topic" in str(info.value)
                and f"grant (or deny) on {instead} instead" in str(info.value)), str(info.value)
    assert admin.list_acls(subject="User:dlq-eve").empty  # nothing of a refused request is kept
    admin.create_acl("User:dlq-eve", ["Topic:payroll-t", "Group:payroll"], ["Sub"])
    admin.create_acl("User:dlq-eve", ["Group:payroll"], ["All"], decision="Deny")  # what holds instead
    with pytest.raises(AccessDeniedError, match="denied by the ACL entry for Group:payroll"):
        op_pull(get_dlq_topic("payroll"), "payroll")(auth_broker.endpoint, "dlq-eve", "pw")


def test_users_and_acls_are_super_only(auth_broker: BrokerProcess) -> None:
    ep = auth_broker.endpoint
    admin = root_admin(ep)
    admin.create_user("carol", "carol-pw")
    admin.create_acl("User:carol", ["Cluster:*", "Topic:*", "Group:*"], ["All"])
    carol = Admin(ep, access_key="carol", secret_key="carol-pw")
    carol.topics()  # the grant works ...
    for call in (lambda: carol.create_user("eve", "x", "Super"), lambda: carol.list_users(),
                 lambda: carol.create_acl("User:carol", ["Topic:x"], ["Pub"]), lambda: carol.list_acls(),
                 lambda: carol.update_user("carol", user_type="Super"), lambda: carol.delete_user(ROOT)):
        with pytest.raises(AccessDeniedError, match="only Super users manage users and ACLs"):
            call()
    users = admin.list_users()
    assert {"root", "carol"} <= set(users["username"])
    assert set(users.columns) == {"username", "user_type", "user_status"}  # never a password
    with pytest.raises(PymqError, match="user 'carol' exists already"):
        admin.create_user("carol", "again")
    with pytest.raises(PymqError, match="action 'Publish' is not one of"):
        admin.create_acl("User:carol", ["Topic:x"], ["Publish"])
    with pytest.raises(PymqError, match=r"resource type 'Queue' is not one of"):
        admin.create_acl("User:carol", ["Queue:x"], ["Pub"])
    with pytest.raises(PymqError, match="user 'nobody' does not exist"):
        admin.create_acl("User:nobody", ["Topic:x"], ["Pub"])


def test_users_and_acls_survive_a_restart(tmp_path: Path) -> None:
    with BrokerProcess(tmp_path / "b", AUTH_ARGS) as proc:
        admin = root_admin(proc.endpoint)
        admin.create_topic("durable-t", 1)
        admin.create_user("dave", "dave-pw")
        admin.create_acl("User:dave", ["Topic:durable-t"], ["Pub"])
        admin.create_acl("User:dave", ["Topic:durable-t"], ["Sub"], decision="Deny")  # replaces the entry
        proc.restart(crash=True)
        op_send("durable-t")(proc.endpoint, ROOT, ROOT_PW)
        with pytest.raises(AccessDeniedError, match=r"on Topic:durable-t \(denied by the ACL entry"):
            op_send("durable-t")(proc.endpoint, "dave", "dave-pw")
        acls = root_admin(proc.endpoint).list_acls(subject="User:dave")
        assert list(acls["decision"]) == ["Deny"]
        users_file = tmp_path / "b" / "config" / "users.json"
        assert stat.S_IMODE(os.stat(users_file).st_mode) == 0o600
        # --init-authentication-user creates the user once: a changed password is kept
        root_admin(proc.endpoint).update_user(ROOT, password="rotated")
        proc.restart()
        Admin(proc.endpoint, access_key=ROOT, secret_key="rotated").topics()
        with pytest.raises(AuthenticationError):
            root_admin(proc.endpoint).topics()


@pytest.mark.parametrize("crash_at", ["users", "acls"])
def test_a_crash_while_deleting_a_user_never_leaves_its_acl_behind(
    tmp_path: Path, crash_at: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # users.json and acls.json are two files: whichever write a crash interrupts, what is on disk
    # has no ACL of a deleted user (a user created again by that name would get its rights).
    def providers() -> tuple[AuthenticationMetadataProvider, AuthorizationMetadataProvider]:
        users = AuthenticationMetadataProvider(tmp_path / "users.json")
        acls = AuthorizationMetadataProvider(tmp_path / "acls.json")
        users.load()
        acls.load()
        return users, acls

    users, acls = providers()
    processor = AuthAdminProcessor(users, acls, DefaultAuthenticationProvider(users, 900_000))
    asyncio.run(processor.create_user(pymq_pb2.CreateUserRequest(
        user=pymq_pb2.UserInfo(username="eve", password="pw"))))
    asyncio.run(processor.create_acl(pymq_pb2.CreateAclRequest(acl=pymq_pb2.AclInfo(
        subject="User:eve", entries=[pymq_pb2.PolicyEntry(resource="Topic:t", actions=["Pub"])]))))

    def crash(snapshot: tuple[int, bytes]) -> None:
        raise OSError("killed")

    monkeypatch.setattr({"users": users, "acls": acls}[crash_at], "write", crash)
    with pytest.raises(OSError, match="killed"):
        asyncio.run(processor.delete_user(pymq_pb2.DeleteUserRequest(username="eve")))
    on_disk_users, on_disk_acls = providers()
    assert "User:eve" not in on_disk_acls.acls or "eve" in on_disk_users.users


def test_settings_are_checked_at_start(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match="no Super user exists: start the broker once with "
                                           "--init-authentication-user"):
        BrokerProcess(tmp_path / "a", ["--authentication-enabled"], startup_timeout=20).start()
    with pytest.raises(RuntimeError, match="authorization_enabled needs authentication_enabled"):
        BrokerProcess(tmp_path / "b", ["--authorization-enabled"], startup_timeout=20).start()
    with pytest.raises(RuntimeError, match="USER:PASSWORD"):
        BrokerProcess(tmp_path / "c", ["--authentication-enabled", "--init-authentication-user", "root"],
                      startup_timeout=20).start()


def test_authentication_without_authorization(tmp_path: Path) -> None:
    """Any signed user may do what it likes; users and ACLs stay Super-only."""
    args = ["--authentication-enabled", "--init-authentication-user", f"{ROOT}:{ROOT_PW}"]
    with BrokerProcess(tmp_path / "b", args) as proc:
        admin = root_admin(proc.endpoint)
        admin.create_user("erin", "erin-pw")
        erin = Admin(proc.endpoint, access_key="erin", secret_key="erin-pw")
        erin.create_topic("erin-t", 1)
        with pytest.raises(AccessDeniedError):
            erin.list_users()
        with pytest.raises(AuthenticationError):
            Admin(proc.endpoint).topics()


def test_open_broker_ignores_signatures(broker: BrokerProcess) -> None:
    """Authentication is off by default: signed and unsigned clients are served alike."""
    Admin(broker.endpoint).create_topic("open-t", 1)
    Admin(broker.endpoint, access_key="anyone", secret_key="anything").topics()


def test_admin_cli_users_and_acls(auth_broker: BrokerProcess, capsys: pytest.CaptureFixture[str],
                                  monkeypatch: pytest.MonkeyPatch) -> None:
    ep = auth_broker.endpoint
    monkeypatch.setenv("PYMQ_SECRET_KEY", ROOT_PW)
    base = ["-e", ep, "--access-key", ROOT]
    assert admin_main([*base, "user", "create", "frank", "--password", "frank-pw"]) == 0
    assert admin_main([*base, "acl", "create", "User:frank", "--resource", "Topic:cli-*",
                       "--action", "Pub,Sub", "--source-ip", "127.0.0.1/32"]) == 0
    capsys.readouterr()
    assert admin_main([*base, "acl", "list", "--subject", "User:frank"]) == 0
    out = capsys.readouterr().out
    assert "Topic:cli-*" in out and "Pub,Sub" in out and "127.0.0.1/32" in out
    # %RETRY%/%DLQ% topics follow their group's rights: an entry on one would be listed, never applied
    assert admin_main([*base, "acl", "create", "User:frank", "--resource", "Topic:%DLQ%cli-g",
                       "--action", "All", "--decision", "Deny"]) == 1
    assert "grant (or deny) on Group:cli-g instead" in capsys.readouterr().err
    assert admin_main([*base, "user", "list", "--filter", "fra"]) == 0
    out = capsys.readouterr().out
    assert "frank" in out and "Normal" in out and "frank-pw" not in out
    assert admin_main([*base, "user", "update", "frank", "--status", "disable"]) == 0
    assert admin_main([*base, "acl", "delete", "User:frank"]) == 0
    assert root_admin(ep).list_acls(subject="User:frank").empty
    assert admin_main([*base, "user", "delete", "frank"]) == 0
    # the password out of the process list: from $PYMQ_USER_PASSWORD; without it and a terminal, said
    monkeypatch.setattr("sys.stdin.isatty", lambda: False)
    capsys.readouterr()
    assert admin_main([*base, "user", "create", "grace"]) == 1
    assert "set PYMQ_USER_PASSWORD" in capsys.readouterr().err
    monkeypatch.setenv("PYMQ_USER_PASSWORD", "grace-pw")
    assert admin_main([*base, "user", "create", "grace"]) == 0
    with pytest.raises(AccessDeniedError):  # signed in (no AuthenticationError), no grant to list
        Admin(ep, access_key="grace", secret_key="grace-pw").topic_names()
    monkeypatch.setenv("PYMQ_USER_PASSWORD", "other-pw")
    assert admin_main([*base, "user", "update", "grace", "--type", "Normal"]) == 0  # not the variable's
    with pytest.raises(AccessDeniedError):
        Admin(ep, access_key="grace", secret_key="grace-pw").topic_names()
    capsys.readouterr()
    monkeypatch.setenv("PYMQ_SECRET_KEY", "wrong")
    assert admin_main([*base, "topics"]) == 1
    err = capsys.readouterr().err
    assert "signature of user 'root' is wrong" in err and "wrong" not in err.replace("is wrong", "")


def test_spark_options_take_credentials_for_the_pymq_backend() -> None:
    opts = {"endpoint": "127.0.0.1:8081", "accessKey": "alice", "secretKey": "top-secret"}
    config = parse_backend_options(opts.get, "pymq source option")
    assert (config.endpoint, config.access_key) == ("127.0.0.1:8081", "alice")
    assert config.secret_key == "top-secret"
    assert "top-secret" not in repr(config)
    client = BrokerClient("127.0.0.1:8081", access_key="alice", secret_key="top-secret")
    assert "top-secret" not in repr(client) and "alice" in repr(client)
    with pytest.raises(ValueError, match="accessKey and secretKey go together") as info:
        parse_backend_options({"endpoint": "127.0.0.1:8081", "secretKey": "top-secret"}.get, "pymq option")
    assert "top-secret" not in str(info.value)
    assert BackendConfig("127.0.0.1:8081", None, "a", "b") != BackendConfig("127.0.0.1:8081", None, "a", "c")


def test_the_secret_key_may_come_from_a_file(tmp_path: Path) -> None:
    """Spark Connect records every option of a request in its event log and UI: option
    secretKeyFile keeps the secret out of the options (read on the driver, errors never show it)."""
    secret = tmp_path / "secret"
    secret.write_text("top-secret\nignored second line\n")
    opts = {"endpoint": "127.0.0.1:8081", "accessKey": "alice", "secretKeyFile": str(secret)}
    assert parse_backend_options(opts.get, "pymq option").secret_key == "top-secret"
    cases = {
        "are both set": {**opts, "secretKey": "top-secret"},
        "go together": {"endpoint": "127.0.0.1:8081", "secretKeyFile": str(secret)},
        "cannot be read on the driver: No such file": {**opts, "secretKeyFile": str(tmp_path / "absent")},
    }
    for match, given in cases.items():
        with pytest.raises(ValueError, match=match) as info:
            parse_backend_options(given.get, "pymq option")
        assert "top-secret" not in str(info.value)
    secret.write_text("\n")
    with pytest.raises(ValueError, match="has no secret key on its first line"):
        parse_backend_options(opts.get, "pymq option")


def test_every_rpc_has_an_authorization_rule() -> None:
    """A new RPC of service Broker must say what it needs (unlisted, it is Super-only)."""
    from pymq_broker.auth.rpc_resources import RULES
    from pymq_broker.remoting.grpc_service import BrokerGrpcService

    rpcs = {m.name for m in pymq_pb2.DESCRIPTOR.services_by_name["Broker"].methods}
    assert {name for name in RULES if not name.startswith("v2/")} == rpcs  # v2: tests/test_v2_auth.py
    import inspect

    for name in rpcs - {"TransactionStream"}:  # each method passes its own RPC's name to the checks
        method = getattr(BrokerGrpcService, "_pull_message" if name == "PullMessage" else name)
        assert inspect.getclosurevars(method).nonlocals["rpc_name"] == name


def test_commit_group_progress_signs_its_commits(auth_broker: BrokerProcess) -> None:
    """A stopped query's progress, written with the query's credentials (a query's lastProgress as
    Spark gives it: a dict)."""
    import json
    from types import SimpleNamespace

    from pyspark_pymq.spark.progress import commit_group_progress

    ep = auth_broker.endpoint
    admin = root_admin(ep)
    admin.create_topic("prog-t", 1)
    admin.create_user("prog", "prog-pw")
    admin.create_acl("User:prog", ["Topic:prog-t", "Group:prog-g"], ["Sub"])
    op_send("prog-t")(ep, ROOT, ROOT_PW)
    end_offset = json.dumps({"prog-t": {"broker-a:0": 1}})
    query = SimpleNamespace(lastProgress={"sources": [{"endOffset": end_offset}]})
    with pytest.raises(AuthenticationError):
        commit_group_progress(query, ep, "prog-g")
    assert commit_group_progress(query, ep, "prog-g", access_key="prog", secret_key="prog-pw") == 1
    mq = MessageQueue("prog-t", "broker-a", 0)
    assert PullConsumer(ep, "prog-g", access_key=ROOT, secret_key=ROOT_PW).committed(mq) == 1


def test_an_open_transaction_stream_ends_when_its_rights_are_revoked(tmp_path: Path) -> None:
    """Check-backs of a producer group stop reaching a stream whose user lost Pub on the group
    (or was deleted) after it opened; the transaction stays pending for a producer with rights."""
    import threading

    args = [*AUTH_ARGS[:-1], "500", "--transaction-check-interval", "200", "--transaction-check-max", "100"]
    with BrokerProcess(tmp_path / "b", args) as proc:
        ep = proc.endpoint
        admin = root_admin(ep)
        admin.create_topic("tx-w", 1)
        admin.create_user("watcher", "pw")
        admin.create_acl("User:watcher", ["Topic:tx-w", "Group:pg-w"], ["Pub"])
        producer = TransactionProducer(ep, "pg-w", lambda m: LocalTransactionState.UNKNOW,
                                       access_key=ROOT, secret_key=ROOT_PW)
        try:
            sent = producer.send_message_in_transaction(Message("tx-w", b"pending"),
                                                        lambda m, a: LocalTransactionState.UNKNOW)
        finally:
            producer.close()  # from now on the watcher's stream is the group's only one
        checks: list[str] = []
        ended: list[BaseException] = []
        stream = BrokerClient(ep, access_key="watcher", secret_key="pw").transaction_stream(
            pymq_pb2.TransactionStreamRequest(producer_group="pg-w"))

        def watch() -> None:
            try:
                for check in stream:
                    checks.append(check.msg_id)
            except BaseException as err:  # the stream's end is what this test watches
                ended.append(err)

        thread = threading.Thread(target=watch, daemon=True)
        thread.start()
        deadline = time.monotonic() + 20
        while len(checks) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(checks) >= 2 and set(checks) == {sent.msg_id}, "the stream got no check-backs"
        admin.delete_acl("User:watcher", ["Group:pg-w"])
        thread.join(10)
        assert not thread.is_alive(), "the stream went on receiving check-backs after Pub was revoked"
        assert isinstance(ended[0], AccessDeniedError) and "Pub on Group:pg-w" in str(ended[0])
        count = len(checks)
        time.sleep(1)
        assert len(checks) == count
        consumer = PullConsumer(ep, "tx-reader", access_key=ROOT, secret_key=ROOT_PW)
        assert consumer.max_offset(MessageQueue("tx-w", "broker-a", 0)) == 0  # still pending, not lost


def test_users_json_tmp_is_owner_only_whichever_writes_race(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """users.json's temporary file was made owner-only outside the write lock: a write that made it
    while another write held the lock found it renamed away by that one, and its own write made it
    anew 0644 (the base class's mode) with the passwords in it."""
    import threading

    users = AuthenticationMetadataProvider(tmp_path / "config" / "users.json")
    tmp = users.path.with_name("users.json.tmp")
    users.users["root"] = User("root", "secret", UserType.SUPER)
    first, second = users.snapshot(), users.snapshot()
    second_started = threading.Event()
    modes: list[int] = []
    real_fsync = os.fsync

    def watching_fsync(fd: int) -> None:  # os's, for every thread: only the tmp file's are watched
        st = os.fstat(fd)
        if stat.S_ISREG(st.st_mode) and tmp.exists() and os.stat(tmp).st_ino == st.st_ino:
            modes.append(stat.S_IMODE(st.st_mode))
            if len(modes) == 1:  # the first write, its lock held: the second begins meanwhile
                assert second_started.wait(5)
                time.sleep(0.3)
        real_fsync(fd)

    def write_second() -> None:
        second_started.set()
        users.write(second)

    old_umask = os.umask(0o022)  # the usual: files made 0644 unless asked otherwise
    monkeypatch.setattr(os, "fsync", watching_fsync)
    try:
        writing = threading.Thread(target=users.write, args=(first,))
        writing.start()
        while not modes and writing.is_alive():
            time.sleep(0.001)
        other = threading.Thread(target=write_second)
        other.start()
        writing.join(10)
        other.join(10)
    finally:
        monkeypatch.undo()
        os.umask(old_umask)
    assert modes == [0o600, 0o600]
    assert stat.S_IMODE(os.stat(users.path).st_mode) == 0o600
    again = AuthenticationMetadataProvider(users.path)
    again.load()
    assert "root" in again.users

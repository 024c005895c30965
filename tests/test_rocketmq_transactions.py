"""TransactionProducer(namesrv_addr=...) against a real Apache RocketMQ 5.3.3 (two brokers).

What tests/conformance/test_transactions.py compares with the embedded broker (commit,
rollback, check-backs on one broker) is not repeated here; these are the RocketMQ client's
own concerns: half messages on both brokers of a route, check-backs routed by producer
group to the right producer of the process, registration again over a connection made
anew, a producer that takes over its group's unresolved transactions, and the errors.
"""

from __future__ import annotations

import threading
import time

import pytest
from helpers import unique
from pyspark_pymq import (
    LocalTransactionState,
    Message,
    MessageExt,
    MessageQueue,
    PullConsumer,
    PullStatus,
    TransactionProducer,
)
from pyspark_pymq.client.transaction import HalfMessageProducer
from pyspark_pymq.errors import BrokerUnavailableError, PymqError
from pyspark_pymq.rocketmq.api import MQClientAPI
from pyspark_pymq.rocketmq.protocol import RequestCode
from pyspark_pymq.rocketmq.transaction import RocketMQTransactionProducer, commit_or_rollback
from rocketmq_cluster import RocketMQCluster

COMMIT = LocalTransactionState.COMMIT_MESSAGE
ROLLBACK = LocalTransactionState.ROLLBACK_MESSAGE
UNKNOW = LocalTransactionState.UNKNOW


class Recorder:
    """A check listener answering ``state``, remembering the bodies it was asked about."""

    def __init__(self, state: LocalTransactionState) -> None:
        self.state = state
        self.bodies: list[bytes] = []
        self.lock = threading.Lock()

    def __call__(self, msg: MessageExt) -> LocalTransactionState:
        with self.lock:
            self.bodies.append(msg.body)
        return self.state


def _bodies(namesrv: str, topic: str, n: int, timeout: float = 40.0) -> list[bytes]:
    """The bodies stored on ``topic`` (all queues of both brokers) once there are ``n``."""
    consumer = PullConsumer(group="tx-reader", namesrv_addr=namesrv)
    deadline = time.monotonic() + timeout
    while True:
        out: list[bytes] = []
        for mq in consumer.queues(topic):
            r = consumer.pull(mq, 0, 64)
            if r.status is PullStatus.FOUND:
                out += [m.body for m in r.messages]
        if len(out) >= n or time.monotonic() > deadline:
            return sorted(out)
        time.sleep(0.2)


def _topic(cluster: RocketMQCluster, prefix: str) -> str:
    topic = unique(prefix)
    cluster.create_topic(topic, 2)  # both brokers
    consumer = PullConsumer(group="tx-reader", namesrv_addr=cluster.namesrv_addr)
    deadline = time.monotonic() + 30
    while len({mq.broker_name for mq in _queues(consumer, topic)}) < 2:
        assert time.monotonic() < deadline, f"{topic} is not on both brokers after 30 s"
        time.sleep(0.2)
    return topic


def _queues(consumer: PullConsumer, topic: str) -> list[MessageQueue]:
    try:
        return list(consumer.queues(topic))
    except PymqError:
        return []


def test_end_transaction_header_is_rocketmqs() -> None:
    request = MQClientAPI._end_transaction_request(
        "pg", 7, 1234, commit_or_rollback(COMMIT), "UNIQ", "UNIQ", True, "orders", "broker-a", "why")
    assert request.code == RequestCode.END_TRANSACTION == 37
    assert request.remark == "why"
    assert request.ext_fields == {
        "producerGroup": "pg", "tranStateTableOffset": "7", "commitLogOffset": "1234",
        "commitOrRollback": "8", "fromTransactionCheck": "true", "msgId": "UNIQ",
        "transactionId": "UNIQ", "topic": "orders", "bname": "broker-a",
    }
    assert [commit_or_rollback(s) for s in (COMMIT, ROLLBACK, UNKNOW)] == [8, 12, 0]


def test_half_messages_on_both_brokers_and_check_backs_by_group(rocketmq_cluster: RocketMQCluster) -> None:
    ns = rocketmq_cluster.namesrv_addr
    topic = _topic(rocketmq_cluster, "tx-both")
    commits, rollbacks = Recorder(COMMIT), Recorder(ROLLBACK)
    with TransactionProducer(namesrv_addr=ns, producer_group=unique("txa"), check_listener=commits) as a, \
            TransactionProducer(namesrv_addr=ns, producer_group=unique("txb"), check_listener=rollbacks) as b:
        assert isinstance(a, RocketMQTransactionProducer)
        brokers = set()
        for i in range(4):  # round robin: both brokers store half messages
            r = a.send_message_in_transaction(Message(topic, f"a{i}".encode()), lambda m, x: UNKNOW)
            brokers.add(r.send_result.message_queue.broker_name)
        b.send_message_in_transaction(Message(topic, b"b0"), lambda m, x: UNKNOW)
        a.send_message_in_transaction(Message(topic, b"now"), lambda m, x: COMMIT)
        a.send_message_in_transaction(Message(topic, b"never"), lambda m, x: ROLLBACK)
        assert brokers == {"broker-a", "broker-b"}
        assert _bodies(ns, topic, 5) == [b"a0", b"a1", b"a2", b"a3", b"now"]
        deadline = time.monotonic() + 30
        while not rollbacks.bodies and time.monotonic() < deadline:
            time.sleep(0.1)
    # each producer was asked about its own group's half messages only
    assert sorted(commits.bodies) == [b"a0", b"a1", b"a2", b"a3"]
    assert rollbacks.bodies == [b"b0"]
    assert _bodies(ns, topic, 6, timeout=3) == [b"a0", b"a1", b"a2", b"a3", b"now"]


def test_check_back_reaches_a_connection_made_anew(rocketmq_cluster: RocketMQCluster) -> None:
    ns = rocketmq_cluster.namesrv_addr
    topic = _topic(rocketmq_cluster, "tx-reconnect")
    checks = Recorder(COMMIT)
    group = unique("txr")
    with TransactionProducer(namesrv_addr=ns, producer_group=group, check_listener=checks) as producer:
        remoting = producer._backend.remoting
        for addr in rocketmq_cluster.broker_addrs.values():
            remoting.close_connection(addr)  # the brokers forget the registration with the channel
        producer.send_message_in_transaction(Message(topic, b"late"), lambda m, x: UNKNOW)
        assert _bodies(ns, topic, 1) == [b"late"]
    assert checks.bodies == [b"late"]


def test_a_new_producer_of_the_group_resolves_its_unresolved_transactions(
    rocketmq_cluster: RocketMQCluster,
) -> None:
    ns = rocketmq_cluster.namesrv_addr
    topic = _topic(rocketmq_cluster, "tx-takeover")
    group = unique("txt")
    first = Recorder(UNKNOW)
    with TransactionProducer(namesrv_addr=ns, producer_group=group, check_listener=first) as producer:
        producer.send_message_in_transaction(Message(topic, b"orphan"), lambda m, x: UNKNOW)
    # closed at once (it unregistered the group): the next producer of the group is asked
    second = Recorder(COMMIT)
    with TransactionProducer(namesrv_addr=ns, producer_group=group, check_listener=second):
        assert _bodies(ns, topic, 1) == [b"orphan"]
    assert first.bodies == [] and second.bodies[:1] == [b"orphan"]


def test_a_producer_dropped_without_close_stops_heartbeating_and_answering(
    rocketmq_cluster: RocketMQCluster,
) -> None:
    """Its heartbeat thread held it: a notebook cell run again left the old producer registered and
    answering check-backs with its old listener for ever, as the pymq one did (probe helper-92).
    Collected, it ends its thread and leaves the group's check-backs to the producers still open."""
    import gc

    group = unique("txd")
    producer = TransactionProducer(namesrv_addr=rocketmq_cluster.namesrv_addr, producer_group=group,
                                   check_listener=Recorder(COMMIT), heartbeat_interval_s=0.2)
    assert isinstance(producer, RocketMQTransactionProducer)
    thread, dispatcher = producer._thread, producer._dispatcher
    time.sleep(0.5)  # heartbeating
    del producer
    gc.collect()
    thread.join(10)
    assert not thread.is_alive()
    assert dispatcher._select(group) is None


def test_errors_name_what_and_where(rocketmq_cluster: RocketMQCluster) -> None:
    ns = rocketmq_cluster.namesrv_addr
    started = time.monotonic()
    with pytest.raises(BrokerUnavailableError, match=r"127\.0\.0\.1:1\b"):
        TransactionProducer(namesrv_addr="127.0.0.1:1", producer_group="g", check_listener=lambda m: COMMIT,
                            send_msg_timeout_ms=2000)
    assert time.monotonic() - started < 10
    with pytest.raises(ValueError, match="exactly one of endpoint"):
        TransactionProducer("127.0.0.1:8081", "g", lambda m: COMMIT, namesrv_addr=ns)
    with pytest.raises(TypeError, match="check_listener"):
        TransactionProducer(namesrv_addr=ns, producer_group="g")
    group = unique("txe")
    with TransactionProducer(namesrv_addr=ns, producer_group=group, check_listener=lambda m: COMMIT) as p:
        with pytest.raises(PymqError, match="END_TRANSACTION") as err:
            p.end_transactions(["X"], COMMIT)
        assert err.value.code == "NOT_SUPPORTED"
    topic = _topic(rocketmq_cluster, "tx-halfbatch")
    with pytest.raises(PymqError, match="batches of transactional") as err:
        HalfMessageProducer(namesrv_addr=ns, producer_group="g").send_encoded(
            topic, [b"a", b"b"], [b"", b""], ["K1" * 16, "K2" * 16])
    assert err.value.code == "NOT_SUPPORTED"


def test_what_the_broker_answers_to_end_transaction(rocketmq_cluster: RocketMQCluster) -> None:
    """END_TRANSACTION waited for (RocketMQ's clients send it one-way): a wrong producer group or
    offsets are refused; a second COMMIT of the same half message stores it again (the broker does
    not look for an op record first), which is why the exactly-once sink is not built on it yet."""
    ns = rocketmq_cluster.namesrv_addr
    topic = _topic(rocketmq_cluster, "tx-end")
    group = unique("txd")
    with TransactionProducer(namesrv_addr=ns, producer_group=group, check_listener=lambda m: UNKNOW) as p:
        assert isinstance(p, RocketMQTransactionProducer)
        sent = p.send_message_in_transaction(Message(topic, b"twice"), lambda m, x: UNKNOW).send_result
        api, addr = p._api, p._backend.broker_addr(sent.message_queue)
        end = {"tran_state_table_offset": sent.queue_offset, "commit_log_offset": sent.commit_log_offsets[0],
               "commit_or_rollback": commit_or_rollback(COMMIT), "msg_id": sent.msg_id,
               "transaction_id": sent.msg_id, "topic": topic, "broker_name": sent.message_queue.broker_name}
        with pytest.raises(PymqError, match="producer group wrong") as err:
            api.end_transaction(addr, wait=True, producer_group="someone-else", **end)  # type: ignore[arg-type]
        assert err.value.code == "SYSTEM_ERROR"
        with pytest.raises(PymqError, match="transaction state table offset wrong"):
            far = {**end, "tran_state_table_offset": 10**9}
            api.end_transaction(addr, wait=True, producer_group=group, **far)  # type: ignore[arg-type]
        api.end_transaction(addr, wait=True, producer_group=group, **end)  # type: ignore[arg-type]
        api.end_transaction(addr, wait=True, producer_group=group, **end)  # type: ignore[arg-type]
        assert _bodies(ns, topic, 2) == [b"twice", b"twice"]


def test_a_committed_message_an_orderly_consumer_gives_up_is_a_dead_letter(
    rocketmq_cluster: RocketMQCluster,
) -> None:
    """RocketMQ keeps TRAN_MSG on a committed message; a copy to %RETRY% with it is stored as a half
    message (its dead letter waits for a check-back of the original producer group, never reaching
    %DLQ%). The copy drops it, as ConsumeMessageOrderlyService.sendMessageBack does."""
    ns = rocketmq_cluster.namesrv_addr
    topic, group = _topic(rocketmq_cluster, "tx-dead"), unique("tx-dead-g")
    with TransactionProducer(namesrv_addr=ns, producer_group=unique("txd"),
                             check_listener=Recorder(COMMIT)) as p:
        p.send_message_in_transaction(Message(topic, b"tx"), lambda m, x: COMMIT)
    assert _bodies(ns, topic, 1) == [b"tx"]
    consumer = PullConsumer(group=group, namesrv_addr=ns)
    [m] = [m for mq in consumer.queues(topic) for m in consumer.pull(mq, 0, 64).messages]
    assert m.properties.get("TRAN_MSG") == "true"
    result = consumer.send_back_orderly(m, 1, 1, "gave up")
    assert result.dead_letter and result.topic == f"%DLQ%{group}"
    assert _bodies(ns, f"%DLQ%{group}", 1) == [b"tx"]

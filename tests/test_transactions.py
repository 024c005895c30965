"""Transactional messages: half messages, commit / rollback, check-back, give-up, restart."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from broker_process import BrokerProcess
from pyspark_pymq import (
    Admin,
    LocalTransactionState,
    Message,
    MessageExt,
    Producer,
    PullConsumer,
    TransactionProducer,
)
from pyspark_pymq.errors import MessageIllegalError

FAST = ["--transaction-timeout", "300", "--transaction-check-interval", "300",
        "--transaction-check-max", "3"]
COMMIT = LocalTransactionState.COMMIT_MESSAGE
ROLLBACK = LocalTransactionState.ROLLBACK_MESSAGE
UNKNOW = LocalTransactionState.UNKNOW


@pytest.fixture
def tx_broker(tmp_path: Path) -> Iterator[BrokerProcess]:
    with BrokerProcess(tmp_path / "b", FAST) as broker:
        Admin(broker.endpoint).create_topic("orders", queues=1)
        yield broker


def visible(endpoint: str, topic: str = "orders") -> list[bytes]:
    consumer = PullConsumer(endpoint, "g")
    return [m.body for mq in consumer.queues(topic) for m in consumer.pull(mq, 0, 1000).messages]


def wait_for(predicate, timeout: float = 15.0) -> bool:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.1)
    return False


def test_commit_is_visible_and_rollback_never_is(tx_broker: BrokerProcess) -> None:
    ep = tx_broker.endpoint
    seen_during: list[list[bytes]] = []

    def local(msg: Message, arg: object) -> LocalTransactionState:
        seen_during.append(visible(ep))  # the half message is invisible meanwhile
        return COMMIT if arg == "ok" else ROLLBACK

    with TransactionProducer(ep, "tx", lambda m: UNKNOW) as producer:
        r = producer.send_message_in_transaction(Message("orders", b"paid", keys=["o1"]), local, "ok")
        assert r.local_transaction_state == COMMIT
        producer.send_message_in_transaction(Message("orders", b"cancelled"), local, "no")
    assert seen_during[0] == []
    assert visible(ep) == [b"paid"]
    consumer = PullConsumer(ep, "g")
    m = consumer.pull(consumer.queues("orders")[0], 0).messages[0]
    assert m.msg_id == r.msg_id and m.keys == ("o1",) and "TRAN_MSG" not in m.properties
    time.sleep(1.0)  # no check-back resurrects the rolled-back one
    assert visible(ep) == [b"paid"]


def test_unknown_outcome_is_checked_back_and_committed(tx_broker: BrokerProcess) -> None:
    ep = tx_broker.endpoint
    checked: list[MessageExt] = []

    def check(msg: MessageExt) -> LocalTransactionState:
        checked.append(msg)
        return COMMIT

    def crash(msg: Message, arg: object) -> LocalTransactionState:
        raise RuntimeError("the process died mid-transaction")

    with TransactionProducer(ep, "tx", check) as producer:
        producer.send_message_in_transaction(Message("orders", b"maybe", tags="T"), crash)
        assert wait_for(lambda: visible(ep) == [b"maybe"])
    assert checked and checked[0].topic == "orders" and checked[0].body == b"maybe"
    assert checked[0].properties["TRANSACTION_CHECK_TIMES"] == "1"


def test_transaction_is_given_up_after_check_max(tx_broker: BrokerProcess) -> None:
    ep = tx_broker.endpoint
    checks: list[int] = []

    def check(msg: MessageExt) -> LocalTransactionState:
        checks.append(int(msg.properties["TRANSACTION_CHECK_TIMES"]))
        return UNKNOW

    with TransactionProducer(ep, "tx", check) as producer:
        producer.send_message_in_transaction(Message("orders", b"limbo"), lambda m, a: UNKNOW)
        assert wait_for(lambda: "TRANS_CHECK_MAX_TIME_TOPIC" in Admin(ep).topic_names(include_system=True)
                        and visible(ep, "TRANS_CHECK_MAX_TIME_TOPIC") == [b"limbo"])
    assert checks == [1, 2, 3]
    assert visible(ep) == []


def test_half_messages_survive_a_broker_crash(tmp_path: Path) -> None:
    broker = BrokerProcess(tmp_path / "b", FAST, flush_disk_type="SYNC_FLUSH").start()
    try:
        Admin(broker.endpoint).create_topic("orders", queues=1)
        with TransactionProducer(broker.endpoint, "tx", lambda m: UNKNOW) as producer:
            producer.send_message_in_transaction(Message("orders", b"survivor"), lambda m, a: UNKNOW)
        broker.restart(crash=True)
        with TransactionProducer(broker.endpoint, "tx", lambda m: COMMIT):
            assert wait_for(lambda: visible(broker.endpoint) == [b"survivor"])
    finally:
        broker.stop()


def test_transactional_messages_refuse_delay_and_batches(tx_broker: BrokerProcess) -> None:
    ep = tx_broker.endpoint
    producer = TransactionProducer(ep, "tx", lambda m: UNKNOW)
    with pytest.raises(ValueError, match="delayed"):
        producer.send_message_in_transaction(Message("orders", b"x", delay_level=2), lambda m, a: COMMIT)
    producer.close()
    tx = {"TRAN_MSG": "true", "PGROUP": "tx"}
    with pytest.raises(MessageIllegalError, match="batch"):
        Producer(ep).send_batch([Message("orders", b"a", properties=tx),
                                 Message("orders", b"b", properties=tx)])

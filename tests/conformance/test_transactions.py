"""Transactional messages: commit, rollback and check-back, as Apache RocketMQ 5.3.3 does them.

RocketMQ (SendMessageProcessor, TransactionalMessageBridge.parseHalfMessageInner,
EndTransactionProcessor, TransactionalMessageServiceImpl.check):

- a half message (TRAN_MSG=true, PGROUP) is stored in RMQ_SYS_TRANS_HALF_TOPIC queue 0 with
  REAL_TOPIC / REAL_QID; the send result names the real queue but carries the half queue's
  offset and the half message's offsetMsgId; nobody sees it on the real topic;
- a commit writes the message to its real queue with **every property of the half message**
  (TRAN_MSG=true, PGROUP, REAL_TOPIC, REAL_QID kept: the properties string is made before they
  are cleared), the same msgId and born timestamp; a rollback writes nothing; either way an op
  record (TAGS=d, body "<half offset>,") goes to RMQ_SYS_TRANS_OP_HALF_TOPIC;
- a half message left unknown is checked back after transactionTimeOut: it is stored again in
  the half queue with TRANSACTION_CHECK_TIMES+1 and sent to the producer group with its real
  topic and queue; a commit then stores that copy's properties (TRANSACTION_CHECK_TIMES kept).

The targets' timings: first check 2 s after the half message, then about every second.
"""

from __future__ import annotations

import threading
import time

import pytest
from pyspark_pymq import LocalTransactionState, Message, MessageExt, SendStatus, TransactionSendResult
from pyspark_pymq.errors import NoPermissionError, TopicNotExistError
from rocketmq_cluster import TRANSACTION_TIMEOUT_MS

from .conftest import BROKER, Target

pytestmark = pytest.mark.integration

HALF = "RMQ_SYS_TRANS_HALF_TOPIC"
OP = "RMQ_SYS_TRANS_OP_HALF_TOPIC"
COMMIT = LocalTransactionState.COMMIT_MESSAGE
ROLLBACK = LocalTransactionState.ROLLBACK_MESSAGE
UNKNOW = LocalTransactionState.UNKNOW


class Checks:
    """A check listener that answers per message body, and remembers what it was asked."""

    def __init__(self, answers: dict[bytes, list[LocalTransactionState]] | None = None) -> None:
        self.answers = answers or {}
        self.seen: list[tuple[float, MessageExt]] = []
        self.lock = threading.Lock()

    def __call__(self, msg: MessageExt) -> LocalTransactionState:
        with self.lock:
            self.seen.append((time.monotonic(), msg))
            queue = self.answers.get(msg.body) or [UNKNOW]
            return queue.pop(0) if len(queue) > 1 else queue[0]

    def of(self, body: bytes) -> list[tuple[float, MessageExt]]:
        with self.lock:
            return [(t, m) for t, m in self.seen if m.body == body]

    def wait(self, body: bytes, n: int, timeout: float = 30.0) -> list[tuple[float, MessageExt]]:
        deadline = time.monotonic() + timeout
        while len(self.of(body)) < n:
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"{len(self.of(body))} check-back(s) of {body!r} after {timeout} s, expected {n}")
            time.sleep(0.05)
        return self.of(body)


def _half_properties(target: Target, result: TransactionSendResult, topic: str, user: dict[str, str],
                     group: str) -> dict[str, str]:
    return {
        "UNIQ_KEY": result.msg_id, **user, "TRAN_MSG": "true", "PGROUP": group,
        "REAL_TOPIC": topic, "REAL_QID": "0", **target.half_extras(result.msg_id),
    }


def _op_offsets(target: Target, start: int, half_offset: int, timeout: float = 30.0) -> MessageExt:
    """The op record (RMQ_SYS_TRANS_OP_HALF_TOPIC) that marks ``half_offset`` ended."""
    mq = target.mq(OP, 0)
    consumer = target.consumer("cf-browser")
    deadline = time.monotonic() + timeout
    offset = start
    while True:
        got = consumer.pull(mq, offset, 32).messages if target.max_offset(mq) > offset else []
        for m in got:
            if str(half_offset) in m.body.decode().split(","):
                return m
        if got:
            offset = got[-1].queue_offset + 1
            continue
        if time.monotonic() > deadline:
            raise AssertionError(f"no op record of half offset {half_offset} after {timeout} s")
        time.sleep(0.1)


def test_commit_is_invisible_before_and_visible_after(target: Target) -> None:
    topic = target.topic("tx-commit")
    mq = target.mq(topic)
    half_mq = target.mq(HALF, 0)
    half_start = target.max_offset(half_mq)
    op_start = target.max_offset(target.mq(OP, 0))
    group = target.unique("txg")
    user = {"TAGS": "T", "KEYS": "k1 k2", "a": "1"}
    during: list[int] = []

    def local(msg: Message, arg: object) -> LocalTransactionState:
        during.append(target.max_offset(mq))  # the half message is not on the real topic meanwhile
        return COMMIT

    with target.transaction_producer(group, Checks()) as producer:
        result = producer.send_message_in_transaction(
            Message(topic, b"paid", tags="T", keys=("k1", "k2"), properties={"a": "1"}), local)
    assert during == [0]
    assert result.local_transaction_state is COMMIT
    sent = result.send_result
    assert sent.status is SendStatus.SEND_OK and sent.message_queue == mq

    half = target.find(half_mq, half_start, result.msg_id)
    assert (half.topic, half.queue_id, half.body, half.reconsume_times) == (HALF, 0, b"paid", 0)
    assert sent.queue_offset == half.queue_offset  # the half queue's offset, not the real queue's
    assert sent.offset_msg_id == half.offset_msg_id
    expected = {**_half_properties(target, result, topic, user, group),
                **target.broker_stamps(half.properties)}
    assert half.properties == expected

    committed = target.message_at(mq, 0)
    assert (committed.topic, committed.queue_id, committed.msg_id, committed.body) == (
        topic, 0, result.msg_id, b"paid")
    assert (committed.tags, committed.keys, committed.born_timestamp, committed.reconsume_times) == (
        "T", ("k1", "k2"), half.born_timestamp, 0)
    assert committed.offset_msg_id != half.offset_msg_id
    assert committed.commit_log_offset > half.commit_log_offset
    assert committed.properties == expected  # TRAN_MSG, PGROUP, REAL_TOPIC, REAL_QID kept
    assert committed.user_properties == {"a": "1"}

    op = _op_offsets(target, op_start, half.queue_offset)
    assert op.properties == {"TAGS": "d", "WAIT": "true"} and op.body.endswith(b",")
    # committed once: nothing else reaches the real queue, no check-back later
    time.sleep(TRANSACTION_TIMEOUT_MS / 1000 + 1.5)
    assert target.max_offset(mq) == 1


def test_rollback_is_never_visible(target: Target) -> None:
    topic = target.topic("tx-rollback")
    mq = target.mq(topic)
    half_mq = target.mq(HALF, 0)
    half_start = target.max_offset(half_mq)
    op_start = target.max_offset(target.mq(OP, 0))
    checks = Checks({b"later": [COMMIT]})
    with target.transaction_producer(target.unique("txg"), checks) as producer:
        rolled = producer.send_message_in_transaction(Message(topic, b"cancelled"), lambda m, a: ROLLBACK)
        assert rolled.local_transaction_state is ROLLBACK
        half = target.find(half_mq, half_start, rolled.msg_id)
        op = _op_offsets(target, op_start, half.queue_offset)
        assert op.properties == {"TAGS": "d", "WAIT": "true"}
        later = producer.send_message_in_transaction(Message(topic, b"later"), lambda m, a: COMMIT)
        assert target.message_at(mq, 0).msg_id == later.msg_id
        # past the first check-back time: the rolled-back message is never asked about, never stored
        time.sleep(TRANSACTION_TIMEOUT_MS / 1000 + 1.5)
    assert target.max_offset(mq) == 1
    assert checks.of(b"cancelled") == []


def test_check_back_commits_a_transaction_left_unknown(target: Target) -> None:
    topic = target.topic("tx-check-commit")
    mq = target.mq(topic)
    half_mq = target.mq(HALF, 0)
    half_start = target.max_offset(half_mq)
    group = target.unique("txg")
    checks = Checks({b"order-7": [COMMIT]})
    with target.transaction_producer(group, checks) as producer:
        t0 = time.monotonic()
        result = producer.send_message_in_transaction(
            Message(topic, b"order-7", keys=("o7",), properties={"a": "1"}), lambda m, a: UNKNOW)
        assert result.local_transaction_state is UNKNOW
        assert target.max_offset(mq) == 0
        [(when, asked)] = checks.wait(b"order-7", 1)
        committed = target.message_at(mq, 0)
    half = target.find(half_mq, half_start, result.msg_id)
    assert when - t0 >= TRANSACTION_TIMEOUT_MS / 1000 - 0.2  # not before the transaction time-out

    # what the producer is asked about: the half message stored again, with its real topic and queue
    user = {"KEYS": "o7", "a": "1"}
    stored = {**_half_properties(target, result, topic, user, group), **target.broker_stamps(half.properties)}
    again = {**stored, "TRANSACTION_CHECK_TIMES": "1"}
    assert (asked.topic, asked.queue_id, asked.msg_id, asked.body, asked.keys) == (topic, 0, result.msg_id,
                                                                                  b"order-7", ("o7",))
    assert asked.properties == {**again, **target.check_extras()}
    assert asked.queue_offset > half.queue_offset  # the copy in the half queue
    assert asked.offset_msg_id != half.offset_msg_id
    assert target.message_at(half_mq, asked.queue_offset).properties == again

    assert (committed.msg_id, committed.body, committed.born_timestamp) == (result.msg_id, b"order-7",
                                                                           half.born_timestamp)
    assert committed.properties == again  # the checked copy's properties, TRANSACTION_CHECK_TIMES kept
    time.sleep(1.5)
    assert target.max_offset(mq) == 1 and len(checks.of(b"order-7")) == 1


def test_check_back_rolls_back_a_transaction_left_unknown(target: Target) -> None:
    topic = target.topic("tx-check-rollback")
    mq = target.mq(topic)
    checks = Checks({b"order-8": [ROLLBACK]})

    def local(msg: Message, arg: object) -> LocalTransactionState:
        raise RuntimeError("the database went away")  # counts as UNKNOW: the broker asks later

    with target.transaction_producer(target.unique("txg"), checks) as producer:
        result = producer.send_message_in_transaction(Message(topic, b"order-8"), local)
        assert result.local_transaction_state is UNKNOW
        [(_, asked)] = checks.wait(b"order-8", 1)
        assert asked.properties["TRANSACTION_CHECK_TIMES"] == "1"
        time.sleep(2.5)  # past the next check time: rolled back, never asked again
    assert target.max_offset(mq) == 0
    assert len(checks.of(b"order-8")) == 1


def test_unknown_answers_are_checked_again(target: Target) -> None:
    topic = target.topic("tx-check-again")
    mq = target.mq(topic)
    checks = Checks({b"slow": [UNKNOW, UNKNOW, COMMIT]})
    with target.transaction_producer(target.unique("txg"), checks) as producer:
        producer.send_message_in_transaction(Message(topic, b"slow"), lambda m, a: UNKNOW)
        asked = checks.wait(b"slow", 3, timeout=45)
        committed = target.message_at(mq, 0)
    assert [m.properties["TRANSACTION_CHECK_TIMES"] for _, m in asked] == ["1", "2", "3"]
    assert [m.queue_offset for _, m in asked] == sorted({m.queue_offset for _, m in asked})
    assert committed.properties["TRANSACTION_CHECK_TIMES"] == "3"


def test_transactional_send_edge_cases(target: Target) -> None:
    """What both answer where a transactional send cannot be made."""
    group = target.unique("txg")
    read_only = target.unique("tx-ro")
    if target.cluster is not None:
        target.cluster.create_topic(read_only, 1, brokers=[BROKER], perm=4)
    else:
        target.admin().create_topic(read_only, 1, perm=4)
    ran: list[str] = []

    def local(msg: Message, arg: object) -> LocalTransactionState:
        ran.append(msg.topic)
        return COMMIT

    with target.transaction_producer(group, Checks()) as producer:
        with pytest.raises(TopicNotExistError):
            producer.send_message_in_transaction(Message(target.unique("tx-missing"), b"x"), local)
        deadline = time.monotonic() + 30
        while True:  # the name servers learn the read-only topic from broker-a's registration
            try:
                target.backend.route(read_only, refresh=True)
                break
            except TopicNotExistError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        with pytest.raises(NoPermissionError):
            producer.send_message_in_transaction(Message(read_only, b"x"), local)
        with pytest.raises(ValueError, match="delayed"):
            producer.send_message_in_transaction(Message(read_only, b"x", delay_level=2), local)
    assert ran == []  # the local transaction never runs without a stored half message


def test_transaction_is_given_up_after_transaction_check_max(target: Target) -> None:
    """After transactionCheckMax (15) unknown answers, the half message goes to
    TRANS_CHECK_MAX_TIME_TOPIC queue 0 as it was last stored (TRANSACTION_CHECK_TIMES=15),
    and nothing reaches the real topic (DefaultTransactionalMessageCheckListener.resolveDiscardMsg)."""
    topic = target.topic("tx-give-up")
    mq = target.mq(topic)
    given_up = target.mq("TRANS_CHECK_MAX_TIME_TOPIC", 0)
    start = target.max_offset(given_up)
    group = target.unique("txg")
    checks = Checks()
    with target.transaction_producer(group, checks) as producer:
        result = producer.send_message_in_transaction(Message(topic, b"limbo", properties={"a": "1"}),
                                                      lambda m, a: UNKNOW)
        discarded = target.find(given_up, start, result.msg_id, timeout=60)
    asked = [m.properties["TRANSACTION_CHECK_TIMES"] for _, m in checks.of(b"limbo")]
    assert asked == [str(i) for i in range(1, 16)]
    assert (discarded.topic, discarded.queue_id, discarded.body) == (given_up.topic, 0, b"limbo")
    assert discarded.properties == {
        **_half_properties(target, result, topic, {"a": "1"}, group),
        **target.broker_stamps(discarded.properties), "TRANSACTION_CHECK_TIMES": "15",
    }
    assert target.max_offset(mq) == 0

"""Transactional messages: half messages, commit / rollback, check-back, give-up, restart."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from broker_process import BrokerProcess
from helpers import read_all
from pymq_proto.rocketmq_v2 import definition_pb2 as v2
from pymq_proto.rocketmq_v2 import service_pb2 as sv
from pymq_proto.rocketmq_v2 import service_pb2_grpc
from pyspark_pymq import (
    Admin,
    LocalTransactionState,
    Message,
    MessageExt,
    Producer,
    PullConsumer,
    TransactionProducer,
)
from pyspark_pymq.client.message import SystemMessage
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
    # as RocketMQ 5.3.3 stores it: the half message's properties kept (tests/conformance too)
    assert m.msg_id == r.msg_id and m.keys == ("o1",)
    props = m.properties
    assert (props["TRAN_MSG"], props["PGROUP"], props["REAL_TOPIC"]) == ("true", "tx", "orders")
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
    with pytest.raises(ValueError, match="'TRAN_MSG' is reserved"):  # a plain Message cannot say it
        Producer(ep).send_batch([Message("orders", b"a", properties=tx)])
    with pytest.raises(MessageIllegalError, match="batch"):  # nor can a batch of half messages
        Producer(ep).send_batch([SystemMessage("orders", b"a", properties=tx),
                                 SystemMessage("orders", b"b", properties=tx)])


def test_closing_a_producer_at_once_ends_its_check_back_thread_and_stream(
    tx_broker: BrokerProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    # close() cancelled the check-back stream only if the thread had opened it already: a
    # stream opened just after close() blocked its thread (and a broker channel) for ever
    from pyspark_pymq.client.transport import StreamRpc

    real_call = StreamRpc.__call__

    def late_stream(self: StreamRpc[Any, Any], request: Any, timeout: float | None = None) -> Any:
        if self.name == "TransactionStream":
            time.sleep(0.2)  # the thread opens its stream after close() has run
        return real_call(self, request, timeout)

    monkeypatch.setattr(StreamRpc, "__call__", late_stream)
    producers = [TransactionProducer(tx_broker.endpoint, "txc", lambda m: COMMIT) for _ in range(3)]
    for producer in producers:
        producer.close()
    assert not any(p._thread.is_alive() for p in producers)  # joined by close()
    monkeypatch.undo()
    producers = [TransactionProducer(tx_broker.endpoint, "txc", lambda m: COMMIT) for _ in range(10)]
    time.sleep(0.05)
    for producer in producers:  # and without the delay, whenever the thread gets to it
        producer.close()
    assert not any(p._thread.is_alive() for p in producers)


def test_a_producer_dropped_without_close_stops_answering_check_backs(tx_broker: BrokerProcess) -> None:
    """Its check-back thread held it: a notebook cell run again left the old producers answering
    check-backs with their old listeners (rolling back what the new one would commit) for ever
    (probe helper-92). Collected, it ends its stream and its thread."""
    import gc

    producer = TransactionProducer(tx_broker.endpoint, "txdrop", lambda m: COMMIT)
    thread = producer._thread
    time.sleep(0.3)  # its stream is open
    del producer
    gc.collect()
    thread.join(10)
    assert not thread.is_alive()


def _half_props(uniq: str, group: str = "tx") -> bytes:
    from pymq_proto.record import encode_properties

    return encode_properties({"TRAN_MSG": "true", "PGROUP": group, "UNIQ_KEY": uniq})


def test_half_message_batch_is_invisible_idempotent_and_ended_by_batch(tx_broker: BrokerProcess) -> None:
    from pyspark_pymq.client.transaction import HalfMessageProducer

    ep = tx_broker.endpoint
    keys = [f"TX{i:030d}" for i in range(4)]
    bodies = [b"a", b"b", b"c", b"d"]
    halves = HalfMessageProducer(ep, producer_group="tx")
    halves.send_encoded("orders", bodies, [_half_props(k) for k in keys], keys, queue_id=0)
    halves.send_encoded("orders", bodies, [_half_props(k) for k in keys], keys, queue_id=0)  # a retry
    assert visible(ep) == []
    assert Admin(ep).broker_info()["transactionsPending"] == "4", "a retried half batch was stored twice"
    with TransactionProducer(ep, "tx", lambda m: UNKNOW) as producer:
        assert producer.end_transactions([keys[0], keys[1], "NO-SUCH-ID", keys[3]], COMMIT) == 3
        assert producer.end_transactions([keys[1], keys[2]], ROLLBACK) == 1  # keys[1] ended already
    assert visible(ep) == [b"a", b"b", b"d"]
    assert Admin(ep).broker_info()["transactionsPending"] == "0"
    time.sleep(1.0)  # nothing left for a check-back to resurrect
    assert visible(ep) == [b"a", b"b", b"d"]


def test_half_message_batch_rejects_plain_and_delayed_messages(tx_broker: BrokerProcess) -> None:
    from pymq_proto.record import encode_properties
    from pyspark_pymq.client.transaction import HalfMessageProducer

    ep = tx_broker.endpoint
    halves = HalfMessageProducer(ep, producer_group="tx")
    plain = encode_properties({"UNIQ_KEY": "P1"})
    with pytest.raises(MessageIllegalError, match="message 1 of a half message batch lacks TRAN_MSG"):
        halves.send_encoded("orders", [b"a", b"b"], [_half_props("H1"), plain], ["H1", "P1"])
    delayed = _half_props("H2") + b"DELAY\x013\x02"
    with pytest.raises(MessageIllegalError, match="cannot be delayed"):
        halves.send_encoded("orders", [b"x"], [delayed], ["H2"])
    assert Admin(ep).broker_info()["transactionsPending"] == "0"


def test_half_message_batch_survives_a_broker_crash(tmp_path: Path) -> None:
    from pyspark_pymq.client.transaction import HalfMessageProducer

    broker = BrokerProcess(tmp_path / "b", FAST, flush_disk_type="SYNC_FLUSH").start()
    try:
        Admin(broker.endpoint).create_topic("orders", queues=1)
        keys = [f"K{i}" for i in range(50)]
        HalfMessageProducer(broker.endpoint, producer_group="tx").send_encoded(
            "orders", [b"%d" % i for i in range(50)], [_half_props(k) for k in keys], keys)
        broker.restart(crash=True)
        assert Admin(broker.endpoint).broker_info()["transactionsPending"] == "50"
        with TransactionProducer(broker.endpoint, "tx", lambda m: UNKNOW) as producer:
            assert producer.end_transactions(keys, COMMIT) == 50
        assert visible(broker.endpoint) == [b"%d" % i for i in range(50)]
    finally:
        broker.stop()


def test_ending_more_than_max_message_size_at_once_and_restarting(tmp_path: Path) -> None:
    """One EndTransactionBatch over 4 MiB of bodies is stored in several puts; its op records survive."""
    from pyspark_pymq.client.transaction import HalfMessageProducer

    broker = BrokerProcess(tmp_path / "b", FAST).start()
    try:
        ep = broker.endpoint
        Admin(ep).create_topic("orders", queues=1)
        keys = [f"BIG{i:029d}" for i in range(3000)]
        halves = HalfMessageProducer(ep, producer_group="tx")
        for start in range(0, 3000, 1000):  # 2 MiB of bodies per request
            chunk = keys[start : start + 1000]
            halves.send_encoded("orders", [b"b" * 2048] * 1000, [_half_props(k) for k in chunk], chunk)
        with TransactionProducer(ep, "tx", lambda m: UNKNOW) as producer:
            assert producer.end_transactions(keys[:2900], COMMIT) == 2900  # ~5.9 MiB at once
            assert producer.end_transactions(keys[2900:], ROLLBACK) == 100
        broker.restart(crash=True)
        ep = broker.endpoint
        assert Admin(ep).broker_info()["transactionsPending"] == "0"
        time.sleep(1.0)  # no check-back brings a resolved one back
        assert len(read_all(ep, "orders")) == 2900
    finally:
        broker.stop()


def test_encoded_and_classic_half_batches_store_the_same_half_messages(tmp_path: Path) -> None:
    """An encoded half batch is re-addressed in bulk (topic, REAL_TOPIC/REAL_QID appended);
    it must store what the per-message path stores, and commit to the same messages."""
    import grpc
    from pymq_proto.v1 import pymq_pb2, pymq_pb2_grpc
    from pyspark_pymq import MessageQueue
    from pyspark_pymq.client.transaction import HalfMessageProducer

    with BrokerProcess(tmp_path / "b") as broker:
        ep = broker.endpoint
        Admin(ep).create_topic("orders", queues=2)
        bodies = [b"x" * i for i in range(1, 40)]
        fast = [f"F{i:031d}" for i in range(len(bodies))]
        classic = [f"C{i:031d}" for i in range(len(bodies))]
        HalfMessageProducer(ep, producer_group="tx").send_encoded(
            "orders", bodies, [_half_props(k) for k in fast], fast, queue_id=1)
        messages = [pymq_pb2.MessageData(body=b, properties=_half_props(k))
                    for b, k in zip(bodies, classic, strict=True)]
        pymq_pb2_grpc.BrokerStub(grpc.insecure_channel(ep)).SendHalfMessageBatch(
            pymq_pb2.SendMessageRequest(topic="orders", queue_id=1, batch=True, messages=messages))
        halves = PullConsumer(ep, "h").pull(MessageQueue("RMQ_SYS_TRANS_HALF_TOPIC", "broker-a", 0), 0, 1000)

        def seen(m: MessageExt) -> tuple[object, ...]:
            props = {k: v for k, v in m.properties.items() if k != "UNIQ_KEY"}
            return m.topic, m.queue_id, m.body, m.flag, m.reconsume_times, sorted(props.items())

        stored = [seen(m) for m in halves.messages]
        assert len(stored) == 2 * len(bodies) and stored[: len(bodies)] == stored[len(bodies):]
        assert stored[0][0] == "RMQ_SYS_TRANS_HALF_TOPIC" and ("REAL_QID", "1") in stored[0][5]
        with TransactionProducer(ep, "tx", lambda m: UNKNOW) as producer:
            assert producer.end_transactions(fast + classic, COMMIT) == 2 * len(bodies)
        real = PullConsumer(ep, "r").pull(MessageQueue("orders", "broker-a", 1), 0, 1000).messages
        assert [seen(m) for m in real[: len(bodies)]] == [seen(m) for m in real[len(bodies):]]
        assert [m.body for m in real] == bodies + bodies
        assert real[0].properties == {"UNIQ_KEY": fast[0], "PGROUP": "tx", "TRAN_MSG": "true",
                                      "REAL_TOPIC": "orders", "REAL_QID": "1"}


def _v2_end(stub: Any, topic: str, msg_id: str, resolution: int = v2.COMMIT) -> Any:
    return stub.EndTransaction(sv.EndTransactionRequest(
        topic=v2.Resource(name=topic), message_id=msg_id, transaction_id=msg_id, resolution=resolution,
    ), timeout=10).status


def test_v2_end_transaction_ends_only_a_v2_transaction_of_its_topic(tmp_path: Path) -> None:
    with BrokerProcess(tmp_path / "b") as broker:  # the default check-back time: nothing ends them meanwhile
        ep = broker.endpoint
        admin = Admin(ep)
        admin.create_topic("orders", queues=1, message_type="MIXED")
        admin.create_topic("other", queues=1, message_type="MIXED")
        stub = service_pb2_grpc.MessagingServiceStub(grpc.insecure_channel(ep))
        half = v2.Message(topic=v2.Resource(name="orders"), body=b"v2 half")
        sp = half.system_properties
        sp.message_id, sp.body_encoding = uuid.uuid4().hex.upper(), v2.IDENTITY
        sp.message_type = v2.TRANSACTION
        v2_id = stub.SendMessage(sv.SendMessageRequest(messages=[half]), timeout=10).entries[0].transaction_id
        with TransactionProducer(ep, "pg-owner", lambda m: UNKNOW) as producer:
            v1_id = producer.send_message_in_transaction(Message("orders", b"v1 half"),
                                                         lambda m, a: UNKNOW).msg_id
        # another topic's name (Pub there is all a caller needs), or another producer group's half
        # message: INVALID_TRANSACTION_ID, as RocketMQ's proxy finds none under (topic, id)
        wrong = _v2_end(stub, "other", v2_id)
        assert wrong.code == v2.INVALID_TRANSACTION_ID and "of topic 'other'" in wrong.message
        assert _v2_end(stub, "orders", v1_id).code == v2.INVALID_TRANSACTION_ID
        assert visible(ep) == []
        assert _v2_end(stub, "orders", v2_id).code == v2.OK
        assert visible(ep) == [b"v2 half"]
        again = _v2_end(stub, "orders", v2_id, v2.ROLLBACK)  # ended already: not OK
        assert again.code == v2.INVALID_TRANSACTION_ID and "not a pending transaction" in again.message
        assert _v2_end(stub, "orders", "NOSUCHID").code == v2.INVALID_TRANSACTION_ID
        with TransactionProducer(ep, "pg-owner", lambda m: UNKNOW) as producer:  # still its producer's
            assert producer.end_transactions([v1_id], COMMIT) == 1
        assert sorted(visible(ep)) == [b"v1 half", b"v2 half"]


def _tx_service(root: Path) -> Any:
    from pymq_broker.manager.topic_config_manager import TopicConfigManager
    from pymq_broker.transaction.transactional_message_service import (
        TransactionalMessageService,
        TransactionConfig,
    )
    from test_store import make_store

    store = make_store(root)
    tx = TransactionalMessageService(store, TopicConfigManager(root / "topics.json"), root / "tx.json",
                                     TransactionConfig())
    tx.load()
    return store, tx


@pytest.mark.parametrize("restart", ["clean", "kill -9"])
def test_a_commit_whose_op_record_was_refused_is_not_checked_back_after_a_restart(
    tmp_path: Path, restart: str
) -> None:
    """The store refused the op record (a disk at its warning level): it waited in memory only,
    so after a restart the committed half message was pending again, checked back, committed
    again: the message twice in its topic."""
    from pymq_broker.common.mix_all import TRANS_OP_HALF_TOPIC
    from pymq_broker.store.results import PutMessageResult, PutMessageStatus
    from test_disk_full import bodies
    from test_store import msg

    store, tx = _tx_service(tmp_path)
    assert tx.prepare_messages("orders", 0, [msg(b"open", TRAN_MSG="true", PGROUP="pg", UNIQ_KEY="tx-0")]).ok
    assert tx.prepare_messages("orders", 0, [msg(b"paid", TRAN_MSG="true", PGROUP="pg", UNIQ_KEY="tx-1")]).ok
    real_put = store.put_messages

    def refuse_ops(topic: str, queue_id: int, messages: Any) -> Any:
        if topic == TRANS_OP_HALF_TOPIC:
            return PutMessageResult(PutMessageStatus.SERVICE_NOT_AVAILABLE, remark="disk full")
        return real_put(topic, queue_id, messages)

    store.put_messages = refuse_ops
    assert tx.end_transactions(["tx-1"], commit=True)[0] == 1
    assert bodies(store, "orders") == [b"paid"]
    if restart == "clean":
        store.put_messages = real_put
        store.shutdown()
    else:
        from test_store import _crash

        _crash(store)
    store, tx = _tx_service(tmp_path)
    try:
        assert set(tx.pending) == {"tx-0"}
        later = int(time.time() * 1000) + 10_000
        assert [c.msg_id for c in tx.check(now_ms=later)] == ["tx-0"]
        assert bodies(store, "orders") == [b"paid"]
    finally:
        store.shutdown()


@pytest.mark.parametrize("restart", ["clean", "kill -9"])
def test_a_commit_stopped_before_its_op_record_is_not_committed_again(tmp_path: Path, restart: str) -> None:
    """A crash between a commit's real messages and its op record left the transactions pending:
    the exactly-once sink's re-run (or a check-back) committed them again, each message twice in
    its topic (probe helper-91). The real message in its topic tells they were committed."""
    from pymq_broker.common.mix_all import TRANS_OP_HALF_TOPIC
    from pymq_broker.store.results import PutMessageResult, PutMessageStatus
    from test_disk_full import bodies
    from test_store import _crash, msg

    store, tx = _tx_service(tmp_path)
    for i in range(3):
        half = msg(b"row%d" % i, TRAN_MSG="true", PGROUP="pg", UNIQ_KEY=f"tx-{i}")
        assert tx.prepare_messages("orders", i % 2, [half]).ok
    # a committed message that names tx-2 among its KEYS is not tx-2's (review helper-94)
    assert tx.prepare_messages("orders", 0, [msg(b"row3", TRAN_MSG="true", PGROUP="pg", UNIQ_KEY="tx-3",
                                                 KEYS="tx-2")]).ok
    assert tx.end_transactions(["tx-3"], commit=True)[0] == 1
    real_put = store.put_messages

    def stop_before_the_op_record(topic: str, queue_id: int, messages: Any) -> Any:
        if topic == TRANS_OP_HALF_TOPIC:  # the broker is gone before this write
            return PutMessageResult(PutMessageStatus.SERVICE_NOT_AVAILABLE, remark="killed")
        return real_put(topic, queue_id, messages)

    store.put_messages = stop_before_the_op_record
    tx.persist = lambda: None  # nor was the op record saved for later
    assert tx.end_transactions(["tx-0", "tx-1"], commit=True)[0] == 2
    store.put_messages = real_put
    if restart == "clean":
        store.shutdown()
    else:
        _crash(store)
    store, tx = _tx_service(tmp_path)
    assert set(tx.pending) == {"tx-2"}
    assert tx.end_transactions(["tx-0", "tx-1", "tx-2"], commit=True)[0] == 1  # the sink's re-run
    _crash(store)
    store, tx = _tx_service(tmp_path)
    try:
        assert tx.pending == {}
        assert sorted(bodies(store, "orders", 0) + bodies(store, "orders", 1)) == [
            b"row0", b"row1", b"row2", b"row3"]
    finally:
        store.shutdown()


def test_a_half_message_re_put_by_a_check_back_counts_once_after_restarts(tmp_path: Path) -> None:
    """A check-back re-puts the half message and marks the old one done; when that op record was
    neither stored nor saved, the old copy came back pending once the new one was resolved."""
    from pymq_broker.common.mix_all import TRANS_OP_HALF_TOPIC
    from pymq_broker.store.results import PutMessageResult, PutMessageStatus
    from test_disk_full import bodies
    from test_store import _crash, msg

    store, tx = _tx_service(tmp_path)
    for body, key in ((b"open", "tx-0"), (b"paid", "tx-1")):  # tx-0 stays open: the check offset waits
        assert tx.prepare_messages("orders", 0, [msg(body, TRAN_MSG="true", PGROUP="pg", UNIQ_KEY=key)]).ok
    real_put = store.put_messages

    def refuse_ops(topic: str, queue_id: int, messages: Any) -> Any:
        if topic == TRANS_OP_HALF_TOPIC:
            return PutMessageResult(PutMessageStatus.SERVICE_NOT_AVAILABLE, remark="disk full")
        return real_put(topic, queue_id, messages)

    def cannot_save() -> None:
        raise OSError("no space left on device")

    store.put_messages = refuse_ops
    tx.persist = cannot_save
    checked = tx.check(now_ms=int(time.time() * 1000) + 10_000)  # both re-put, their old copies "done"
    assert sorted(c.msg_id for c in checked) == ["tx-0", "tx-1"]
    _crash(store)
    store, tx = _tx_service(tmp_path)
    assert set(tx.pending) == {"tx-0", "tx-1"}
    assert tx.end_transactions(["tx-1"], commit=True)[0] == 1  # the producer answers COMMIT
    _crash(store)
    store, tx = _tx_service(tmp_path)
    try:
        assert set(tx.pending) == {"tx-0"}
        assert [c.msg_id for c in tx.check(now_ms=int(time.time() * 1000) + 100_000)] == ["tx-0"]
        assert bodies(store, "orders") == [b"paid"]
    finally:
        store.shutdown()


def test_a_committed_transactional_message_given_up_reaches_the_dead_letter_queue(
    tx_broker: BrokerProcess,
) -> None:
    """A committed message keeps TRAN_MSG; the copy a consumer makes of it must not (RocketMQ's
    broker stores such a copy bound for %DLQ% as a half message of the original producer group:
    tests/test_rocketmq_transactions.py; the pymq broker decides the DLQ first, so here the
    property itself is what is checked)."""
    ep = tx_broker.endpoint
    with TransactionProducer(ep, "tx", lambda m: COMMIT) as producer:
        producer.send_message_in_transaction(Message("orders", b"tx"), lambda m, a: COMMIT)
    consumer = PullConsumer(ep, "gave-up")
    [m] = [m for m in read_all(ep, "orders") if m.body == b"tx"]
    assert m.properties.get("TRAN_MSG") == "true"  # what makes the copy's rule matter
    result = consumer.send_back_orderly(m, 1, 1, "gave up")
    assert (result.topic, result.dead_letter, result.fallback) == ("%DLQ%gave-up", True, False)
    assert wait_for(lambda: [d.body for d in read_all(ep, "%DLQ%gave-up")] == [b"tx"])
    [dead] = read_all(ep, "%DLQ%gave-up")
    assert "TRAN_MSG" not in dead.properties and dead.reconsume_times == 2


def _prepared_counting_writes(tmp_path: Path, n: int) -> tuple[Any, Any, list[object]]:
    """A transaction service with ``n`` half messages (tx-0 ...) prepared, and the snapshots it
    writes from then on."""
    from test_store import msg

    store, tx = _tx_service(tmp_path)
    for i in range(n):
        assert tx.prepare_messages("orders", 0, [msg(b"m%d" % i, TRAN_MSG="true", PGROUP="pg",
                                                     UNIQ_KEY=f"tx-{i}")]).ok
    writes: list[object] = []
    real_write = tx.write
    tx.write = lambda snapshot: (writes.append(snapshot), real_write(snapshot))[1]
    return store, tx, writes


def test_a_check_back_round_of_many_transactions_writes_its_op_record_and_state_once(tmp_path: Path) -> None:
    """check() runs on the event loop: it marked each re-put half message done by itself, an op
    record and a write and fsync of transactionCheck.json per unresolved transaction (2,000 due at
    once held every client ~10 s). One op record and one write for the round; a restart after it
    still finds each transaction pending once, checked once."""
    from pymq_broker.common.mix_all import TRANS_OP_HALF_TOPIC

    n = 50
    store, tx, writes = _prepared_counting_writes(tmp_path, n)
    ops = store.consume_queue(TRANS_OP_HALF_TOPIC, 0)
    ops_before = ops.max_offset_in_queue if ops is not None else 0
    checks = tx.check(now_ms=int(time.time() * 1000) + 10_000)
    assert sorted(c.msg_id for c in checks) == sorted(f"tx-{i}" for i in range(n))
    assert all(c.check_times == 1 for c in checks)
    assert len(writes) <= 1
    assert store.consume_queue(TRANS_OP_HALF_TOPIC, 0).max_offset_in_queue - ops_before == 1
    store.shutdown()
    store, tx = _tx_service(tmp_path)
    try:
        assert set(tx.pending) == {f"tx-{i}" for i in range(n)}
        again = tx.check(now_ms=int(time.time() * 1000) + 120_000)
        assert sorted((c.msg_id, c.check_times) for c in again) == sorted((f"tx-{i}", 2) for i in range(n))
    finally:
        store.shutdown()


def test_ending_transactions_one_by_one_does_not_write_the_check_offset_each_time(tmp_path: Path) -> None:
    """end_transactions runs on the event loop: each end that moved the check offset wrote and
    fsynced transactionCheck.json there (~5 ms a transaction, every client waiting). The offset is
    left for the controller's periodic write; a restart that finds an older one (a kill -9 before
    that write) still knows every ended transaction from the op records."""
    from test_store import _crash

    n = 40
    store, tx, writes = _prepared_counting_writes(tmp_path, n)
    for i in range(n - 1):
        assert tx.end_transactions([f"tx-{i}"], commit=i % 2 == 0)[0] == 1
    assert writes == [] and tx.dirty
    _crash(store)
    store, tx = _tx_service(tmp_path)
    try:
        assert set(tx.pending) == {f"tx-{n - 1}"}
    finally:
        store.shutdown()

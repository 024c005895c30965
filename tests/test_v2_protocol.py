"""apache.rocketmq.v2's generated code, the proxy's conversions and its pop bookkeeping (no broker process).

One test runs an EmbeddedBroker and the official Python client in one fresh
interpreter, in both import orders: both copies of the apache.rocketmq.v2
messages (the client's in protobuf's default pool, the broker's in its own)
must load, and the client must work against the broker.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from pymq_broker.manager.consumer_offset_manager import ConsumerOffsetManager
from pymq_broker.proxy.message_converter import (
    check_delivery_time,
    parse_record,
    split_records,
    to_message_to_send,
    to_v2_message,
)
from pymq_broker.proxy.pop_message_manager import DeliveryAttempts, PopMessageManager
from pymq_broker.proxy.proxy_config import ProxyConfig
from pymq_broker.proxy.status import ProxyException
from pymq_broker.store.commit_log import MessageToStore
from pymq_broker.store.config import MessageStoreConfig
from pymq_broker.store.message_store import DefaultMessageStore
from pymq_proto.record import decode_properties
from pymq_proto.rocketmq_v2 import definition_pb2 as v2
from pymq_proto.rocketmq_v2.generate import stale_files

ROOT = Path(__file__).resolve().parent.parent


def test_generated_code_is_fresh() -> None:
    assert stale_files() == [], "run `make proto` and commit the result"


def test_in_a_pool_of_its_own() -> None:
    from google.protobuf import descriptor_pool
    from pymq_proto.rocketmq_v2 import _pool

    assert v2.DESCRIPTOR.pool is _pool.Default()
    assert v2.DESCRIPTOR.pool is not descriptor_pool.Default()
    assert v2.DESCRIPTOR.name == "apache/rocketmq/v2/definition.proto"  # the published file, unchanged
    assert v2.Message.DESCRIPTOR.full_name == "apache.rocketmq.v2.Message"


_ONE_PROCESS = textwrap.dedent("""
    import sys
    if sys.argv[1] == "client-first":
        import rocketmq
        from pymq_broker import EmbeddedBroker
    else:
        from pymq_broker import EmbeddedBroker
        import rocketmq
    from pyspark_pymq.client import Admin
    from rocketmq import ClientConfiguration, Credentials, FilterExpression, Message, Producer, SimpleConsumer

    with EmbeddedBroker() as broker:
        Admin(broker.endpoint).create_topic("one-process", 1)
        config = ClientConfiguration(broker.endpoint, Credentials(), request_timeout=5)
        producer = Producer(config, ("one-process",))
        producer.startup()
        m = Message()
        m.topic, m.body, m.tag = "one-process", b"same process", "T"
        producer.send(m)
        consumer = SimpleConsumer(config, "g", {"one-process": FilterExpression("*")}, await_duration=2)
        consumer.startup()
        got = []
        for _ in range(10):
            got += consumer.receive(16, 30)
            if got:
                break
        for message in got:
            consumer.ack(message)
        consumer.shutdown()
        producer.shutdown()
        print("RECEIVED", [(x.body, x.tag) for x in got])
""")


@pytest.mark.integration  # an EmbeddedBroker in a child process
@pytest.mark.parametrize("order", ["client-first", "broker-first"])
def test_broker_and_official_client_in_one_process(order: str) -> None:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(ROOT / d) for d in ("connector", "broker_stub", "proto")] + [env.get("PYTHONPATH", "")]
    )
    done = subprocess.run([sys.executable, "-c", _ONE_PROCESS, order], env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-4000:]
    assert "RECEIVED [(b'same process', 'T')]" in done.stdout, done.stdout[-2000:] + done.stderr[-2000:]


def _message(**system: object) -> v2.Message:
    m = v2.Message(body=system.pop("body", b"payload"))
    m.topic.name = "orders"
    m.user_properties["color"] = "red"
    m.system_properties.message_id = "ID-1"
    m.system_properties.message_type = system.pop("message_type", v2.NORMAL)  # type: ignore[assignment]
    for key, value in system.items():
        if key == "keys":
            m.system_properties.keys.extend(value)  # type: ignore[call-overload]
        else:
            setattr(m.system_properties, key, value)
    return m


def _send(m: v2.Message, now_ms: int = 1_000_000) -> dict[str, str]:
    sent = to_message_to_send(m, config=ProxyConfig(), max_body_size=100,
                              now_ms=now_ms)
    return decode_properties(sent.properties)


def test_v2_system_properties_become_rocketmqs_properties() -> None:
    props = _send(_message(tag="TagA", keys=["k1", "k2"], message_group="g7", message_type=v2.FIFO))
    assert props == {"color": "red", "TAGS": "TagA", "KEYS": "k1 k2", "UNIQ_KEY": "ID-1",
                     "__SHARDINGKEY": "g7"}


def test_delivery_timestamp_is_kept_exactly_up_to_max_delay_time() -> None:
    config = ProxyConfig(max_delay_time_mills=10_000)
    check_delivery_time(1_000_000, config, now_ms=1_000_000)
    check_delivery_time(1_010_000, config, now_ms=1_000_000)
    with pytest.raises(ProxyException) as err:
        check_delivery_time(1_010_001, config, now_ms=1_000_000)
    assert err.value.code == v2.ILLEGAL_DELIVERY_TIME and "maxDelayTimeMills 10000" in err.value.message
    m = _message(message_type=v2.DELAY)
    m.system_properties.delivery_timestamp.FromMilliseconds(1_004_321)
    props = _send(m)  # at 1_000_000
    assert props["TIMER_DELIVER_MS"] == "1004321"
    assert "DELAY" not in props  # the timer delivers it, not a delay level


@pytest.mark.parametrize(("fields", "code"), [
    ({"body": b""}, v2.MESSAGE_BODY_EMPTY),
    ({"body": b"x" * 101}, v2.MESSAGE_BODY_TOO_LARGE),
    ({"tag": " "}, v2.ILLEGAL_MESSAGE_TAG),
    ({"keys": [""]}, v2.ILLEGAL_MESSAGE_KEY),
    ({"message_type": v2.FIFO}, v2.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE),
    ({"message_group": "g", "message_type": v2.NORMAL}, v2.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE),
    ({"message_group": "g" * 65, "message_type": v2.FIFO}, v2.ILLEGAL_MESSAGE_GROUP),
    ({"message_id": ""}, v2.ILLEGAL_MESSAGE_ID),
])
def test_bad_messages_are_refused_with_their_code(fields: dict[str, object], code: int) -> None:
    with pytest.raises(ProxyException) as err:
        _send(_message(**fields))
    assert err.value.code == code


def _store(tmp_path: Path) -> DefaultMessageStore:
    host = b"\x7f\x00\x00\x01\x00\x00\x1f\x90"  # 127.0.0.1:8080
    store = DefaultMessageStore(MessageStoreConfig(store_path_root_dir=tmp_path), host)
    store.load()
    return store


def test_stored_record_reads_back_as_the_v2_message(tmp_path: Path) -> None:
    store = _store(tmp_path)
    try:
        props = _send(_message(tag="TagA", keys=["k1"], message_group="g7", message_type=v2.FIFO,
                               born_host="10.1.2.3"))
        encoded = "".join(f"{k}\x01{v}\x02" for k, v in props.items()).encode()
        store.put_messages("orders", 0, [MessageToStore(b"payload", 0, encoded, 123, 2)])
        [m] = split_records(store.get_message("orders", 0, 0, 10).records)
        out = to_v2_message(m, receipt_handle="h", delivery_attempt=4, invisible_ms=5000)
        sp = out.system_properties
        assert (out.topic.name, out.body) == ("orders", b"payload")
        assert dict(out.user_properties) == {"color": "red"}
        assert (sp.tag, list(sp.keys), sp.message_id, sp.message_group) == ("TagA", ["k1"], "ID-1", "g7")
        assert (sp.message_type, sp.delivery_attempt, sp.receipt_handle) == (v2.FIFO, 4, "h")
        assert sp.born_timestamp.ToMilliseconds() == 123 and sp.store_host == "127.0.0.1:8080"
        assert to_v2_message(m).system_properties.delivery_attempt == 3  # reconsume times + 1
        assert parse_record(store.look_message_by_offset(m.commit_log_offset) or b"").body == b"payload"
        assert not sp.HasField("dead_letter_queue")
        assert sp.born_host == "10.1.2.3" and props["__BORNHOST"] == "10.1.2.3"  # SendMessageActivity
    finally:
        store.shutdown()


def test_a_dead_letter_reads_back_with_its_origin(tmp_path: Path) -> None:
    """GrpcConverter: DLQ_ORIGIN_TOPIC and DLQ_ORIGIN_MESSAGE_ID become dead_letter_queue."""
    store = _store(tmp_path)
    try:
        encoded = b"UNIQ_KEY\x01ID-9\x02DLQ_ORIGIN_TOPIC\x01orders\x02DLQ_ORIGIN_MESSAGE_ID\x01AB12\x02"
        store.put_messages("%DLQ%g", 0, [MessageToStore(b"payload", 0, encoded, 123, 3)])
        [m] = split_records(store.get_message("%DLQ%g", 0, 0, 10).records)
        out = to_v2_message(m)
        dlq = out.system_properties.dead_letter_queue
        assert (dlq.topic, dlq.message_id) == ("orders", "AB12")
        assert dict(out.user_properties) == {}
    finally:
        store.shutdown()


def test_pop_ack_redelivery_and_committed_offset(tmp_path: Path) -> None:
    store = _store(tmp_path)
    offsets = ConsumerOffsetManager(tmp_path / "offsets.json")
    try:
        store.put_messages("t", 0, [MessageToStore(f"m{i}".encode(), 0, b"", 1, 0) for i in range(3)])
        pop = PopMessageManager(store, offsets)
        got = pop.pop_new("g", "t", 0, 10, invisible_ms=1000, now_ms=10_000)
        assert [p.message.body for p in got] == [b"m0", b"m1", b"m2"]
        assert pop.pop_new("g", "t", 0, 10, invisible_ms=1000, now_ms=10_000) == []
        pop.ack("g", "t", got[1].inflight.handle, now_ms=10_500)  # out of order: offset stays at 0
        assert offsets.query_offset("g", "t", 0) == 0
        pop.ack("g", "t", got[0].inflight.handle, now_ms=10_500)
        assert offsets.query_offset("g", "t", 0) == 2
        with pytest.raises(ProxyException) as err:
            pop.ack("g", "t", got[0].inflight.handle, now_ms=10_500)  # twice
        assert err.value.code == v2.INVALID_RECEIPT_HANDLE
        assert pop.due("g", "t", now_ms=10_999, limit=10) == []
        [due] = pop.due("g", "t", now_ms=11_000, limit=10)
        again = pop.redeliver(due, 1000, now_ms=11_000)
        assert (again.queue_offset, again.delivery_attempt) == (2, 2)
        with pytest.raises(ProxyException):
            pop.ack("g", "t", got[2].inflight.handle, now_ms=11_000)  # replaced by the redelivery
        renewed = pop.change_invisible_duration("g", "t", again.handle, 5000, now_ms=11_500)
        assert pop.due("g", "t", now_ms=12_500, limit=10) == []
        pop.ack("g", "t", renewed.handle, now_ms=12_500)
        assert offsets.query_offset("g", "t", 0) == 3
        assert PopMessageManager(store, offsets).next_offset("g", "t", 0) == 3  # a restart starts there
    finally:
        store.shutdown()


def test_acks_above_the_committed_offset_survive_a_restart(tmp_path: Path) -> None:
    """The committed offset is the lowest pending one: a restart read every message acked above it
    again (duplicates). The stored next offset and pending messages tell them apart, as RocketMQ's
    pop checkpoints and acks do: only the pending ones come back, their attempts counted on."""
    store = _store(tmp_path)
    offsets = ConsumerOffsetManager(tmp_path / "offsets.json")
    path = tmp_path / "popDeliveryAttempts.json"
    try:
        store.put_messages("t", 0, [MessageToStore(f"m{i}".encode(), 0, b"", 1, 0) for i in range(5)])
        pop = PopMessageManager(store, offsets, attempts=DeliveryAttempts(path))
        got = pop.pop_new("g", "t", 0, 4, invisible_ms=60_000, now_ms=0)
        for acked in (1, 3):
            pop.ack("g", "t", got[acked].inflight.handle, now_ms=10)
        pop.attempts.persist()  # a clean shutdown
        assert offsets.query_offset("g", "t", 0) == 0
        restored = DeliveryAttempts(path)
        restored.load()
        pop = PopMessageManager(store, offsets, attempts=restored)  # the broker restarted
        [new] = pop.pop_new("g", "t", 0, 10, 60_000, now_ms=100)
        assert (new.message.body, new.inflight.delivery_attempt) == (b"m4", 1)
        assert pop.due("g", "t", now_ms=59_999, limit=10) == []  # m0, m2 hidden as before the restart
        again = [pop.redeliver(f, 60_000, 60_000) for f in pop.due("g", "t", now_ms=60_000, limit=10)]
        assert [(f.queue_offset, f.delivery_attempt) for f in again] == [(0, 2), (2, 2)]
        for f in [*again, new.inflight]:
            pop.ack("g", "t", f.handle, now_ms=60_010)
        assert offsets.query_offset("g", "t", 0) == 5
        store.put_messages("t", 0, [MessageToStore(b"m5", 0, b"", 1, 0)])
        assert [p.message.body for p in pop.pop_new("g", "t", 0, 10, 60_000, now_ms=60_100)] == [b"m5"]
    finally:
        store.shutdown()


def test_messages_in_flight_stay_in_flight_across_a_restart(tmp_path: Path) -> None:
    """A restart handed every unacked message out again at once, and refused the receipt handles
    its consumers held (INVALID_RECEIPT_HANDLE): each message a consumer was still working on came
    twice. As RocketMQ's (whose pop checkpoints are on disk), a message stays hidden until its
    invisible time and the handle a consumer holds (after a change of invisible duration too)
    acks it after the restart; an auto-renewed one is renewed again while its client is back."""
    store = _store(tmp_path)
    offsets = ConsumerOffsetManager(tmp_path / "offsets.json")
    try:
        _put(store, "acked-later", "renewed", "auto", "let-go")
        pop = PopMessageManager(store, offsets, attempts=_attempts(tmp_path), renewable=lambda c: c == "push")
        a, b = pop.pop_new("g", "t", 0, 2, invisible_ms=60_000, now_ms=0)
        [c] = pop.pop_new("g", "t", 0, 1, invisible_ms=60_000, now_ms=0, owner="push")
        [d] = pop.pop_new("g", "t", 0, 1, invisible_ms=30_000, now_ms=0)
        b_handle = pop.change_invisible_duration("g", "t", b.inflight.handle, 120_000, now_ms=10).handle
        pop = _restarted(store, tmp_path, pop, offsets)
        pop.renewable = lambda client: client == "push"  # the push client is connected again
        assert pop.ack("g", "t", a.inflight.handle, now_ms=20).queue_offset == 0  # a handle of the last run
        with pytest.raises(ProxyException, match="unknown"):  # replaced by the change before the restart
            pop.ack("g", "t", b.inflight.handle, now_ms=20)
        assert pop.pop_new("g", "t", 0, 10, 60_000, now_ms=20) == []  # nothing new, nothing early
        assert pop.due("g", "t", now_ms=29_999, limit=10) == []
        [due] = pop.due("g", "t", now_ms=30_000, limit=10)  # the one without renewal, at its time
        assert (due.handle, due.queue_offset) == (d.inflight.handle, 3)
        assert pop.redeliver(due, 60_000, 30_000).delivery_attempt == 2
        assert pop.due("g", "t", now_ms=60_000, limit=10) == []  # c renewed: its client is back
        assert pop.ack("g", "t", c.inflight.handle, now_ms=60_001).queue_offset == 2
        assert pop.ack("g", "t", b_handle, now_ms=60_002).queue_offset == 1
        assert pop.offsets.query_offset("g", "t", 0) == 3  # d (queue offset 3) is still in flight
    finally:
        store.shutdown()


def test_pending_messages_of_an_older_file_come_back_at_once(tmp_path: Path) -> None:
    """A popDeliveryAttempts.json written before the in-flight state was kept holds attempts alone:
    those messages are delivered again at once, their attempts counted on (as then); so is one
    whose entry this broker cannot read (a damaged file must not stop the broker, nor two entries
    with one handle leave one of them unreachable, its queue's offset stuck)."""
    store = _store(tmp_path)
    try:
        _put(store, "m0", "m1", "m2", "m3", "m4", "m5")
        hidden = [1, 0, "h1", 10**12, 60_000, "", 0, 0]
        attempts = DeliveryAttempts(None)
        attempts.table = {"g@t": {"0:0": 1, "0:1": ["not", "as", "written"], "0:2": 2, "0:3": hidden,
                                  "0:4": hidden, "0:5": [1, float("inf"), "h5", 1, 1, "", 0, 0]}}
        attempts.next_offsets = {"g@t": {"0": 6}}
        offsets = ConsumerOffsetManager(tmp_path / "offsets.json")
        offsets.commit_offset("g", "t", 0, 0)
        pop = PopMessageManager(store, offsets, attempts=attempts)
        got = pop.pop_new("g", "t", 0, 10, 60_000, now_ms=0)
        assert [(p.message.body, p.inflight.delivery_attempt) for p in got] == [
            (b"m0", 2), (b"m1", 2), (b"m2", 3), (b"m4", 2), (b"m5", 2)]  # m3 in flight, as stored
        for p in got:
            pop.ack("g", "t", p.inflight.handle, now_ms=1)
        pop.ack("g", "t", "h1", now_ms=1)
        assert offsets.query_offset("g", "t", 0) == 6
    finally:
        store.shutdown()


def test_a_stored_next_offset_past_the_queue_end_is_not_taken_for_acks(tmp_path: Path) -> None:
    """Messages lost in a crash (async flush) leave a stored next offset past the queue's end: the new
    messages written at those offsets are delivered, not taken for acked ones."""
    store = _store(tmp_path)
    try:
        store.put_messages("t", 0, [MessageToStore(b"m0", 0, b"", 1, 0)])
        attempts = DeliveryAttempts(None)
        attempts.next_offsets = {"g@t": {"0": 9}}
        offsets = ConsumerOffsetManager(tmp_path / "offsets.json")
        offsets.commit_offset("g", "t", 0, 0)
        pop = PopMessageManager(store, offsets, attempts=attempts)
        store.put_messages("t", 0, [MessageToStore(b"m1", 0, b"", 1, 0)])
        assert [p.message.body for p in pop.pop_new("g", "t", 0, 10, 60_000, now_ms=0)] == [b"m1"]
    finally:
        store.shutdown()


def _put(store: DefaultMessageStore, *bodies: str) -> None:
    store.put_messages("t", 0, [MessageToStore(b.encode(), 0, b"", 1, 0) for b in bodies])


def _attempts(tmp_path: Path) -> DeliveryAttempts:
    return DeliveryAttempts(tmp_path / "popDeliveryAttempts.json")


def _restarted(store: DefaultMessageStore, tmp_path: Path, pop: PopMessageManager | None = None,
               offsets: ConsumerOffsetManager | None = None) -> PopMessageManager:
    """The pop state as a broker restart reads it back: from the files ``pop`` and ``offsets`` wrote."""
    if pop is not None:
        pop.attempts.persist()
    if offsets is not None:
        offsets.persist()
    attempts = _attempts(tmp_path)
    attempts.load()
    loaded = ConsumerOffsetManager(tmp_path / "offsets.json")
    loaded.load()
    return PopMessageManager(store, loaded, attempts=attempts)


def _receive(pop: PopMessageManager, n: int, now_ms: int, ack: bool = False) -> list[str]:
    got = pop.pop_new("g", "t", 0, n, 60_000, now_ms)
    for p in got if ack else ():
        pop.ack("g", "t", p.inflight.handle, now_ms)
    return [p.message.body.decode() for p in got]


def test_a_second_restart_does_not_deliver_again_what_was_acked_before_the_first(tmp_path: Path) -> None:
    """A receive after a restart that did not reach the stored next offset stored its own, lower
    one: what was acked before the restart was delivered again after the next."""
    store = _store(tmp_path)
    try:
        _put(store, *(f"m{i}" for i in range(10)))
        offsets = ConsumerOffsetManager(tmp_path / "offsets.json")
        pop = PopMessageManager(store, offsets, attempts=_attempts(tmp_path))
        got = pop.pop_new("g", "t", 0, 10, 60_000, 0)
        for p in got[1:]:
            pop.ack("g", "t", p.inflight.handle, 10)  # m0 pending, m1..m9 acked
        pop = _restarted(store, tmp_path, pop, offsets)
        assert _receive(pop, 1, 100) == []  # m0 is still in flight
        [m0] = pop.due("g", "t", now_ms=60_000, limit=10)
        assert (m0.queue_offset, pop.redeliver(m0, 60_000, 60_000).delivery_attempt) == (0, 2)
        pop = _restarted(store, tmp_path, pop, pop.offsets)
        assert _receive(pop, 32, 60_100) == []
        [m0] = pop.due("g", "t", now_ms=120_000, limit=10)  # m0 alone: m1..m9 were acked
        assert (m0.queue_offset, pop.redeliver(m0, 60_000, 120_000).delivery_attempt) == (0, 3)
    finally:
        store.shutdown()


def test_messages_lost_in_a_crash_leave_no_pending_offset_that_skips_new_ones(tmp_path: Path) -> None:
    """An OS crash lost m8, m9 (not flushed) while m9 was pending: the restart skipped to the stored
    pending offset 9, so the new message written at 8 was never delivered, and the one at 9 counted
    the lost m9's delivery as its own."""
    store = _store(tmp_path)
    try:
        _put(store, *(f"m{i}" for i in range(8)))
        attempts = DeliveryAttempts(None)
        attempts.table = {"g@t": {"0:5": 1, "0:9": 1}}  # as stored before the crash: m5, m9 pending
        attempts.next_offsets = {"g@t": {"0": 10}}
        offsets = ConsumerOffsetManager(tmp_path / "offsets.json")
        offsets.commit_offset("g", "t", 0, 5)
        pop = PopMessageManager(store, offsets, attempts=attempts)
        _put(store, "new8", "new9", "new10")
        got = [p for i in range(6) for p in pop.pop_new("g", "t", 0, 1, 60_000, i)]
        assert [(p.message.body, p.inflight.delivery_attempt) for p in got] == [
            (b"m5", 2), (b"new8", 1), (b"new9", 1), (b"new10", 1)]
    finally:
        store.shutdown()


def test_a_new_groups_unacked_messages_come_back_when_its_offset_was_not_written(tmp_path: Path) -> None:
    """The offsets and the pop state are written apart: a kill -9 between them left a group read
    before it without a committed offset, so it started at the queue's end (a queue whose head is
    not in memory) and never got its unacked messages again."""
    store = _store(tmp_path)
    try:
        _put(store, *(f"m{i}" for i in range(6)))
        offsets = ConsumerOffsetManager(tmp_path / "offsets.json")
        offsets.persist()  # before the group's first commit
        store.check_in_mem_by_consume_offset = lambda *_: False  # type: ignore[method-assign]
        pop = PopMessageManager(store, offsets, attempts=_attempts(tmp_path))
        assert pop.next_offset("g", "t", 0) == 6  # a new group: the queue's end
        _put(store, *(f"m{i}" for i in range(6, 10)))
        assert _receive(pop, 32, 0) == ["m6", "m7", "m8", "m9"]
        pop = _restarted(store, tmp_path, pop)  # the pop state written, the offsets not: kill -9
        assert pop.offsets.query_offset("g", "t", 0) == -1
        assert _receive(pop, 32, 100) == []  # in flight until 60 s after their receive
        assert [f.queue_offset for f in pop.due("g", "t", now_ms=60_000, limit=10)] == [6, 7, 8, 9]
    finally:
        store.shutdown()


def test_pending_messages_a_restart_passes_are_forgotten(tmp_path: Path) -> None:
    """A message pending before a restart that the read then passes (the group committed past it)
    kept its entry in popDeliveryAttempts.json for ever."""
    store = _store(tmp_path)
    try:
        _put(store, "m0", "m1", "m2")
        offsets = ConsumerOffsetManager(tmp_path / "offsets.json")
        pop = PopMessageManager(store, offsets, attempts=_attempts(tmp_path))
        assert _receive(pop, 3, 0) == ["m0", "m1", "m2"]
        offsets.commit_offset("g", "t", 0, 3)  # a PullConsumer of the group committed past them
        pop = _restarted(store, tmp_path, pop, offsets)
        _put(store, "m3")
        assert _receive(pop, 10, 10, ack=True) == ["m3"]
        assert pop.attempts.table == {}
    finally:
        store.shutdown()


def test_auto_renew_while_the_client_is_connected(tmp_path: Path) -> None:
    store = _store(tmp_path)
    connected = {"push-client"}
    try:
        store.put_messages("t", 0, [MessageToStore(b"slow", 0, b"", 1, 0)])
        pop = PopMessageManager(store, ConsumerOffsetManager(tmp_path / "offsets.json"),
                                renewable=lambda client: client in connected, max_renew_ms=10_000)
        [p] = pop.pop_new("g", "t", 0, 10, invisible_ms=1000, now_ms=0, owner="push-client")
        assert pop.due("g", "t", now_ms=1500, limit=10) == []  # renewed: its client is connected
        assert pop.ack("g", "t", p.inflight.handle, now_ms=2800).queue_offset == 0  # the handle still holds
        store.put_messages("t", 0, [MessageToStore(b"orphan", 0, b"", 1, 0)])
        [q] = pop.pop_new("g", "t", 0, 10, invisible_ms=1000, now_ms=3000, owner="push-client")
        connected.clear()  # the client went away: its message is due after its invisible time
        [due] = pop.due("g", "t", now_ms=4000, limit=10)
        assert due.handle == q.inflight.handle
    finally:
        store.shutdown()


def test_auto_renew_follows_rocketmqs_renew_strategy(tmp_path: Path) -> None:
    """Each renewal hid the message for its receive's invisible duration again; the proxy's
    RenewStrategyPolicy hides it 1, 3, 5, 10, 30 and then 60 minutes."""
    store = _store(tmp_path)
    try:
        store.put_messages("t", 0, [MessageToStore(b"held", 0, b"", 1, 0)])
        pop = PopMessageManager(store, ConsumerOffsetManager(tmp_path / "offsets.json"),
                                renewable=lambda client: True)
        [p] = pop.pop_new("g", "t", 0, 10, invisible_ms=60_000, now_ms=0, owner="push-client")
        now, hidden = 60_000, []
        for _ in range(7):
            assert pop.due("g", "t", now_ms=now, limit=10) == []
            hidden.append((p.inflight.invisible_until - now) // 60_000)
            now = p.inflight.invisible_until
        assert hidden == [1, 3, 5, 10, 30, 60, 60]
    finally:
        store.shutdown()


def test_fifo_due_waits_for_the_queue_and_goes_lowest_offset_first(tmp_path: Path) -> None:
    store = _store(tmp_path)
    try:
        store.put_messages("t", 0, [MessageToStore(f"m{i}".encode(), 0, b"", 1, 0) for i in range(3)])
        pop = PopMessageManager(store, ConsumerOffsetManager(tmp_path / "offsets.json"))
        got = pop.pop_new("g", "t", 0, 10, invisible_ms=1000, now_ms=0, fifo=True)
        # m2 due first (a shorter invisible duration), m0 in flight still: nothing yet
        pop.change_invisible_duration("g", "t", got[2].inflight.handle, 100, now_ms=0)
        assert pop.due("g", "t", now_ms=500, limit=10, fifo=True) == []
        [m0] = pop.due("g", "t", now_ms=1000, limit=1, fifo=True)  # all due: the lowest offset
        assert m0.queue_offset == 0
        again = pop.redeliver(m0, 1000, now_ms=1000)
        assert pop.due("g", "t", now_ms=1000, limit=10, fifo=True) == []  # m0 in flight again
        pop.ack("g", "t", again.handle, now_ms=1500)
        taken = pop.due("g", "t", now_ms=1500, limit=10, fifo=True)
        assert [f.queue_offset for f in taken] == [1, 2]
        pop.put_back(taken[1])  # a receive that did not get to m2: due again, after m1
        assert pop.due("g", "t", now_ms=1500, limit=10, fifo=True) == []  # m1 is still being handled
        pop.ack("g", "t", pop.redeliver(taken[0], 1000, now_ms=1500).handle, now_ms=1600)
        [m2] = pop.due("g", "t", now_ms=1600, limit=10, fifo=True)
        assert m2.queue_offset == 2
    finally:
        store.shutdown()


def test_a_reset_during_a_receives_dead_letter_write_leaves_the_new_state_alone(tmp_path: Path) -> None:
    """A receive takes the due messages, then awaits a DLQ write; a ResetOffset runs meanwhile. The
    receive then redelivered, put back or removed what it had taken into the new state: a message
    the operator skipped came back and pulled the committed offset under the reset; after a
    backward reset one offset had two live copies, and acking one dropped the other from the books
    (lost at the next restart). What the reset forgot is dropped now, whatever path it takes."""
    store = _store(tmp_path)
    offsets = ConsumerOffsetManager(tmp_path / "offsets.json")
    try:
        store.put_messages("t", 0, [MessageToStore(f"m{i}".encode(), 0, b"", 1, 0) for i in range(10)])
        pop = PopMessageManager(store, offsets, attempts=DeliveryAttempts(tmp_path / "attempts.json"))

        def reset(offset: int) -> None:  # as AdminBrokerProcessor.reset_offset: the offset, then the hook
            offsets.commit_offset("g", "t", 0, offset)
            pop.reset_offset("g", "t", {0: offset})

        pop.pop_new("g", "t", 0, 2, invisible_ms=1000, now_ms=10_000)  # m0, m1 in flight
        due = pop.due("g", "t", now_ms=11_000, limit=10)  # a receive takes both, awaits m0's DLQ write
        reset(8)
        pop.remove(due[0])  # its DLQ write done
        pop.put_back(due[1])  # the receive was cancelled
        pop.postpone(due[1], 100, now_ms=11_000)
        assert pop.due("g", "t", now_ms=20_000, limit=10) == []
        got = pop.pop_new("g", "t", 0, 10, invisible_ms=1000, now_ms=11_000)
        assert [p.message.body for p in got] == [b"m8", b"m9"] and offsets.query_offset("g", "t", 0) == 8
        assert set(pop.attempts.table["g@t"]) == {"0:8", "0:9"}

        for p in got:
            pop.ack("g", "t", p.inflight.handle, now_ms=11_100)
        reset(3)  # back, with m8 taken by a receive (due) meanwhile
        again = pop.pop_new("g", "t", 0, 10, invisible_ms=1000, now_ms=12_000)
        assert [p.message.queue_offset for p in again] == list(range(3, 10))
        stale = pop.due("g", "t", now_ms=13_000, limit=10)
        reset(3)
        for f in stale:
            pop.put_back(f)
        fresh = pop.pop_new("g", "t", 0, 10, invisible_ms=5000, now_ms=13_000)
        assert [p.message.queue_offset for p in fresh] == list(range(3, 10))
        assert pop.in_flight("g", "t") == 7 and pop.due("g", "t", now_ms=13_500, limit=10) == []
        for p in fresh[1:]:
            pop.ack("g", "t", p.inflight.handle, now_ms=13_600)
        assert offsets.query_offset("g", "t", 0) == 3  # m3 is still pending
    finally:
        store.shutdown()

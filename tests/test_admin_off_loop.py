"""Admin writes off the event loop: CreateTopic, DeleteTopic and the other admin calls that save a
config file answer once it is on disk, while the broker serves everyone else.

A topics.json write (encode, write, fsync, rename) took 33 ms at 1,231 topics and 163 ms at 3,073,
and removing a 1,024-queue topic's files 0.2-0.6 s: on the event loop, every client of the broker
waited that long. Here the slow part is held up by a gate, and another request must be served
while it waits; nothing measures time.
"""

from __future__ import annotations

import asyncio
import errno
import inspect
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, cast

import pytest
from pymq_broker.broker_config import BrokerConfig
from pymq_broker.manager.consumer_offset_manager import ConsumerOffsetManager
from pymq_broker.manager.subscription_group_manager import SubscriptionGroupManager
from pymq_broker.manager.topic_config_manager import TopicConfig, TopicConfigManager
from pymq_broker.processor.admin_broker_processor import AdminBrokerProcessor
from pymq_broker.processor.context import BrokerContext
from pymq_broker.processor.dedup import DedupWindow
from pymq_broker.store.commit_log import MessageToStore
from pymq_broker.store.config import MessageStoreConfig
from pymq_broker.store.message_store import DefaultMessageStore
from pymq_proto.record import encode_properties, store_host_bytes
from pymq_proto.v1 import pymq_pb2

GATE_S = 5.0  # how long a gate holds when nothing opens it (the code under test blocked the loop)


class Broker:
    """The store, the managers and the admin processor of a broker, without gRPC."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.store = DefaultMessageStore(MessageStoreConfig(store_path_root_dir=root),
                                         store_host_bytes("127.0.0.1", 1))
        self.store.load()
        self.store.start()
        cfg = root / "config"
        self.topics = TopicConfigManager(cfg / "topics.json")
        self.offsets = ConsumerOffsetManager(cfg / "consumerOffset.json")
        self.groups = SubscriptionGroupManager(cfg / "subscriptionGroup.json")
        for manager in (self.topics, self.offsets, self.groups):
            manager.load()
        self.ctx = BrokerContext(BrokerConfig(), self.store, self.topics, self.offsets, self.groups)
        self.admin = AdminBrokerProcessor(self.ctx, DedupWindow(), cast(Any, None))

    def put(self, topic: str, queue_id: int, body: bytes) -> int:
        message = MessageToStore(body, 0, encode_properties({}), int(time.time() * 1000))
        return self.store.put_messages(topic, queue_id, [message]).queue_offset

    def bodies(self, topic: str, queue_id: int) -> list[bytes]:
        from test_store import records

        return [r[3] for r in records(self.store.get_message(topic, queue_id, 0, 1000).records)]


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[Broker]:
    b = Broker(tmp_path / "b")
    yield b
    b.store.shutdown()


async def answer(result: Any) -> Any:
    """As the gRPC layer calls a handler: awaited when it returns an awaitable."""
    return await result if inspect.isawaitable(result) else result


def create(name: str, queues: int = 2) -> pymq_pb2.CreateTopicRequest:
    return pymq_pb2.CreateTopicRequest(
        config=pymq_pb2.TopicConfig(topic_name=name, read_queue_nums=queues, write_queue_nums=queues, perm=6),
        update_if_exists=True,
    )


class Gate:
    """Holds the first call of a slow step (on whichever thread runs it) until :meth:`open`."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.opened = threading.Event()

    def hold(self) -> None:
        if not self.entered.is_set():
            self.entered.set()
            self.opened.wait(GATE_S)

    def open(self) -> None:
        self.opened.set()

    async def reached(self) -> None:
        while not self.entered.is_set():
            await asyncio.sleep(0.001)


def slowed(gate: Gate, fn: Callable[..., Any], events: list[str], label: str) -> Callable[..., Any]:
    def slow(*args: Any, **kwargs: Any) -> Any:
        gate.hold()
        result = fn(*args, **kwargs)
        events.append(label)
        return result
    return slow


def delete_while_another_client_is_served(
    broker: Broker, gate: Gate, events: list[str], meanwhile: Callable[[], None] = lambda: None
) -> None:
    """DeleteTopic of "gone" while another client, once the gated step has begun, finds the topic out
    of the table at once (``meanwhile`` checks more), is served a put to "other", then opens the gate."""

    async def another_client() -> None:
        await gate.reached()
        with pytest.raises(Exception, match="does not exist"):  # no request after the DeleteTopic sees it
            broker.admin.query_route(pymq_pb2.QueryRouteRequest(topic="gone"))
        meanwhile()
        broker.put("other", 0, b"served meanwhile")
        events.append("another client served")
        gate.open()

    async def main() -> None:
        await asyncio.gather(answer(broker.admin.delete_topic(pymq_pb2.DeleteTopicRequest(topic="gone"))),
                             another_client())
        events.append("answered")

    asyncio.run(main())


def test_create_topic_serves_others_while_its_write_runs_and_answers_after_it(broker: Broker) -> None:
    broker.topics.create_topic(TopicConfig("old", 1, 1), update_if_exists=False)
    gate, events = Gate(), []
    broker.topics.write = slowed(gate, broker.topics.write, events, "written")  # type: ignore[method-assign]

    async def another_client() -> None:
        await gate.reached()
        route = broker.admin.query_route(pymq_pb2.QueryRouteRequest(topic="old"))
        assert route.queues[0].read_queue_nums == 1
        events.append("another client served")
        gate.open()

    async def main() -> pymq_pb2.CreateTopicResponse:
        created, _ = await asyncio.gather(answer(broker.admin.create_topic(create("new"))), another_client())
        events.append("answered")
        return cast(pymq_pb2.CreateTopicResponse, created)

    response = asyncio.run(main())
    assert response.created
    assert events == ["another client served", "written", "answered"]
    on_disk = TopicConfigManager(broker.topics.path)
    on_disk.load()
    assert on_disk.topic_config_table["new"].topic_id == response.config.topic_id


def test_racing_creates_both_reach_the_disk_whichever_write_comes_first(broker: Broker) -> None:
    # the first create's write is held until the second one's is done: the older snapshot comes
    # last, and must not replace the newer one (which holds both topics)
    gate, events = Gate(), []
    broker.topics.write = slowed(gate, broker.topics.write, events, "a write")  # type: ignore[method-assign]

    async def second() -> Any:
        await gate.reached()
        response = await answer(broker.admin.create_topic(create("second")))
        gate.open()
        return response

    async def main() -> list[Any]:
        return list(await asyncio.gather(answer(broker.admin.create_topic(create("first"))), second()))

    first, second_response = asyncio.run(main())
    assert first.created and second_response.created
    on_disk = TopicConfigManager(broker.topics.path)
    on_disk.load()
    assert {"first", "second"} <= set(on_disk.topic_config_table)
    assert not broker.topics.dirty


def test_a_create_whose_write_fails_names_the_file_and_is_written_later(broker: Broker) -> None:
    original = broker.topics.write

    def full(snapshot: tuple[int, bytes]) -> None:
        raise OSError(errno.ENOSPC, "No space left on device", str(broker.topics.path))

    broker.topics.write = full  # type: ignore[method-assign]
    with pytest.raises(OSError) as info:
        asyncio.run(answer(broker.admin.create_topic(create("full"))))
    assert info.value.filename == str(broker.topics.path)  # the gRPC layer's "could not save <file>"
    assert broker.topics.dirty  # the controller's periodic write tries again
    broker.topics.write = original  # type: ignore[method-assign]
    broker.topics.persist_if_dirty()
    on_disk = TopicConfigManager(broker.topics.path)
    on_disk.load()
    assert "full" in on_disk.topic_config_table


def test_delete_topic_removes_its_files_off_the_loop_and_answers_after(
    broker: Broker, monkeypatch: pytest.MonkeyPatch
) -> None:
    asyncio.run(answer(broker.admin.create_topic(create("gone", 1))))
    asyncio.run(answer(broker.admin.create_topic(create("other", 1))))
    broker.put("gone", 0, b"old")
    broker.store.do_reput()
    gate, events = Gate(), []
    monkeypatch.setattr(shutil, "rmtree", slowed(gate, shutil.rmtree, events, "files removed"))
    delete_while_another_client_is_served(broker, gate, events)
    assert events[0] == "another client served" and events[-1] == "answered"
    assert "files removed" in events
    assert not any((broker.root / "consumequeue").glob("*gone*"))
    on_disk = TopicConfigManager(broker.topics.path)
    on_disk.load()
    assert "gone" not in on_disk.topic_config_table


def test_delete_topic_moves_the_checkpoint_off_the_loop_before_the_queues_go(
    broker: Broker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The checkpoint flushes every consume queue: a DeleteTopic with 2,560 queues holding unflushed
    entries held every client up to 2.7 s while it ran on the event loop (crash probe helper-104)."""
    asyncio.run(answer(broker.admin.create_topic(create("gone", 1))))
    asyncio.run(answer(broker.admin.create_topic(create("other", 1))))
    broker.put("gone", 0, b"old")
    gate, events = Gate(), []
    monkeypatch.setattr(broker.store, "checkpoint_now",
                        slowed(gate, broker.store.checkpoint_now, events, "checkpoint"))

    def queues_still_there() -> None:  # they go after the checkpoint
        assert any((broker.root / "consumequeue").glob("gone"))

    delete_while_another_client_is_served(broker, gate, events, queues_still_there)
    assert events == ["another client served", "checkpoint", "answered"]
    assert broker.store.checkpoint.logics_msg_offset >= broker.store.dispatched_offset > 0
    assert not any((broker.root / "consumequeue").glob("*gone*"))


def test_a_topic_created_again_during_a_deletion_keeps_its_own_files(
    broker: Broker, monkeypatch: pytest.MonkeyPatch
) -> None:
    asyncio.run(answer(broker.admin.create_topic(create("again", 2))))
    for i in range(3):
        broker.put("again", 0, b"old%d" % i)
    broker.store.do_reput()
    old_id = broker.topics.topic_config_table["again"].topic_id
    gate, events = Gate(), []
    monkeypatch.setattr(shutil, "rmtree", slowed(gate, shutil.rmtree, events, "old files removed"))

    async def create_again() -> None:
        await gate.reached()  # the deletion's files are being removed
        creating = asyncio.ensure_future(answer(broker.admin.create_topic(create("again", 2))))
        await asyncio.sleep(0.01)
        assert not creating.done()  # it waits for the deletion, held by the gate
        gate.open()
        response = await creating
        events.append("created again")
        assert response.created and response.config.topic_id != old_id
        assert broker.put("again", 0, b"new0") == 0

    async def delete() -> None:
        await answer(broker.admin.delete_topic(pymq_pb2.DeleteTopicRequest(topic="again")))
        events.append("deleted")

    async def main() -> None:
        await asyncio.gather(delete(), create_again())

    asyncio.run(main())
    # the create waited for the deletion: the new topic's config never reached the disk before
    # the old topic's consumer offsets were gone from it
    assert events[-2:] == ["deleted", "created again"] and set(events[:-2]) == {"old files removed"}
    broker.put("again", 0, b"new1")
    broker.store.do_reput()
    assert broker.bodies("again", 0) == [b"new0", b"new1"]
    broker.store.shutdown()
    reopened = Broker(broker.root)
    try:
        assert reopened.bodies("again", 0) == [b"new0", b"new1"]
        assert reopened.topics.topic_config_table["again"].topic_id != old_id
    finally:
        broker.store = reopened.store  # the fixture shuts it down


def test_a_deletion_cut_short_leaves_nothing_a_start_would_load(tmp_path: Path) -> None:
    b = Broker(tmp_path / "b")
    asyncio.run(answer(b.admin.create_topic(create("cut", 2))))
    b.put("cut", 1, b"x")
    b.store.do_reput()
    b.store.detach_topic("cut")  # renamed aside; the crash comes before its files are removed
    assert any((b.root / "consumequeue").glob(".deleted-cut-*"))
    b.store.shutdown()
    again = Broker(tmp_path / "b")
    try:
        # the emptied directory stays, named for the broker to finish the deletion (its configs)
        (marker,) = (again.root / "consumequeue").glob(".deleted-cut-*")
        assert not any(marker.iterdir())
        assert again.store.unfinished_deletions == {"cut": [marker]}
        assert "cut" not in again.store.consume_queue_table
        assert not any(t.startswith(".") for t in again.store.consume_queue_table)
        again.store.release_deletion_markers()
        assert not marker.exists() and again.store.unfinished_deletions == {}
    finally:
        again.store.shutdown()


def test_update_group_and_reset_offset_write_off_the_loop(broker: Broker) -> None:
    asyncio.run(answer(broker.admin.create_topic(create("t", 1))))
    broker.put("t", 0, b"m")
    broker.store.do_reput()
    for manager, label, call in (
        (broker.groups, "group", lambda: broker.admin.update_subscription_group(
            pymq_pb2.UpdateSubscriptionGroupRequest(config=pymq_pb2.SubscriptionGroupConfig(
                group_name="g", retry_queue_nums=1, retry_max_times=3, consume_enable=True))))
        ,
        (broker.offsets, "offsets", lambda: broker.admin.reset_offset(
            pymq_pb2.ResetOffsetRequest(consumer_group="g", topic="t", queue_id=0, offset=1))),
    ):
        gate, events = Gate(), []
        manager.write = slowed(gate, manager.write, events, "written")  # type: ignore[method-assign]

        async def another_client() -> None:
            await gate.reached()  # noqa: B023
            broker.put("t", 0, b"served meanwhile")
            events.append("another client served")  # noqa: B023
            gate.open()  # noqa: B023

        async def main() -> None:
            await asyncio.gather(answer(call()), another_client())  # noqa: B023
            events.append("answered")  # noqa: B023

        asyncio.run(main())
        assert events == ["another client served", "written", "answered"], label
    assert broker.offsets.query_offset("g", "t", 0) == 1


def served_while_written(gate: Gate, events: list[str], serve: Callable[[], object]) -> None:
    """Once a broker's background write is held by ``gate``, another client's request (``serve``) is
    answered; then the write goes on (an event "written" within the gate's time)."""
    assert gate.entered.wait(GATE_S)
    serve()
    events.append("another client served")
    gate.open()
    deadline = time.monotonic() + GATE_S
    while "written" not in events and time.monotonic() < deadline:
        time.sleep(0.01)


def test_the_periodic_offsets_write_runs_off_the_loop(tmp_path: Path) -> None:
    """Consumer offsets reach the disk every flush interval (a second): written on the event loop,
    80,000 of them (10,000 groups of 8 queues) held every client 134 ms each time."""
    from pymq_broker import EmbeddedBroker
    from pyspark_pymq import Admin, MessageQueue, PullConsumer

    with EmbeddedBroker(tmp_path / "b", flush_consumer_offset_interval=20) as embedded:
        offsets = embedded.controller.consumer_offset_manager
        gate, events = Gate(), []
        offsets.write = slowed(gate, offsets.write, events, "written")  # type: ignore[method-assign]
        Admin(embedded.endpoint).create_topic("t", queues=1)
        with PullConsumer(embedded.endpoint, "g") as consumer:
            consumer.commit(MessageQueue("t", "broker-a", 0), 0)  # the next flush writes it
            served_while_written(gate, events, lambda: consumer.commit(MessageQueue("t", "broker-a", 0), 1))
        assert events[:2] == ["another client served", "written"]
    on_disk = ConsumerOffsetManager(tmp_path / "b" / "config" / "consumerOffset.json")
    on_disk.load()
    assert on_disk.query_offset("g", "t", 0) == 1  # the newer commit, by a later flush or the shutdown


@pytest.mark.parametrize("service", ["schedule_message_service", "timer_message_store"])
def test_delayed_deliveries_write_their_progress_off_the_loop(tmp_path: Path, service: str) -> None:
    """A delay level's or a timer's progress is written (and fsynced) after every round that
    delivered something: on the event loop, each round held every client of the broker for it."""
    from pymq_broker import EmbeddedBroker
    from pyspark_pymq import Admin, Message, Producer

    with EmbeddedBroker(tmp_path / "b", message_delay_level="100ms 1s") as embedded:
        progress = getattr(embedded.controller, service)
        gate, events = Gate(), []
        progress.write = slowed(gate, progress.write, events, "written")
        Admin(embedded.endpoint).create_topic("t", queues=1)
        with Producer(embedded.endpoint) as producer:
            if service == "timer_message_store":
                producer.send(Message("t", b"later", deliver_time_ms=int(time.time() * 1000) + 100))
            else:
                producer.send(Message("t", b"later", delay_level=1))
            # delivered; its progress being written
            served_while_written(gate, events, lambda: producer.send(Message("t", b"served meanwhile")))
        assert events[:2] == ["another client served", "written"]
    restarted = EmbeddedBroker(tmp_path / "b", message_delay_level="100ms 1s").start()
    try:  # delivered once: the progress on disk covers it
        from test_timer_messages import _bodies

        time.sleep(0.5)
        assert sorted(_bodies(restarted.endpoint, "t")) == [b"later", b"served meanwhile"]
    finally:
        restarted.stop()


def test_a_recall_writes_its_cancellation_off_the_loop_before_it_is_answered(tmp_path: Path) -> None:
    """A recall is answered once its cancellation is on disk (the commit log flushed, then the timer
    checkpoint fsynced): on the event loop, that write held every client of the broker."""
    from concurrent.futures import ThreadPoolExecutor

    from pymq_broker import EmbeddedBroker
    from pymq_proto.rocketmq_v2 import definition_pb2 as v2
    from pyspark_pymq import Admin, Message, Producer
    from test_timer_messages import _bodies, _now_ms, _recall, _send_at, _stub

    with EmbeddedBroker(tmp_path / "b", flush_disk_type="SYNC_FLUSH") as embedded:
        timers = embedded.controller.timer_message_store
        Admin(embedded.endpoint).create_topic("t", 1, message_type="DELAY")
        stub = _stub(embedded.endpoint)
        deliver_ms = _now_ms() + 2_000
        sent = _send_at(stub, "t", b"recalled", deliver_ms)
        gate, events = Gate(), []
        timers.write = slowed(gate, timers.write, events, "written")
        commit_log = embedded.controller.store.commit_log
        flush = commit_log.flush
        commit_log.flush = lambda: (events.append("flushed"), flush())[1]  # type: ignore[method-assign]
        with ThreadPoolExecutor(1) as pool, Producer(embedded.endpoint) as producer:
            recall = pool.submit(_recall, stub, "t", sent.recall_handle)
            served_while_written(gate, events, lambda: producer.send(Message("t", b"served meanwhile")))
            answer = recall.result(GATE_S)
            events.append("answered")
        assert answer.status.code == v2.OK, answer.status.message
        assert [e for e in events if e != "flushed"] == ["another client served", "written", "answered"]
        assert "flushed" in events[:events.index("written")]  # the commit log before the checkpoint
        while _now_ms() < deliver_ms + 500:
            time.sleep(0.05)
        assert _bodies(embedded.endpoint, "t") == [b"served meanwhile"]


def _answered_in_background(events: list[str], label: str, fn: Callable[[], object]) -> threading.Thread:
    def run() -> None:
        fn()
        events.append(label)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def test_a_send_that_auto_creates_its_topic_writes_it_off_the_loop_before_storing(tmp_path: Path) -> None:
    """autoCreateTopicEnable: the first send to a topic wrote topics.json (every topic, fsync) on the
    event loop, 50-85 ms of every client's time at 3,000 topics. Written on a thread now, the send
    answered after it; a second send to the topic while it is written waits for the same write."""
    from pymq_broker import EmbeddedBroker
    from pyspark_pymq import Admin, Message, Producer, PullConsumer

    with EmbeddedBroker(tmp_path / "b", auto_create_topic_enable=True) as embedded:
        ep = embedded.endpoint
        Admin(ep).create_topic("t", queues=1)
        topics = embedded.controller.topic_config_manager
        gate, events = Gate(), []
        topics.write = slowed(gate, topics.write, events, "written")  # type: ignore[method-assign]
        with Producer(ep) as first, Producer(ep) as second, Producer(ep) as other:
            sends = [_answered_in_background(events, "first answered",
                                             lambda: first.send(Message("auto", b"first")))]

            def serve() -> None:
                sends.append(_answered_in_background(events, "second answered",
                                                     lambda: second.send(Message("auto", b"second"))))
                other.send(Message("t", b"served meanwhile"))
                time.sleep(0.2)  # the second send has come in, and waits for the write

            served_while_written(gate, events, serve)
            for thread in sends:
                thread.join(GATE_S)
        assert events[:2] == ["another client served", "written"]
        assert sorted(events[2:]) == ["first answered", "second answered"]
        with PullConsumer(ep, "g") as consumer:
            bodies = [m.body for mq in consumer.queues("auto") for m in consumer.pull(mq, 0, 8).messages]
        assert sorted(bodies) == [b"first", b"second"]
    on_disk = TopicConfigManager(tmp_path / "b" / "config" / "topics.json")
    on_disk.load()
    assert "auto" in on_disk.topic_config_table


def test_a_first_dead_letter_writes_the_dlq_topic_off_the_loop(tmp_path: Path) -> None:
    """A group's first dead letter made its %DLQ% topic and wrote topics.json on the event loop."""
    from pymq_broker import EmbeddedBroker
    from pyspark_pymq import Admin, Message, Producer, PullConsumer

    with EmbeddedBroker(tmp_path / "b") as embedded:
        ep = embedded.endpoint
        Admin(ep).create_topic("t", queues=1)
        with Producer(ep) as producer, PullConsumer(ep, "g") as consumer:
            producer.send(Message("t", b"hopeless"))
            m = consumer.pull(consumer.queues("t")[0], 0).messages[0]
            topics = embedded.controller.topic_config_manager
            gate, events = Gate(), []
            topics.write = slowed(gate, topics.write, events, "written")  # type: ignore[method-assign]
            dead = _answered_in_background(events, "answered", lambda: consumer.send_back(m, delay_level=-1))
            served_while_written(gate, events, lambda: producer.send(Message("t", b"served meanwhile")))
            dead.join(GATE_S)
        assert events == ["another client served", "written", "answered"]
        assert [d.body for d in Admin(ep).dead_letter_messages("g")] == [b"hopeless"]


@pytest.mark.parametrize("change", ["create_user", "update_user", "delete_user", "create_acl", "delete_acl"])
def test_user_and_acl_changes_write_off_the_loop(tmp_path: Path, change: str) -> None:
    """CreateUser ... DeleteAcl wrote users.json / acls.json (write, two fsyncs) on the event loop;
    written on a thread now, answered after."""
    from pymq_broker import EmbeddedBroker
    from pyspark_pymq import Admin, Message, Producer

    with EmbeddedBroker(tmp_path / "b") as embedded:
        ep = embedded.endpoint
        admin = Admin(ep)
        admin.create_topic("t", queues=1)
        admin.create_user("alice", "pw")
        admin.create_acl("User:alice", ["Topic:t"], ["Pub"])
        calls: dict[str, Callable[[], object]] = {
            "create_user": lambda: admin.create_user("bob", "pw"),
            "update_user": lambda: admin.update_user("alice", password="new"),
            "delete_user": lambda: admin.delete_user("alice"),
            "create_acl": lambda: admin.create_acl("User:alice", ["Topic:u"], ["Sub"]),
            "delete_acl": lambda: admin.delete_acl("User:alice"),
        }
        controller = embedded.controller
        manager = controller.acls if change.endswith("_acl") else controller.users
        gate, events = Gate(), []
        manager.write = slowed(gate, manager.write, events, "written")  # type: ignore[method-assign]
        with Producer(ep) as producer:
            changing = _answered_in_background(events, "answered", calls[change])
            served_while_written(gate, events, lambda: producer.send(Message("t", b"served meanwhile")))
            changing.join(GATE_S)
        assert events[:2] == ["another client served", "written"] and events[-1] == "answered"
        users, acls = set(admin.list_users()["username"]), admin.list_acls()
    assert ("bob" in users) == (change == "create_user")
    assert ("alice" in users) == (change != "delete_user")
    assert ("User:alice" in set(acls["subject"])) == (change not in ("delete_user", "delete_acl"))


def test_retention_deletes_expired_files_off_the_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Retention deleted expired commit-log segments (and the queue segments pointing at them) on the
    event loop: 70-80 ms each for a written 256 MiB segment, 330-360 ms for 1 GiB. Taken out of the
    store on the loop now, deleted on a thread: a pull meanwhile is told its offset moved, and reads
    the right messages from the new first one."""
    from pymq_broker import EmbeddedBroker
    from pymq_broker.store.mapped_file import MappedFile
    from pyspark_pymq import Admin, Message, MessageQueue, Producer, PullConsumer
    from pyspark_pymq.client.message import PullStatus

    gate, events = Gate(), []
    monkeypatch.setattr(MappedFile, "destroy", slowed(gate, MappedFile.destroy, events, "written"))
    with EmbeddedBroker(tmp_path / "b", max_message_size=16 * 1024, mapped_file_size_commit_log=64 * 1024,
                        file_reserved_time=1 / 3600, clean_resource_interval=100) as embedded:
        ep = embedded.endpoint
        Admin(ep).create_topic("t", queues=1)
        with Producer(ep) as producer:
            for i in range(200):  # ~4 commit-log segments
                producer.send(Message("t", b"%04d" % i + bytes(1000)))
        mq = MessageQueue("t", "broker-a", 0)
        with PullConsumer(ep, "g") as consumer:
            def serve() -> None:  # a segment is out of the store, its deletion held
                moved = consumer.pull(mq, 0, 8)
                assert moved.status == PullStatus.OFFSET_ILLEGAL and moved.next_begin_offset > 0
                first = consumer.pull(mq, moved.next_begin_offset, 8)
                assert [m.body[:4] for m in first.messages] == [
                    b"%04d" % (moved.next_begin_offset + i) for i in range(len(first.messages))]
                assert first.messages

            served_while_written(gate, events, serve)
        assert events[:2] == ["another client served", "written"]
        kept = [mf.file_name.name for mf in embedded.controller.store.commit_log.mapped_file_queue.files]
    assert sorted(p.name for p in (tmp_path / "b" / "commitlog").iterdir()) == kept

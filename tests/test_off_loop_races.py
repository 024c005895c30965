"""Races of the writes taken off the event loop: what a request finds changed when its write on a thread ends
(a topic deleted, a client gone, files of a name made again)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from pathlib import Path
from typing import Any, cast

import pytest
from pymq_broker.auth.auth_admin_processor import AuthAdminProcessor
from pymq_broker.auth.authentication import DefaultAuthenticationProvider
from pymq_broker.auth.metadata_provider import AuthenticationMetadataProvider, AuthorizationMetadataProvider
from pymq_broker.broker_config import BrokerConfig
from pymq_broker.manager.consumer_offset_manager import ConsumerOffsetManager
from pymq_broker.manager.subscription_group_manager import SubscriptionGroupManager
from pymq_broker.manager.topic_config_manager import TopicConfig, TopicConfigManager
from pymq_broker.processor.admin_broker_processor import AdminBrokerProcessor
from pymq_broker.processor.context import BrokerContext
from pymq_broker.processor.dedup import DedupWindow
from pymq_broker.processor.send_back_processor import SendBackProcessor
from pymq_broker.processor.send_message_processor import SendMessageProcessor
from pymq_broker.store.commit_log import MessageToStore
from pymq_broker.store.config import MessageStoreConfig
from pymq_broker.store.mapped_file import MappedFile
from pymq_broker.store.message_store import DefaultMessageStore
from pymq_proto.record import encode_properties, store_host_bytes
from pymq_proto.v1 import pymq_pb2
from test_admin_off_loop import Broker, Gate, answer, create, slowed


def _send(topic: str) -> pymq_pb2.SendMessageRequest:
    return pymq_pb2.SendMessageRequest(
        producer_group="p", topic=topic, queue_id=0, born_timestamp=int(time.time() * 1000),
        messages=[pymq_pb2.MessageData(body=b"acked", properties=encode_properties({}))])


def _on_disk(root: Path) -> set[str]:
    topics = TopicConfigManager(root / "config" / "topics.json")
    topics.load()
    return set(topics.topic_config_table)


def _deleted_while_written(b: Broker, topic: str, sending: Any) -> Any:
    """``sending`` (a coroutine that makes ``topic`` and waits for its write) while a DeleteTopic of
    ``topic`` runs whole during that write."""
    gate, events = Gate(), []
    b.topics.write = slowed(gate, b.topics.write, events, "written")  # type: ignore[method-assign]

    async def main() -> Any:
        task = asyncio.ensure_future(sending)
        await gate.reached()  # the sender's topics.json write has begun, held
        await answer(b.admin.delete_topic(pymq_pb2.DeleteTopicRequest(topic=topic)))
        gate.open()
        return await task

    return asyncio.run(main())


def test_a_send_whose_auto_created_topic_is_deleted_while_written_stores_in_a_listed_topic(
    tmp_path: Path,
) -> None:
    """The send awaited topics.json between its topic check and its put: a DeleteTopic meanwhile left
    it storing (SEND_OK) in a topic gone from the table and from topics.json."""
    b = Broker(tmp_path / "b")
    try:
        b.topics.auto_create_topic_enable = True
        send = SendMessageProcessor(b.ctx, None)  # type: ignore[arg-type]
        resp = _deleted_while_written(b, "auto", send.send_message(_send("auto")))
        assert resp.status == pymq_pb2.SEND_OK
        assert "auto" in b.topics.topic_config_table  # made again, after the deletion
        assert b.bodies("auto", 0) == [b"acked"]
    finally:
        b.store.shutdown()
    assert "auto" in _on_disk(tmp_path / "b")


def test_sends_to_a_topic_on_disk_do_not_wait_for_an_update_s_write_nor_fail_with_it(tmp_path: Path) -> None:
    """An admin update of a topic marked it not on disk until its write: with that write failing (a
    config directory gone read-only), every send to the topic, written long before, failed with it."""
    b = Broker(tmp_path / "b")
    try:
        asyncio.run(answer(b.admin.create_topic(create("kept", 1))))

        def broken(snapshot: Any) -> None:
            raise OSError(5, "Input/output error")

        b.topics.write = broken  # type: ignore[method-assign]

        async def main() -> Any:
            update = b.admin.create_topic(create("kept", 2))  # one queue more
            with pytest.raises(OSError):
                await answer(update)
            return await SendMessageProcessor(b.ctx, None).send_message(_send("kept"))  # type: ignore[arg-type]

        assert asyncio.run(main()).status == pymq_pb2.SEND_OK
        assert b.bodies("kept", 0) == [b"acked"]
    finally:
        b.store.shutdown()


def test_a_dead_letter_whose_dlq_is_deleted_while_written_stores_in_a_listed_topic(tmp_path: Path) -> None:
    b = Broker(tmp_path / "b")
    try:
        b.topics.create_topic(TopicConfig("t", 1, 1), update_if_exists=False)
        hopeless = MessageToStore(b"hopeless", 0, encode_properties({}), 1)
        phy = b.store.put_messages("t", 0, [hopeless]).physical_offsets[0]
        req = pymq_pb2.ConsumerSendMsgBackBatchRequest(group="g", commit_log_offsets=[phy], delay_levels=[-1])
        resp = _deleted_while_written(b, "%DLQ%g", SendBackProcessor(b.ctx).consumer_send_msg_back_batch(req))
        assert list(resp.dead_letters) == [True] and not resp.errors[0]
        assert "%DLQ%g" in b.topics.topic_config_table
    finally:
        b.store.shutdown()
    assert "%DLQ%g" in _on_disk(tmp_path / "b")


def _auth(
    tmp_path: Path,
) -> tuple[AuthenticationMetadataProvider, AuthorizationMetadataProvider, AuthAdminProcessor]:
    users = AuthenticationMetadataProvider(tmp_path / "users.json")
    acls = AuthorizationMetadataProvider(tmp_path / "acls.json")
    users.load()
    acls.load()
    return users, acls, AuthAdminProcessor(users, acls, DefaultAuthenticationProvider(users, 900_000))


def _user_with_acl(processor: AuthAdminProcessor) -> None:
    async def setup() -> None:
        await processor.create_user(pymq_pb2.CreateUserRequest(
            user=pymq_pb2.UserInfo(username="eve", password="pw", user_type="Super")))
        await processor.create_acl(pymq_pb2.CreateAclRequest(acl=pymq_pb2.AclInfo(
            subject="User:eve", entries=[pymq_pb2.PolicyEntry(resource="Topic:t", actions=["Pub"])])))
    asyncio.run(setup())


def test_a_delete_user_whose_client_gives_up_during_the_acl_write_still_deletes_the_user(
    tmp_path: Path,
) -> None:
    """gRPC cancels a handler whose client gives up (a deadline; a shutdown's grace): the DeleteUser
    cancelled while its ACL was written never wrote users.json (not even marked dirty, and no periodic
    write of it), and the user was gone from the table: "does not exist" asked again, back at restart."""
    _users, acls, processor = _auth(tmp_path)
    _user_with_acl(processor)
    gate, events = Gate(), []
    acls.write = slowed(gate, acls.write, events, "acl written")  # type: ignore[method-assign]

    async def main() -> None:
        deleting = asyncio.ensure_future(processor.delete_user(pymq_pb2.DeleteUserRequest(username="eve")))
        await gate.reached()
        deleting.cancel()
        await asyncio.sleep(0.05)
        gate.open()
        for _ in range(200):
            if not processor._changing.locked():
                break
            await asyncio.sleep(0.01)

    asyncio.run(main())
    on_disk_users, on_disk_acls, _ = _auth(tmp_path)
    assert "eve" not in on_disk_users.users and "User:eve" not in on_disk_acls.acls


def test_a_delete_user_whose_acl_write_fails_can_be_asked_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _users, acls, processor = _auth(tmp_path)
    _user_with_acl(processor)
    write = acls.write

    def full(snapshot: tuple[int, bytes]) -> None:
        raise OSError(28, "No space left on device", str(acls.path))

    monkeypatch.setattr(acls, "write", full)
    with pytest.raises(OSError):
        asyncio.run(processor.delete_user(pymq_pb2.DeleteUserRequest(username="eve")))
    monkeypatch.setattr(acls, "write", write)
    asyncio.run(processor.delete_user(pymq_pb2.DeleteUserRequest(username="eve")))  # not "does not exist"
    on_disk_users, on_disk_acls, _ = _auth(tmp_path)
    assert "eve" not in on_disk_users.users and "User:eve" not in on_disk_acls.acls


def test_a_retention_removal_leaves_the_queue_files_of_a_topic_deleted_and_made_again_meanwhile(
    tmp_path: Path,
) -> None:
    """ExpiredFiles.remove runs on a thread (commit-log segments first: 70-360 ms each) and unlinked
    the consume-queue files it took by path: a DeleteTopic and the topic made again meanwhile (a DLQ
    purged, then the next dead letter) has a queue file of the same path, which went."""
    root = tmp_path / "b"
    store = DefaultMessageStore(MessageStoreConfig(store_path_root_dir=root, max_message_size=1024,
                                                   mapped_file_size_commit_log=4096,
                                                   mapped_file_size_consume_queue=200),
                                store_host_bytes("127.0.0.1", 1))
    store.load()
    store.start()
    cfg = root / "config"
    topics = TopicConfigManager(cfg / "topics.json")
    offsets = ConsumerOffsetManager(cfg / "consumerOffset.json")
    groups = SubscriptionGroupManager(cfg / "subscriptionGroup.json")
    ctx = BrokerContext(BrokerConfig(), store, topics, offsets, groups)
    admin = AdminBrokerProcessor(ctx, DedupWindow(), cast(Any, None))
    topics.create_topic(TopicConfig("T", 1, 1), update_if_exists=False)

    def put(body: bytes) -> None:
        assert store.put_messages("T", 0, [MessageToStore(body, 0, encode_properties({}),
                                                          int(time.time() * 1000))]).ok

    for i in range(60):
        put(b"%03d" % i + bytes(200))
    store.do_reput()
    cq_file = root / "consumequeue" / "T" / "0" / ("0" * 20)
    assert cq_file.exists()

    async def main() -> None:
        expired = store.take_expired_files(now=time.time() + 10 * 3600 * 72)  # on the loop
        taken = {f.file_name for f in expired.others if isinstance(f, MappedFile)}
        assert expired.segments and cq_file in taken
        # (its removal is on a thread, unlinking 256 MiB-1 GiB segments first: slow) meanwhile
        # the topic is deleted (a DLQ purge, say) and made again, and a message stored in it
        await answer(admin.delete_topic(pymq_pb2.DeleteTopicRequest(topic="T")))
        topics.create_topic(TopicConfig("T", 1, 1), update_if_exists=False)
        put(b"new topic's message")
        store.do_reput()
        assert cq_file.exists()
        await asyncio.to_thread(expired.remove)
        assert cq_file.exists()

    try:
        asyncio.run(main())
    finally:
        store.shutdown()


def test_a_shutdown_waits_for_a_user_change_still_writing_before_it_lets_the_data_dir_go(
    tmp_path: Path,
) -> None:
    """A CreateUser runs to its end in a task of its own (AuthAdminProcessor._one_at_a_time), its
    users.json written on a thread: the shutdown wrote every other manager, released the data dir's
    lock (another broker may take the dir) and returned while that write still ran."""
    from pymq_broker.controller import BrokerController

    controller = BrokerController(BrokerConfig(), MessageStoreConfig(store_path_root_dir=tmp_path / "b"))
    gate, events = Gate(), []

    async def main() -> None:
        await controller.start()
        assert controller.auth_admin is not None
        controller.users.write = slowed(  # type: ignore[method-assign]
            gate, controller.users.write, events, "users.json written")
        release = controller.store_lock.release

        def released() -> None:
            events.append("data dir let go")
            release()

        controller.store_lock.release = released  # type: ignore[method-assign]
        creating = asyncio.ensure_future(controller.auth_admin.create_user(pymq_pb2.CreateUserRequest(
            user=pymq_pb2.UserInfo(username="eve", password="pw", user_type="Super"))))
        await gate.reached()
        stopping = asyncio.ensure_future(controller.shutdown(0))
        try:
            await asyncio.sleep(0.3)  # the shutdown, unless it waits, is done by now
        finally:
            gate.open()
        await stopping
        await creating

    asyncio.run(main())
    assert events == ["users.json written", "data dir let go"]
    users = AuthenticationMetadataProvider(tmp_path / "b" / "config" / "users.json")
    users.load()
    assert "eve" in users.users


def test_a_shutdown_waits_for_a_delete_topic_still_writing_before_it_lets_the_data_dir_go(
    tmp_path: Path,
) -> None:
    """A DeleteTopic runs to its end in a task of its own (its client gone with the server's grace):
    the shutdown shut the store and released the data dir's lock while it still had its topics.json
    write (and the marker's removal) to do, done after, in a dir another broker may have taken."""
    import threading

    from pymq_broker.controller import BrokerController
    from pyspark_pymq import Admin

    root = tmp_path / "b"
    controller = BrokerController(BrokerConfig(), MessageStoreConfig(store_path_root_dir=root))
    gate, events = Gate(), []

    async def main() -> None:
        endpoint = await controller.start()
        admin = Admin(endpoint)
        await asyncio.to_thread(admin.create_topic, "gone", 1)
        offsets, topics = controller.consumer_offset_manager, controller.topic_config_manager
        offsets.write = slowed(gate, offsets.write, events, "offsets written")  # type: ignore[method-assign]
        write_topics = topics.write

        def recording(snapshot: tuple[int, bytes]) -> None:
            write_topics(snapshot)
            events.append("topics.json with 'gone'" if b'"gone"' in snapshot[1] else "topics.json without it")

        topics.write = recording  # type: ignore[method-assign]
        release = controller.store_lock.release

        def released() -> None:
            events.append("data dir let go")
            release()

        controller.store_lock.release = released  # type: ignore[method-assign]
        deleting = asyncio.ensure_future(asyncio.to_thread(admin.delete_topic, "gone"))
        await gate.reached()  # the deletion's consumerOffset.json write has begun, held
        # opened from a thread: the shutdown's own offsets write waits for the held one, on the loop
        threading.Timer(0.3, gate.open).start()
        await controller.shutdown(0)
        with contextlib.suppress(Exception):  # its client may be told CANCELLED: the server stopped
            await deleting
        admin.close()
        await asyncio.sleep(0.3)  # what was left of the deletion runs now, unless waited for

    asyncio.run(main())
    assert "topics.json without it" in events
    assert events.index("topics.json without it") < events.index("data dir let go"), events
    assert events[-1] == "data dir let go", events
    assert "gone" not in _on_disk(root)



def test_a_users_write_that_reached_the_disk_does_not_fail_on_a_concurrent_write_s_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """users.json's files were made owner-only after the base write, outside its lock: another
    thread's write renamed its temporary file between exists() and chmod, and a write that was on
    disk raised FileNotFoundError (its change then reported failed, the document marked dirty)."""
    import os

    users = AuthenticationMetadataProvider(tmp_path / "users.json")
    users.write((2, b'{"users": []}'))
    tmp = tmp_path / "users.json.tmp"
    tmp.write_bytes(b'{"users": []}')  # another thread's write, under way
    chmod = os.chmod

    def other_write_renames_meanwhile(path: Any, mode: int) -> None:
        # the other write renames its temporary file now, if it can take the write lock
        if str(path).endswith(".tmp") and users._persist_lock.acquire(blocking=False):
            try:
                os.replace(path, tmp_path / "users.json")
            finally:
                users._persist_lock.release()
        chmod(path, mode)

    monkeypatch.setattr(os, "chmod", other_write_renames_meanwhile)
    users.write((1, b'{"users": []}'))  # older than the one on disk: written already, the modes set

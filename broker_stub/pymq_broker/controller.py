"""BrokerController: builds the store, managers, processors and the gRPC server, and runs them."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import ipaddress
import logging
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import grpc
from pymq_proto.record import store_host_bytes
from pymq_proto.rocketmq_v2 import service_pb2_grpc
from pymq_proto.v1 import pymq_pb2_grpc

from .auth.auth_admin_processor import AuthAdminProcessor
from .auth.auth_service import AuthService
from .auth.authentication import DefaultAuthenticationProvider
from .auth.authorization import DefaultAuthorizationProvider
from .auth.metadata_provider import AuthenticationMetadataProvider, AuthorizationMetadataProvider
from .auth.model import User, UserType
from .auth.stored_records import StoredRecords
from .broker_config import BrokerConfig
from .common.config_manager import ConfigManager
from .manager.consumer_offset_manager import ConsumerOffsetManager
from .manager.subscription_group_manager import SubscriptionGroupManager
from .manager.topic_config_manager import TopicConfigManager
from .processor.admin_broker_processor import AdminBrokerProcessor
from .processor.consumer_manage_processor import ConsumerManageProcessor
from .processor.context import BrokerContext
from .processor.end_transaction_processor import EndTransactionProcessor, ProducerManager
from .processor.pull_message_processor import PullMessageProcessor
from .processor.pull_request_hold_service import PullRequestHoldService
from .processor.send_back_processor import SendBackProcessor
from .processor.send_message_processor import SendMessageProcessor
from .proxy.grpc_messaging_service import GrpcMessagingService
from .proxy.messaging_processor import MessagingProcessor
from .proxy.pull_offset_processor import PullOffsetProcessor
from .remoting.grpc_service import BrokerGrpcService
from .remoting.pull_answer_budget import PullAnswerBudget
from .store.config import MessageStoreConfig
from .store.message_store import DefaultMessageStore
from .store.results import PutMessageError
from .store.schedule_message_service import ScheduleMessageService
from .store.store_lock import StoreLock
from .store.timer_message_store import TimerMessageStore
from .transaction.transactional_message_service import (
    TransactionalMessageService,
    TransactionConfig,
)

log = logging.getLogger(__name__)

RECEIVE_HEADROOM = 16 * 1024 * 1024
"""Bytes a request may carry beyond maxMessageSize: record headers and properties of a full
batch, a send-back batch's failure reasons. gRPC reads a whole request into memory before any
check of ours runs: with its old 256 MiB limit, six refused 200 MiB sends held 3-4 GB."""


MAX_PENDING_REQUESTS = 65_536
"""RPCs gRPC's core may hold before the asyncio server takes them. Its default (1,000, hard
limit 3,000) cancelled 3-9% of a burst of 2,000 long-polling pulls with a bare CANCELLED and
nothing logged: the server takes new calls one by one from the event loop, so a burst queues
in the core. RocketMQ holds every long poll; so does pymq now."""


def grpc_options(max_message_size: int) -> list[tuple[str, int]]:
    """The server's options: requests bounded by ``max_message_size`` + :data:`RECEIVE_HEADROOM`."""
    return [
        ("grpc.max_receive_message_length", max_message_size + RECEIVE_HEADROOM),
        ("grpc.max_send_message_length", 256 * 1024 * 1024),  # pull answers: maxTransferBytes... caps them
        ("grpc.server.max_pending_requests", MAX_PENDING_REQUESTS),
        ("grpc.server.max_pending_requests_hard_limit", 2 * MAX_PENDING_REQUESTS),
        ("grpc.so_reuseport", 0),
        # pymq's clients ping every 20 s, also between calls, to find dead connections
        # (pyspark_pymq.client.transport.KEEPALIVE_TIME_MS): gRPC's server would take that for abuse
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.min_ping_interval_without_data_ms", 5_000),
    ]


GRPC_OPTIONS = grpc_options(4 * 1024 * 1024)  # RocketMQ's default maxMessageSize


class BrokerController:
    """One broker. ``await start()`` binds and serves; ``await shutdown()`` stops cleanly.

    All store writes happen on the event loop that runs the controller; the
    flush services use threads only to fsync.
    """

    def __init__(self, broker_config: BrokerConfig, store_config: MessageStoreConfig) -> None:
        self.broker_config = broker_config
        self.store_config = store_config
        root = store_config.store_path_root_dir
        cfg_dir = root / "config"
        self.store: DefaultMessageStore | None = None
        self.topic_config_manager = TopicConfigManager(
            cfg_dir / "topics.json",
            auto_create_topic_enable=broker_config.auto_create_topic_enable,
            default_topic_queue_nums=broker_config.default_topic_queue_nums,
            max_delay_level=store_config.max_delay_level,
        )
        self.consumer_offset_manager = ConsumerOffsetManager(cfg_dir / "consumerOffset.json")
        self.subscription_group_manager = SubscriptionGroupManager(cfg_dir / "subscriptionGroup.json")
        self.users = AuthenticationMetadataProvider(cfg_dir / "users.json")
        self.acls = AuthorizationMetadataProvider(cfg_dir / "acls.json")
        self.schedule_path = cfg_dir / "delayOffset.json"
        self.timer_path = cfg_dir / "timerCheckpoint.json"
        self.store_lock = StoreLock(root)
        self.server: grpc.aio.Server | None = None
        self._bound: grpc.aio.Server | None = None  # listening, maybe not serving yet
        self.endpoint = ""
        self._tasks: list[asyncio.Task[None]] = []
        self.schedule_message_service: ScheduleMessageService | None = None
        self.timer_message_store: TimerMessageStore | None = None
        self.messaging: MessagingProcessor | None = None  # apache.rocketmq.v2, once served
        self.auth_admin: AuthAdminProcessor | None = None  # the user/ACL RPCs, once served
        self._deleting_topics: dict[str, asyncio.Task[None]] = {}  # BrokerContext's, once served

    async def start(self) -> str:
        """Load and recover the store, then serve; returns the bound ``host:port``.

        Refused (:class:`~.store.store_lock.DataDirInUseError`) while another broker holds the data
        dir. A start that fails releases what it took (the data dir's lock, the port), so another
        broker may be started on the dir in this process.
        """
        # before anything reads or writes the dir: a refused broker must change nothing of it
        self.store_lock.acquire()
        try:
            return await self._start()
        except BaseException:
            await self._abandon_start()
            raise

    def _finish_deletions(self, store: DefaultMessageStore) -> None:
        """Finish the DeleteTopics a crash cut short (their queue files gone, their marker left,
        their consumer offsets or config maybe still on disk: AdminBrokerProcessor.delete_topic).
        A topic with queues again (the broker makes a %RETRY% topic anew when a message of its
        group fails) is a new one, and kept."""
        unfinished = store.unfinished_deletions
        if not unfinished:
            return
        tcm, offsets = self.topic_config_manager, self.consumer_offset_manager
        for topic in sorted(unfinished):
            # (the recovery's walk of the log makes an empty queue for every topic it passes)
            if any(cq.max_offset_in_queue > 0 for cq in store.consume_queue_table.get(topic, {}).values()):
                log.warning("topic %s: a deletion a crash cut short, and queues made since: kept", topic)
                continue
            log.info("topic %s: finishing its deletion, which a crash cut short", topic)
            offsets.remove_topic(topic)
            tcm.topic_config_table.pop(topic, None)
        offsets.persist()  # offsets first, as the deletion writes them
        tcm.persist()
        store.release_deletion_markers()

    async def _start(self) -> str:
        bc = self.broker_config
        self.topic_config_manager.load()
        self.consumer_offset_manager.load()
        self.subscription_group_manager.load()
        self.users.load()
        self.acls.load()
        auth = self._auth()  # before the store opens: a refused setting leaves nothing running
        self.auth_admin = auth["auth_admin"]
        self.auth_service: AuthService | None = auth["auth"]  # for every gRPC service this broker serves
        self._warn_if_open()
        server = grpc.aio.server(options=grpc_options(self.store_config.max_message_size))
        port = bind(server, bc)
        self._bound = server
        self.endpoint = host_port(bc.host, port)
        store = DefaultMessageStore(self.store_config, store_host_bytes(bc.host, port))
        try:
            store.load()
            self._finish_deletions(store)
        except BaseException:
            store.close()
            raise
        hold = PullRequestHoldService()
        store.message_arriving_listener = hold.notify_message_arriving
        store.start()
        self.store = store
        ctx = BrokerContext(
            bc, store, self.topic_config_manager, self.consumer_offset_manager,
            self.subscription_group_manager, self.endpoint,
        )
        self._deleting_topics = ctx.deleting_topics
        self.transactions = TransactionalMessageService(
            store, self.topic_config_manager, self.store_config.store_path_root_dir / "config" /
            "transactionCheck.json",
            TransactionConfig(bc.transaction_timeout, bc.transaction_check_interval,
                              bc.transaction_check_max),
        )
        self.transactions.load()
        self.producers = ProducerManager()
        send = SendMessageProcessor(ctx, self.transactions)
        windows = [(c.topic_name, c.dedup_window_ms)
                   for c in self.topic_config_manager.topic_config_table.values() if c.dedup_window_ms > 0]
        send.dedup.recover(store, windows)
        service = BrokerGrpcService(
            pull_budget=PullAnswerBudget(bc.max_pull_bytes_in_flight_per_client),
            send=send,
            pull=PullMessageProcessor(ctx, hold),
            send_back=SendBackProcessor(ctx),
            consumer_manage=ConsumerManageProcessor(ctx),
            admin=AdminBrokerProcessor(ctx, send.dedup, self.transactions),
            end_transaction=EndTransactionProcessor(ctx, self.transactions, self.producers),
            **auth,
        )
        pymq_pb2_grpc.add_BrokerServicer_to_server(service, server)
        self.timer_message_store = TimerMessageStore(store, self.timer_path)
        self.timer_message_store.load()
        self._serve_rocketmq_v2(server, ctx, send, hold)
        self.schedule_message_service = ScheduleMessageService(store, self.schedule_path)
        self.schedule_message_service.load()
        await server.start()
        self.server = server
        self._bound = None
        self._tasks = [
            asyncio.create_task(self._schedule_loop()),
            asyncio.create_task(
                self._every(min(1.0, bc.transaction_timeout / 2000), self._check_transactions)
            ),
            asyncio.create_task(self._persist_every(
                bc.flush_consumer_offset_interval / 1000, self.consumer_offset_manager,
                self.subscription_group_manager, self.topic_config_manager, self.transactions)),
            asyncio.create_task(self._every(self.store_config.clean_resource_interval / 1000,
                                            partial(self._clean_expired_files, store))),
        ]
        if self.messaging is not None and self.messaging.pop.attempts.enabled:
            # v2 delivery attempts within a second of a change: a kill -9 forgets at most that second
            attempts = self.messaging.pop.attempts
            self._tasks.append(asyncio.create_task(
                self._persist_every(attempts.persist_interval_s, attempts)))
        log.info("broker %s serving on %s", bc.broker_name, self.endpoint)
        return self.endpoint

    async def _abandon_start(self) -> None:
        """Undo a start that failed halfway: stop the store, free the port, release the data dir."""
        name = self.broker_config.broker_name
        try:
            if self.server is not None:
                await self.server.stop(None)
                self.server = None
            # the store first: the services may be registered, and the port is freed below by
            # starting the server a moment; a request let in then must find no store to write to
            if self.store is not None:
                self.store.shutdown()
                self.store = None
        except Exception:
            log.exception("cleaning up after a failed start of broker %s", name)
        try:
            server, self._bound = self._bound, None
            if server is not None:
                # a port grpc bound is freed only by stopping a started server (stop alone keeps it)
                await server.start()
                await server.stop(None)
        except Exception:
            log.exception("freeing the port after a failed start of broker %s", name)
        finally:
            self.store_lock.release()

    def _warn_if_open(self) -> None:
        """Warn of a broker that serves everyone: README's rule is that an open broker stays on loopback."""
        bc = self.broker_config
        if bc.authentication_enabled:
            return
        if not is_loopback(bc.host):
            log.warning(
                "broker %s listens on %s without authentication: anyone who reaches it may read, write "
                "and delete every topic. Start it with --authentication-enabled (and TLS: --tls-cert-file, "
                "--tls-key-file), or bind it to 127.0.0.1 (--host 127.0.0.1)", bc.broker_name, bc.host,
            )
        if self.users.users:
            given = (" (--init-authentication-user / $PYMQ_INIT_AUTHENTICATION_USER given)"
                     if bc.init_authentication_user is not None else "")
            log.warning(
                "%d user(s) exist in %s%s but authentication is off: every request is served without "
                "checking who sent it. Start the broker with --authentication-enabled "
                "(EmbeddedBroker(authentication_enabled=True)) to require them",
                len(self.users.users), self.users.path, given,
            )

    def _auth(self) -> dict[str, Any]:
        """The user/ACL RPCs, and the AuthService every request passes when authentication is on."""
        bc = self.broker_config
        authentication = DefaultAuthenticationProvider(self.users, bc.authentication_clock_skew_ms)
        auth_admin = AuthAdminProcessor(self.users, self.acls, authentication)
        if bc.init_authentication_user is not None:
            name, _, password = bc.init_authentication_user.partition(":")
            if name not in self.users.users:  # as RocketMQ: created once, changed by update_user later
                auth_admin.add_user(User(name, password, UserType.SUPER))
        if not bc.authentication_enabled:
            return {"auth_admin": auth_admin, "auth": None}
        if not auth_admin.has_super_user():
            raise ValueError(
                "authentication is enabled and no Super user exists: start the broker once with "
                "--init-authentication-user USER:PASSWORD (EmbeddedBroker(init_authentication_user=...))"
            )
        authorization = DefaultAuthorizationProvider(self.acls) if bc.authorization_enabled else None
        auth = AuthService(bc.broker_name, authentication, authorization, StoredRecords(self))
        return {"auth_admin": auth_admin, "auth": auth}

    def _serve_rocketmq_v2(
        self, server: grpc.aio.Server, ctx: BrokerContext, send: SendMessageProcessor,
        hold: PullRequestHoldService,
    ) -> None:
        """apache.rocketmq.v2 (RocketMQ 5's official clients) on the same server, same store and groups.

        With authentication on, its requests pass the same AuthService (signatures, users, ACLs).
        """
        processor = MessagingProcessor(
            ctx, send, SendBackProcessor(ctx),
            EndTransactionProcessor(ctx, self.transactions, self.producers),
            hold, attempts_path=self.store_config.store_path_root_dir / "config" / "popDeliveryAttempts.json",
        )
        processor.timer = self.timer_message_store
        self.messaging = processor
        service_pb2_grpc.add_MessagingServiceServicer_to_server(
            GrpcMessagingService(processor, PullOffsetProcessor(ctx, hold, processor), self.producers,
                                 self.auth_service),
            server,
        )

    async def _schedule_loop(self) -> None:
        """Delayed messages (ScheduleMessageService) and timers (TimerMessageStore) when due.

        Each is asked again within 50 ms (new messages are not announced), or after a second
        when it failed; one that fails does not hold the other up. A round's progress is written
        on a thread (the store flushed first under SYNC_FLUSH) before the service's next round:
        an fsync after every round on the event loop held every client of the broker.
        """
        sms, timer = self.schedule_message_service, self.timer_message_store
        assert sms is not None and timer is not None
        services: list[ScheduleMessageService | TimerMessageStore] = [sms, timer]
        next_at = [0.0] * len(services)
        paused = [False] * len(services)
        loop = asyncio.get_running_loop()
        while True:
            now = loop.time()
            for i, service in enumerate(services):
                if now < next_at[i]:
                    continue
                name = type(service).__name__
                try:
                    wait = min(service.deliver_due(write=False), 0.05)
                except PutMessageError as err:  # a full disk: the messages wait, nothing is skipped
                    if not paused[i]:
                        log.warning("%s: messages wait until the store takes them: %s", name, err)
                    paused[i], wait = True, 1.0
                except Exception:
                    log.exception("%s failed; retrying in a second", name)
                    wait = 1.0
                else:
                    if paused[i]:
                        log.info("%s delivers again", name)
                    paused[i] = False
                job = service.delivered_job()  # what it delivered, failed round or not
                if job is not None:
                    try:
                        await asyncio.to_thread(job)
                    except Exception:  # a full disk: written with the next round, or at shutdown
                        service.dirty = True
                        log.exception("%s: writing its progress failed", name)
                        wait = 1.0
                next_at[i] = now + wait
            await asyncio.sleep(max(min(next_at) - loop.time(), 0.005))

    def _check_transactions(self) -> None:
        """TransactionalMessageCheckService: ask producers about unresolved transactions."""
        for check in self.transactions.check():
            if not self.producers.dispatch(check):
                log.info("no producer of group %r connected to check transaction %s",
                         check.producer_group, check.msg_id)

    @staticmethod
    async def _persist_every(interval_s: float, *managers: ConfigManager) -> None:
        """What changed of ``managers`` to disk every ``interval_s`` (consumer offsets, groups created
        on first use, the %RETRY% topics of consumers that registered, the transactions' check
        offset, v2 delivery attempts): each snapshot is
        taken on the event loop (the only writer of the tables), the write and fsync run on a thread
        (and the encoding, for a manager that encodes in ``render``: the topics)."""
        while True:
            await asyncio.sleep(interval_s)
            for manager in managers:
                job = manager.snapshot_job_if_dirty()
                if job is None:
                    continue
                try:
                    await asyncio.to_thread(job)
                except Exception:
                    manager.dirty = True  # tried again next time
                    log.exception("persisting %s failed", manager.path)

    @staticmethod
    async def _clean_expired_files(store: DefaultMessageStore) -> None:
        """Retention (RocketMQ's CleanCommitLogService): the expired segments taken out of the store on
        the event loop, their files deleted on a thread (ExpiredFiles). A shutdown waits for the
        deletion: the files are the data dir's, which the broker then lets go."""
        removal = asyncio.ensure_future(asyncio.to_thread(store.take_expired_files().remove))
        try:
            await asyncio.shield(removal)
        except asyncio.CancelledError:
            await asyncio.wait([removal])
            raise

    @staticmethod
    async def _every(interval_s: float, fn: Callable[[], object]) -> None:
        while True:
            await asyncio.sleep(interval_s)
            try:
                result = fn()
                if inspect.isawaitable(result):
                    await result
            except Exception:
                log.exception("periodic task %r failed", fn)

    async def wait_for_termination(self) -> None:
        if self.server is not None:
            await self.server.wait_for_termination()

    async def shutdown(self, grace_s: float = 2.0) -> None:
        """Stop serving, then flush everything and persist every manager."""
        if self.server is not None:
            await self.server.stop(grace_s)
            self.server = None
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await t
        self._tasks = []
        deletions = [t for t in self._deleting_topics.values() if not t.done()]
        if deletions:
            # a DeleteTopic runs to its end in a task of its own, whatever its client (gone with the
            # server's grace) does, its steps on threads (the checkpoint, the queue files, the
            # offsets' and topics' writes): all of them before the store shuts and the dir is let go
            await asyncio.wait(deletions)
        if self.auth_admin is not None:
            # a user/ACL change runs to its end in a task of its own, whatever its client (gone with
            # the server's grace) does: its users.json / acls.json write, on a thread, ends first
            await self.auth_admin.changes_done()
        # every file written whether changed or not: a cancelled periodic write may still run on its
        # thread, its snapshot taken (its manager clean); a newer one written now makes it a no-op
        # (an older snapshot never replaces a newer one) before the data dir is let go
        for progress in (self.schedule_message_service, self.timer_message_store):
            if progress is not None:
                progress.progress_made(write=True)  # the store flushed first under SYNC_FLUSH
        self.consumer_offset_manager.persist()
        if getattr(self, "transactions", None) is not None:
            self.transactions.persist()
        if self.messaging is not None:
            self.messaging.pop.attempts.flush()
        self.subscription_group_manager.persist()
        self.topic_config_manager.persist()
        if self.store is not None:
            self.store.shutdown()
            self.store = None
        self.store_lock.release()  # after every write to the dir
        log.info("broker %s shut down", self.broker_config.broker_name)


def is_loopback(host: str) -> bool:
    """Whether ``host`` (a name, an IPv4 or an IPv6 address, bracketed or not) is this host's loopback.

    A host name other than localhost counts as not: what it resolves to is not ours to know.
    """
    name = host.strip().removeprefix("[").removesuffix("]")
    if name.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def host_port(host: str, port: int) -> str:
    """``host:port``, an IPv6 literal in brackets (``[::]:8081``), as gRPC and clients read it."""
    return f"[{host}]:{port}" if ":" in host and not host.startswith("[") else f"{host}:{port}"


def bind(server: grpc.aio.Server, bc: BrokerConfig) -> int:
    """Listen on ``bc.host:bc.port``, with TLS when the broker has a certificate; the bound port.

    Raises OSError naming the address when it cannot be bound.
    """
    address = host_port(bc.host, bc.port)
    try:
        port = _add_port(server, bc, address)
    except RuntimeError:  # grpcio raises "Failed to bind to address" (older versions returned 0)
        port = 0
    if port == 0:
        raise OSError(
            f"cannot listen on {address}: the port is in use (another broker?) or the address is not "
            "one of this host's. Give another port (--port, EmbeddedBroker(port=...)), or 0 for a free one"
        )
    return port


def _add_port(server: grpc.aio.Server, bc: BrokerConfig, address: str) -> int:
    if bc.tls_cert_file is None or bc.tls_key_file is None:
        return server.add_insecure_port(address)
    def read(path: str, what: str) -> bytes:
        try:
            return Path(path).read_bytes()
        except OSError as err:
            raise ValueError(f"{what} {path!r} cannot be read: {err.strerror or err}") from None
    credentials = grpc.ssl_server_credentials(
        [(read(bc.tls_key_file, "--tls-key-file"), read(bc.tls_cert_file, "--tls-cert-file"))],
        root_certificates=(None if bc.tls_client_ca_file is None
                           else read(bc.tls_client_ca_file, "--tls-client-ca-file")),
        require_client_auth=bc.tls_client_ca_file is not None,
    )
    return server.add_secure_port(address, credentials)


def build_configs(data_dir: Path | str, **options: object) -> tuple[BrokerConfig, MessageStoreConfig]:
    """Split keyword options into BrokerConfig and MessageStoreConfig by field name."""
    import dataclasses

    broker_fields = {f.name for f in dataclasses.fields(BrokerConfig)}
    store_fields = {f.name for f in dataclasses.fields(MessageStoreConfig)}
    b = {k: v for k, v in options.items() if k in broker_fields}
    s = {k: v for k, v in options.items() if k in store_fields}
    unknown = sorted(set(options) - broker_fields - store_fields)
    if unknown:
        raise TypeError(
            f"unknown broker option(s) {unknown}; known: {sorted(broker_fields | store_fields)}"
        )
    return BrokerConfig(**b), MessageStoreConfig(store_path_root_dir=Path(data_dir), **s)  # type: ignore[arg-type]

"""BrokerController: builds the store, managers, processors and the gRPC server, and runs them."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from pathlib import Path

import grpc
from pymq_proto.record import store_host_bytes
from pymq_proto.v1 import pymq_pb2_grpc

from .broker_config import BrokerConfig
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
from .remoting.grpc_service import BrokerGrpcService
from .store.config import MessageStoreConfig
from .store.message_store import DefaultMessageStore
from .store.schedule_message_service import ScheduleMessageService
from .transaction.transactional_message_service import (
    TransactionalMessageService,
    TransactionConfig,
)

log = logging.getLogger(__name__)

GRPC_OPTIONS = [
    ("grpc.max_receive_message_length", 256 * 1024 * 1024),
    ("grpc.max_send_message_length", 256 * 1024 * 1024),
    ("grpc.so_reuseport", 0),
]


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
        self.schedule_path = cfg_dir / "delayOffset.json"
        self.server: grpc.aio.Server | None = None
        self.endpoint = ""
        self._tasks: list[asyncio.Task[None]] = []
        self.schedule_message_service: ScheduleMessageService | None = None

    async def start(self) -> str:
        """Load and recover the store, then serve; returns the bound ``host:port``."""
        bc = self.broker_config
        self.topic_config_manager.load()
        self.consumer_offset_manager.load()
        self.subscription_group_manager.load()
        server = grpc.aio.server(options=GRPC_OPTIONS)
        port = server.add_insecure_port(f"{bc.host}:{bc.port}")
        if port == 0:
            raise OSError(f"cannot listen on {bc.host}:{bc.port}")
        self.endpoint = f"{bc.host}:{port}"
        store = DefaultMessageStore(self.store_config, store_host_bytes(bc.host, port))
        store.load()
        hold = PullRequestHoldService()
        store.message_arriving_listener = hold.notify_message_arriving
        store.start()
        self.store = store
        ctx = BrokerContext(
            bc, store, self.topic_config_manager, self.consumer_offset_manager,
            self.subscription_group_manager, self.endpoint,
        )
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
            send=send,
            pull=PullMessageProcessor(ctx, hold),
            send_back=SendBackProcessor(ctx),
            consumer_manage=ConsumerManageProcessor(ctx),
            admin=AdminBrokerProcessor(ctx, send.dedup, self.transactions),
            end_transaction=EndTransactionProcessor(ctx, self.transactions, self.producers),
        )
        pymq_pb2_grpc.add_BrokerServicer_to_server(service, server)
        self.schedule_message_service = ScheduleMessageService(store, self.schedule_path)
        self.schedule_message_service.load()
        await server.start()
        self.server = server
        self._tasks = [
            asyncio.create_task(self._schedule_loop()),
            asyncio.create_task(
                self._every(min(1.0, bc.transaction_timeout / 2000), self._check_transactions)
            ),
            asyncio.create_task(self._every(bc.flush_consumer_offset_interval / 1000,
                                            self.consumer_offset_manager.persist_if_dirty)),
            asyncio.create_task(self._every(self.store_config.clean_resource_interval / 1000,
                                            store.clean_expired_files)),
        ]
        log.info("broker %s serving on %s", bc.broker_name, self.endpoint)
        return self.endpoint

    async def _schedule_loop(self) -> None:
        sms = self.schedule_message_service
        assert sms is not None
        while True:
            try:
                wait = sms.deliver_due()
            except Exception:
                log.exception("schedule message service failed; retrying")
                wait = 1.0
            await asyncio.sleep(min(max(wait, 0.005), 0.05))

    def _check_transactions(self) -> None:
        """TransactionalMessageCheckService: ask producers about unresolved transactions."""
        for check in self.transactions.check():
            if not self.producers.dispatch(check):
                log.info("no producer of group %r connected to check transaction %s",
                         check.producer_group, check.msg_id)

    @staticmethod
    async def _every(interval_s: float, fn: object) -> None:
        while True:
            await asyncio.sleep(interval_s)
            try:
                fn()  # type: ignore[operator]
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
        if self.schedule_message_service is not None:
            self.schedule_message_service.persist()
        self.consumer_offset_manager.persist()
        if self.store is not None:
            self.store.shutdown()
            self.store = None
        log.info("broker %s shut down", self.broker_config.broker_name)


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

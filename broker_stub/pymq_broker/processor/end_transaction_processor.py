"""END_TRANSACTION and the check-back channel (RocketMQ's EndTransactionProcessor and
the broker-to-producer CHECK_TRANSACTION_STATE request, here a server stream)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator

from pymq_proto.v1 import pymq_pb2

from ..common.broker_exception import BrokerException
from ..transaction.transactional_message_service import (
    TransactionalMessageService,
    TransactionCheck,
)
from .context import BrokerContext
from .send_message_processor import wait_store_ok

log = logging.getLogger(__name__)

MAX_END_TRANSACTION_BATCH = 100_000


class ProducerManager:
    """Producers with an open check-back channel, and their pending checks.

    Two namespaces, apart: ``channels``, the producer groups of v1 TransactionStreams, and
    ``topic_channels``, the topics of apache.rocketmq.v2 publishers (a Telemetry stream
    hears its topics' check-backs, as RocketMQ 5's proxy registers a producer under each
    topic it publishes to). In one table, Pub on ``Topic:X`` received the check-backs, half
    message included, of v1 producer group X.
    """

    def __init__(self) -> None:
        self.channels: dict[str, list[asyncio.Queue[TransactionCheck]]] = {}
        self.topic_channels: dict[str, list[asyncio.Queue[TransactionCheck]]] = {}
        self._next = 0

    def register(self, group: str) -> asyncio.Queue[TransactionCheck]:
        """A v1 TransactionStream of producer ``group``."""
        return self._register(self.channels, group)

    def unregister(self, group: str, queue: asyncio.Queue[TransactionCheck]) -> None:
        self._unregister(self.channels, group, queue)

    def register_topic(self, topic: str) -> asyncio.Queue[TransactionCheck]:
        """A v2 publisher of ``topic`` (a Telemetry stream's publishing settings)."""
        return self._register(self.topic_channels, topic)

    def unregister_topic(self, topic: str, queue: asyncio.Queue[TransactionCheck]) -> None:
        self._unregister(self.topic_channels, topic, queue)

    @staticmethod
    def _register(table: dict[str, list[asyncio.Queue[TransactionCheck]]],
                  key: str) -> asyncio.Queue[TransactionCheck]:
        queue: asyncio.Queue[TransactionCheck] = asyncio.Queue()
        table.setdefault(key, []).append(queue)
        return queue

    @staticmethod
    def _unregister(table: dict[str, list[asyncio.Queue[TransactionCheck]]], key: str,
                    queue: asyncio.Queue[TransactionCheck]) -> None:
        queues = table.get(key, [])
        if queue in queues:
            queues.remove(queue)
        if not queues:
            table.pop(key, None)

    def dispatch(self, check: TransactionCheck) -> bool:
        """Hand a check to one live producer of its group; False if none is connected.

        Its group's v1 streams, and, when its PGROUP is its topic (what a v2 send stores:
        MessagingProcessor's send passes the topic as the producer group), its topic's v2
        publishers; a v1 group's half message in another topic never reaches a v2 stream.
        """
        queues = [*self.channels.get(check.producer_group, ())]
        if check.producer_group == check.topic:
            queues += self.topic_channels.get(check.topic, ())
        if not queues:
            return False
        self._next += 1
        queues[self._next % len(queues)].put_nowait(check)
        return True


class EndTransactionProcessor:
    def __init__(self, ctx: BrokerContext, service: TransactionalMessageService,
                 producers: ProducerManager) -> None:
        self.ctx = ctx
        self.service = service
        self.producers = producers

    async def end_transaction(
        self, req: pymq_pb2.EndTransactionRequest
    ) -> pymq_pb2.EndTransactionResponse:
        if not req.msg_id:
            raise BrokerException(
                pymq_pb2.ILLEGAL_ARGUMENT, "end transaction needs the half message's msg_id"
            )
        resolved = await self._end([req.msg_id], req.state)
        return pymq_pb2.EndTransactionResponse(resolved=resolved > 0)

    async def end_transaction_batch(
        self, req: pymq_pb2.EndTransactionBatchRequest
    ) -> pymq_pb2.EndTransactionBatchResponse:
        if len(req.msg_ids) > MAX_END_TRANSACTION_BATCH:
            raise BrokerException(
                pymq_pb2.ILLEGAL_ARGUMENT,
                f"{len(req.msg_ids)} msg ids in one EndTransactionBatch; send at most "
                f"{MAX_END_TRANSACTION_BATCH} per request",
            )
        bad = next((i for i, m in enumerate(req.msg_ids) if not m), None)
        if bad is not None:
            raise BrokerException(pymq_pb2.ILLEGAL_ARGUMENT, f"msg_ids[{bad}] is empty")
        return pymq_pb2.EndTransactionBatchResponse(resolved=await self._end(list(req.msg_ids), req.state))

    async def _end(self, msg_ids: list[str], state: pymq_pb2.TransactionState.ValueType) -> int:
        if state == pymq_pb2.UNKNOW:
            return 0
        commit = state == pymq_pb2.COMMIT_MESSAGE
        if not commit and state != pymq_pb2.ROLLBACK_MESSAGE:
            raise BrokerException(pymq_pb2.ILLEGAL_ARGUMENT, f"unknown transaction state {state}")
        resolved, results = self.service.end_transactions(msg_ids, commit)
        for result in results:
            await wait_store_ok(self.ctx, result)
        return resolved

    async def transaction_stream(
        self, req: pymq_pb2.TransactionStreamRequest
    ) -> AsyncIterator[pymq_pb2.CheckTransactionStateRequest]:
        if not req.producer_group:
            raise BrokerException(pymq_pb2.ILLEGAL_ARGUMENT, "a transaction stream needs a producer_group")
        queue = self.producers.register(req.producer_group)
        try:
            while True:
                check = await queue.get()
                yield pymq_pb2.CheckTransactionStateRequest(
                    msg_id=check.msg_id, topic=check.topic, record=check.record,
                    check_times=check.check_times,
                )
        finally:
            self.producers.unregister(req.producer_group, queue)

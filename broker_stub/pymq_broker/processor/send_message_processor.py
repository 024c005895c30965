"""SendMessageProcessor: SEND_MESSAGE and SEND_BATCH_MESSAGE.

Checks the topic, queue and message, stores, and under SYNC_FLUSH answers only
once the messages are on disk (FLUSH_DISK_TIMEOUT past syncFlushTimeout).
A direct send to %RETRY%<group> (a consumer's fallback when its send back
failed) follows RocketMQ's handleRetryAndDLQ: past maxReconsumeTimes it goes
to %DLQ%<group> instead.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Sequence
from concurrent.futures import Future
from typing import NamedTuple

from pymq_proto.record import (
    MAX_PROPERTIES_SIZE,
    MessageConst,
    decode_properties,
    encode_properties,
    find_property,
    property_key,
)
from pymq_proto.topics import RETRY_GROUP_TOPIC_PREFIX, get_dlq_topic
from pymq_proto.v1 import pymq_pb2

from ..common.broker_exception import BrokerException
from ..common.mix_all import is_system_topic, topic_name_problem
from ..manager.topic_config_manager import TopicConfig
from ..store.commit_log import MessageToStore
from ..store.encoded_batch import EncodedRecords, parse_encoded
from ..store.results import PutMessageResult, PutMessageStatus
from ..transaction.transactional_message_service import TransactionalMessageService
from .context import BrokerContext
from .dedup import DedupWindow

_DELAY = MessageConst.PROPERTY_DELAY_TIME_LEVEL.encode()
_UNIQ = MessageConst.PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX.encode()
_MAX_RECONSUME = MessageConst.PROPERTY_MAX_RECONSUME_TIMES.encode()
_TRAN = MessageConst.PROPERTY_TRANSACTION_PREPARED.encode()
_DELAY_KEY = property_key(MessageConst.PROPERTY_DELAY_TIME_LEVEL)
_TRAN_KEY = property_key(MessageConst.PROPERTY_TRANSACTION_PREPARED)
_TIMER = MessageConst.PROPERTY_TIMER_DELIVER_MS.encode()
_TIMER_KEY = property_key(MessageConst.PROPERTY_TIMER_DELIVER_MS)

def _deliver_ahead(properties: bytes) -> bool:
    """A TIMER_DELIVER_MS still ahead (one past is delivered now, as the store does)."""
    at = find_property(properties, _TIMER)
    return at is not None and at.isdigit() and int(at) > time.time() * 1000


PUT_STATUS_TO_CODE = {
    PutMessageStatus.MESSAGE_ILLEGAL: pymq_pb2.MESSAGE_ILLEGAL,
    PutMessageStatus.PROPERTIES_SIZE_EXCEEDED: pymq_pb2.MESSAGE_ILLEGAL,
    PutMessageStatus.SERVICE_NOT_AVAILABLE: pymq_pb2.SERVICE_NOT_AVAILABLE,
    PutMessageStatus.UNKNOWN_ERROR: pymq_pb2.SYSTEM_ERROR,
}


async def wait_store_ok(
    ctx: BrokerContext, result: PutMessageResult
) -> pymq_pb2.SendStatus.ValueType:
    """Raise for a failed put; under SYNC_FLUSH wait for the disk. Returns the SendStatus."""
    if not result.ok:
        raise BrokerException(
            PUT_STATUS_TO_CODE.get(result.status, pymq_pb2.SYSTEM_ERROR),
            result.remark or result.status.value,
        )
    fut: Future[bool] | None = ctx.store.wait_flush(result)
    if fut is None:
        return pymq_pb2.SEND_OK
    try:
        await asyncio.wait_for(
            asyncio.wrap_future(fut), ctx.store.config.sync_flush_timeout / 1000.0
        )
    except TimeoutError:
        return pymq_pb2.FLUSH_DISK_TIMEOUT_STATUS
    return pymq_pb2.SEND_OK


class _Item(NamedTuple):
    """A message of a pre-encoded batch, for the per-message path (as MessageData)."""

    body: bytes
    flag: int
    properties: bytes


_Messages = Sequence[_Item | pymq_pb2.MessageData]  # a request's messages, either way they came


def _stamp(records: EncodedRecords, born: int, reconsume_times: int) -> None:
    """The request's header fields on every record of a pre-encoded batch."""
    h = records.headers
    h["born"] = born
    h["reconsume"] = reconsume_times
    h["sys_flag"] = 0


def _check_utf8(records: EncodedRecords | None, messages: Sequence[pymq_pb2.MessageData]) -> None:
    """MESSAGE_ILLEGAL for properties that are not UTF-8: stored, they would fail every reader."""
    bad: tuple[int, UnicodeDecodeError] | None = None
    if records is not None:
        bad = records.first_not_utf8()
    else:
        for i, m in enumerate(messages):
            try:
                m.properties.decode()
            except UnicodeDecodeError as decode_error:
                bad = i, decode_error
                break
    if bad is not None:
        i, err = bad
        where = f"message {i} of the batch: " if max(len(messages), len(records or ())) > 1 else ""
        raise BrokerException(
            pymq_pb2.MESSAGE_ILLEGAL,
            f"{where}properties are not valid UTF-8 (byte {err.start}: {err.object[err.start:err.end]!r}); "
            "property names and values are strings: encode them as UTF-8",
        )


class SendMessageProcessor:
    def __init__(self, ctx: BrokerContext, transactions: TransactionalMessageService) -> None:
        self.ctx = ctx
        self.transactions = transactions
        self.dedup = DedupWindow()
        self._round_robin = itertools.count()

    async def send_half_message_batch(
        self, req: pymq_pb2.SendMessageRequest
    ) -> pymq_pb2.SendMessageResponse:
        """pymq: many half messages in one request, each its own transaction."""
        return await self.send_message(req, half_batch=True)

    async def send_message(
        self, req: pymq_pb2.SendMessageRequest, *, half_batch: bool = False
    ) -> pymq_pb2.SendMessageResponse:
        """SEND_MESSAGE and SEND_BATCH_MESSAGE (``half_batch``: pymq's SendHalfMessageBatch).

        The request and the topic are checked first; a pre-encoded batch that no
        feature rewrites is then stored as it came. Everything else takes the
        per-message path: de-duplication, then a transaction's half messages, a
        retry bound for the DLQ, or a plain put.
        """
        records = self._parse_request(req)
        _check_utf8(records, req.messages)
        topic = req.topic
        while True:
            if topic in self.ctx.deleting_topics:  # an auto-create of the name waits for the deletion
                await self.ctx.deletion_done(topic)
            cfg, queue_id = self._msg_check(topic, req.queue_id)
            await self.ctx.topic_on_disk(topic)  # an auto-created topic: written off the loop first
            # the topic as checked, still: a DeleteTopic (or an update) while its write ran is
            # checked again, rather than stored in a topic gone from the table (and from the disk)
            if self.ctx.topic_config_manager.select_topic_config(topic) is cfg:
                break
        items: _Messages = req.messages
        if records is not None:
            sent = await self._send_encoded(req, queue_id, cfg, records, half_batch)
            if sent is not None:
                return sent
            items = [_Item(*records.message(i)) for i in range(len(records))]
        messages, dropped = self._messages_to_store(req, cfg, items)
        try:
            return await self._store_messages(req, queue_id, messages, dropped, half_batch, items)
        except Exception:
            if cfg.dedup_window_ms > 0:  # not stored: a retry must not be dropped as a duplicate
                self.dedup.forget(topic, (u for m in messages if (u := find_property(m.properties, _UNIQ))))
            raise

    async def _store_messages(
        self, req: pymq_pb2.SendMessageRequest, queue_id: int, messages: list[MessageToStore], dropped: int,
        half_batch: bool, items: _Messages,
    ) -> pymq_pb2.SendMessageResponse:
        """The per-message path's puts: half messages, a retry bound for the DLQ, or a plain put."""
        topic = req.topic
        if half_batch:
            self._check_half_batch(items)
        if messages and find_property(messages[0].properties, _TRAN) == b"true" and not (
            # RocketMQ's exception: a consumer's own copy of a committed transactional message
            # (TRAN_MSG=true kept) sent to %RETRY% with a reconsume count and a delay level
            req.reconsume_times > 0 and find_property(messages[0].properties, _DELAY) not in (None, b"0")
        ):
            batch = len(items) > 1 and not half_batch
            return await self._send_half_messages(topic, queue_id, messages, batch)
        if topic.startswith(RETRY_GROUP_TOPIC_PREFIX) and messages:
            topic, queue_id, messages = self._handle_retry_and_dlq(
                topic, queue_id, req.reconsume_times, messages
            )
            if topic != req.topic:  # over maxReconsumeTimes: to the group's %DLQ% topic, made if need be
                await self.ctx.dlq_on_disk(req.topic[len(RETRY_GROUP_TOPIC_PREFIX):])
        if not messages:
            return self._response(queue_id, pymq_pb2.SEND_OK, None, dropped)
        result = self.ctx.store.put_messages(topic, queue_id, messages)
        return self._response(queue_id, await wait_store_ok(self.ctx, result), result, dropped)

    @staticmethod
    def _parse_request(req: pymq_pb2.SendMessageRequest) -> EncodedRecords | None:
        """The request carries messages one way or the other; its pre-encoded batch, parsed (else None)."""
        encoded = req.encoded if req.HasField("encoded") else None
        if encoded is not None and req.messages:
            raise BrokerException(
                pymq_pb2.MESSAGE_ILLEGAL, "the request carries both messages and an encoded batch"
            )
        if encoded is None and not req.messages:
            raise BrokerException(pymq_pb2.MESSAGE_ILLEGAL, "the request carries no message")
        records: EncodedRecords | None = None
        if encoded is not None:
            try:
                records = parse_encoded(encoded.records, encoded.sizes, req.topic)
            except ValueError as err:
                raise BrokerException(pymq_pb2.MESSAGE_ILLEGAL, str(err)) from None
        count = len(records) if records is not None else len(req.messages)
        if count > 1 and not req.batch:
            raise BrokerException(
                pymq_pb2.MESSAGE_ILLEGAL, "several messages in one request must be sent as a batch"
            )
        return records

    def _msg_check(self, topic: str, queue_id: int) -> tuple[TopicConfig, int]:
        """RocketMQ's msgCheck: the topic's config (created if it may be) and the queue to write.

        A missing %RETRY% topic is created as on a send back, another as
        autoCreateTopicEnable allows; the broker's other topics refuse sends.
        ``queue_id`` -1: the next queue, round robin.
        """
        ctx = self.ctx
        if queue_id < -1:
            raise BrokerException(
                pymq_pb2.ILLEGAL_ARGUMENT,
                f"queue id {queue_id} is not a queue: give 0 or more, or -1 to let the broker choose",
            )
        cfg = ctx.topic_config_manager.select_topic_config(topic)
        if cfg is None and topic.startswith(RETRY_GROUP_TOPIC_PREFIX):
            group = topic[len(RETRY_GROUP_TOPIC_PREFIX):]
            sub = ctx.subscription_group_manager.find_subscription_group_config(group)
            cfg = ctx.topic_config_manager.create_topic_of_retry(group, sub.retry_queue_nums)
        elif cfg is None and topic_name_problem(topic) is None and not is_system_topic(topic):
            cfg = ctx.topic_config_manager.create_topic_in_send_message_method(topic)
        if cfg is None:
            ctx.topic_config(topic)  # raises the right error
            raise AssertionError
        if is_system_topic(topic) and not topic.startswith(RETRY_GROUP_TOPIC_PREFIX):
            raise BrokerException(
                pymq_pb2.NO_PERMISSION, f"topic {topic!r} belongs to the broker; send elsewhere"
            )
        if queue_id < 0:
            queue_id = next(self._round_robin) % cfg.write_queue_nums
        ctx.check_queue(topic, queue_id, write=True)
        return cfg, queue_id

    async def _send_encoded(
        self, req: pymq_pb2.SendMessageRequest, queue_id: int, cfg: TopicConfig, records: EncodedRecords,
        half_batch: bool,
    ) -> pymq_pb2.SendMessageResponse | None:
        """A pre-encoded batch stored as it came (header fields set for all records at once).

        None when some record needs the per-message path: a delay, a
        transaction or a %RETRY% topic (see :meth:`_needs_rewrite`), or half
        messages under a de-duplication window or that
        :meth:`TransactionalMessageService.prepare_records` cannot take whole.
        """
        _stamp(records, req.born_timestamp, req.reconsume_times)
        topic = req.topic
        if half_batch:
            if cfg.dedup_window_ms:
                return None
            half = self.transactions.prepare_records(topic, queue_id, records)
            if half is None:
                return None
            return self._response(queue_id, await wait_store_ok(self.ctx, half), half, half=True)
        if self._needs_rewrite(topic, records):
            return None
        return await self._send_records(topic, queue_id, records, cfg.dedup_window_ms)

    def _messages_to_store(
        self, req: pymq_pb2.SendMessageRequest, cfg: TopicConfig, items: _Messages
    ) -> tuple[list[MessageToStore], int]:
        """The messages to store, and how many the de-duplication window dropped.

        A batch's messages cannot be delayed (RocketMQ's rule), checked first.
        """
        topic, born, reconsume_times = req.topic, req.born_timestamp, req.reconsume_times
        # every refusal before the de-duplication window remembers a key: a refused request's
        # keys would drop its corrected retry as a duplicate
        for i, m in enumerate(items):
            if req.batch and find_property(m.properties, _DELAY) not in (None, b"0"):
                raise BrokerException(
                    pymq_pb2.MESSAGE_ILLEGAL,
                    f"message {i} of the batch has a delay level; batch messages cannot be delayed",
                )
            if req.batch and _deliver_ahead(m.properties):
                raise BrokerException(  # the store times a single message only: it went out at once
                    pymq_pb2.MESSAGE_ILLEGAL,
                    f"message {i} of the batch has a delivery time ahead (TIMER_DELIVER_MS); batch "
                    "messages cannot be delayed: send it alone",
                )
            if len(m.properties) > MAX_PROPERTIES_SIZE:
                raise BrokerException(
                    pymq_pb2.MESSAGE_ILLEGAL,
                    f"message {i} has {len(m.properties)} bytes of properties, over the limit of "
                    f"{MAX_PROPERTIES_SIZE}; send fewer or shorter properties",
                )
        messages = []
        dropped = 0
        for m in items:
            if cfg.dedup_window_ms > 0:
                uniq = find_property(m.properties, _UNIQ)
                if uniq and self.dedup.seen_recently(topic, uniq, cfg.dedup_window_ms):
                    dropped += 1
                    continue
            messages.append(MessageToStore(m.body, m.flag, m.properties, born, reconsume_times))
        return messages, dropped

    @staticmethod
    def _check_half_batch(items: _Messages) -> None:
        """Every message of a half message batch is one (TRAN_MSG=true)."""
        plain = next((i for i, m in enumerate(items) if find_property(m.properties, _TRAN) != b"true"), None)
        if plain is not None:
            raise BrokerException(
                pymq_pb2.MESSAGE_ILLEGAL,
                f"message {plain} of a half message batch lacks TRAN_MSG=true; send it with SendMessage",
            )

    async def _send_half_messages(
        self, topic: str, queue_id: int, messages: list[MessageToStore], batch: bool,
    ) -> pymq_pb2.SendMessageResponse:
        """RocketMQ's asyncPrepareMessage: transactional messages stored as half messages.

        ``batch``: a plain batch (not a half message batch), which transactions refuse.
        """
        if batch:
            raise BrokerException(
                pymq_pb2.MESSAGE_ILLEGAL, "transactional messages cannot be sent as a batch"
            )
        if any(find_property(m.properties, _DELAY) not in (None, b"0") for m in messages):
            raise BrokerException(
                pymq_pb2.MESSAGE_ILLEGAL, "transactional messages cannot be delayed"
            )
        result = self.transactions.prepare_messages(topic, queue_id, messages)
        status = await wait_store_ok(self.ctx, result)
        return self._response(queue_id, status, result, half=True)

    def _response(
        self, queue_id: int, status: pymq_pb2.SendStatus.ValueType, result: PutMessageResult | None,
        dropped: int = 0, *, half: bool = False,
    ) -> pymq_pb2.SendMessageResponse:
        """The answer to a send; ``result`` None: nothing stored (every message a duplicate)."""
        return pymq_pb2.SendMessageResponse(
            status=status,
            queue_id=queue_id,
            # a half message: the half queue's offset, as RocketMQ answers it (the producer's
            # END_TRANSACTION names the half message by it: tranStateTableOffset)
            queue_offset=-1 if result is None else result.queue_offset,
            commit_log_offsets=[] if result is None else result.physical_offsets,
            store_host=self.ctx.endpoint,
            broker_name=self.ctx.broker_name,
            duplicates_dropped=dropped,
        )

    @staticmethod
    def _needs_rewrite(topic: str, records: EncodedRecords) -> bool:
        """Whether a feature may rewrite or reject some record: then the per-message path runs.

        A delay level or time, a transaction or a %RETRY% topic (maybe bound for the DLQ)
        are rare in bulk sends; the byte search may also hit a body, which only
        costs the slower path.
        """
        return (
            topic.startswith(RETRY_GROUP_TOPIC_PREFIX)
            or records.contains(_DELAY_KEY)
            or records.contains(_TRAN_KEY)
            or records.contains(_TIMER_KEY)
        )

    async def _send_records(
        self, topic: str, queue_id: int, records: EncodedRecords, dedup_window_ms: int,
    ) -> pymq_pb2.SendMessageResponse:
        """A pre-encoded batch: header fields set for all records at once, one write."""
        ctx = self.ctx
        dropped = 0
        remembered: list[bytes] = []
        if dedup_window_ms > 0:
            seen = self.dedup.seen_recently
            uniq = records.uniq_keys()
            keep = [i for i, u in enumerate(uniq) if not (u and seen(topic, u, dedup_window_ms))]
            remembered = [u for i in keep if (u := uniq[i])]
            dropped = len(records) - len(keep)
            if not keep:
                return self._response(queue_id, pymq_pb2.SEND_OK, None, dropped)
            if dropped:
                records = records.select(keep)
        # the consume queue and index are written on the loop's next turn, while the answer
        # travels (RocketMQ's reput is asynchronous too): a sync sender stops waiting for them
        try:
            result = ctx.store.put_records(topic, queue_id, records, reput_later=True)
        except Exception:
            self.dedup.forget(topic, remembered)
            raise
        if not result.ok:  # not stored: a retry must not be dropped as a duplicate
            self.dedup.forget(topic, remembered)
        asyncio.get_running_loop().call_soon(ctx.store.do_reput)
        status = await wait_store_ok(ctx, result)
        return self._response(queue_id, status, result, dropped)

    def _handle_retry_and_dlq(
        self, topic: str, queue_id: int, reconsume_times: int, messages: list[MessageToStore]
    ) -> tuple[str, int, list[MessageToStore]]:
        """RocketMQ's handleRetryAndDLQ: a retry whose reconsumeTimes is over maxReconsumeTimes
        goes to the DLQ, stored with DELAY=-1 (as RocketMQ's properties say)."""
        group = topic[len(RETRY_GROUP_TOPIC_PREFIX):]
        sub = self.ctx.subscription_group_manager.find_subscription_group_config(group)
        raw_max = find_property(messages[0].properties, _MAX_RECONSUME)
        max_times = int(raw_max) if raw_max and raw_max.isdigit() else sub.retry_max_times
        # the request's reconsumeTimes is already the failed message's + 1: over, not at, the max
        if reconsume_times <= max_times:
            return topic, queue_id, messages
        dead = []
        for m in messages:
            props = decode_properties(m.properties)
            props[MessageConst.PROPERTY_DELAY_TIME_LEVEL] = "-1"
            origin = props.get(MessageConst.PROPERTY_RETRY_TOPIC, "")
            props[MessageConst.PROPERTY_DLQ_ORIGIN_TOPIC] = origin
            origin_id = props.get(MessageConst.PROPERTY_ORIGIN_MESSAGE_ID)
            if origin_id:  # the first stored copy's offsetMsgId, as the send back sets it
                props[MessageConst.PROPERTY_DLQ_ORIGIN_MESSAGE_ID] = origin_id
            dead.append(MessageToStore(m.body, m.flag, encode_properties(props), m.born_timestamp,
                                       m.reconsume_times, m.sys_flag))
        return get_dlq_topic(group), 0, dead

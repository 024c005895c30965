"""CONSUMER_SEND_MSG_BACK: a consumer returns a message it failed to consume.

RocketMQ's broker logic, step by step: read the original record by its
physical offset; past maxReconsumeTimes (or with a delay level < 0) write it to
%DLQ%<group>; otherwise write a *new* message to %RETRY%<group> with delay
level 3 + reconsumeTimes (when the client passed 0), RECONSUME_TIME + 1,
RETRY_TOPIC = the original topic and ORIGIN_MESSAGE_ID = the first msg id.
The delay takes it through SCHEDULE_TOPIC_XXXX.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from pymq_proto.record import HEADER, MessageConst, decode_properties, encode_properties, split_tail
from pymq_proto.v1 import pymq_pb2

from ..common.broker_exception import BrokerException
from ..common.mix_all import SCHEDULE_TOPIC, get_dlq_topic, get_retry_topic, is_retry_topic
from ..store.commit_log import MessageToStore
from .context import BrokerContext
from .send_message_processor import wait_store_ok

MC = MessageConst
MAX_REASON_CHARS = 4000


@dataclass(slots=True)
class _SendBack:
    """One message to send back, resolved: where it goes and what is stored.

    ``topic`` is the answer's (%RETRY% or %DLQ%); a retry is stored in
    SCHEDULE_TOPIC_XXXX first (``store_topic`` / ``store_queue_id``).
    """

    topic: str
    store_topic: str
    store_queue_id: int
    message: MessageToStore
    dead: bool


class SendBackProcessor:
    def __init__(self, ctx: BrokerContext) -> None:
        self.ctx = ctx

    async def consumer_send_msg_back(
        self, req: pymq_pb2.ConsumerSendMsgBackRequest
    ) -> pymq_pb2.ConsumerSendMsgBackResponse:
        item = self._prepare(req, self.ctx.store.look_message_by_offset(req.commit_log_offset))
        result = self.ctx.store.put_messages(item.store_topic, item.store_queue_id, [item.message])
        await wait_store_ok(self.ctx, result)
        return pymq_pb2.ConsumerSendMsgBackResponse(
            topic=item.topic, commit_log_offset=result.physical_offsets[0], dead_letter=item.dead
        )

    async def consumer_send_msg_back_batch(
        self, req: pymq_pb2.ConsumerSendMsgBackBatchRequest
    ) -> pymq_pb2.ConsumerSendMsgBackBatchResponse:
        """Each item as ConsumerSendMsgBack; messages bound for one queue share a write."""
        results = [pymq_pb2.ConsumerSendMsgBackResponse() for _ in req.requests]
        groups: dict[tuple[str, int], list[tuple[int, MessageToStore]]] = {}
        records = self.ctx.store.look_messages_by_offsets([one.commit_log_offset for one in req.requests])
        for i, one in enumerate(req.requests):
            try:
                item = self._prepare(one, records[i])
            except BrokerException as err:
                results[i].error, results[i].error_code = err.remark, err.code_name
                continue
            results[i].topic, results[i].dead_letter = item.topic, item.dead
            groups.setdefault((item.store_topic, item.store_queue_id), []).append((i, item.message))
        last = None
        max_bytes = self.ctx.store.config.max_message_size
        for (topic, queue_id), items in groups.items():
            for chunk in _chunks(items, max_bytes):
                put = self.ctx.store.put_messages(topic, queue_id, [m for _, m in chunk])
                if not put.ok:
                    for i, _m in chunk:
                        results[i].error = put.remark or put.status.value
                        results[i].error_code = "SYSTEM_ERROR"
                    continue
                for (i, _m), phy in zip(chunk, put.physical_offsets, strict=True):
                    results[i].commit_log_offset = phy
                last = put
        if last is not None:
            await wait_store_ok(self.ctx, last)  # a later write is durable only after earlier ones
        return pymq_pb2.ConsumerSendMsgBackBatchResponse(results=results)

    def _prepare(self, req: pymq_pb2.ConsumerSendMsgBackRequest, record: bytes | None) -> _SendBack:
        """``record`` is what the commit log holds at ``req.commit_log_offset`` (None: nothing)."""
        ctx = self.ctx
        group = req.group
        sub = ctx.subscription_group_manager.find_subscription_group_config(group)
        if req.max_reconsume_times > 0:  # set by a client: applies to the group, last wins
            ctx.subscription_group_manager.set_retry_max_times(group, req.max_reconsume_times)
        max_times = req.max_reconsume_times if req.max_reconsume_times > 0 else sub.retry_max_times
        if record is None:
            raise BrokerException(
                pymq_pb2.ILLEGAL_ARGUMENT,
                f"no message at commit log offset {req.commit_log_offset} (it may have expired); "
                "pass the commit_log_offset of a consumed message",
            )
        h = HEADER.unpack_from(record)
        total, flag, born, reconsume, body_len = h[0], h[4], h[8], h[11], h[13]
        t0, t1, p0, p1 = split_tail(record, 0, total, body_len)
        stored_topic = record[t0:t1].decode()
        props = decode_properties(record[p0:p1])
        origin_topic = props.get(MC.PROPERTY_RETRY_TOPIC) or req.origin_topic or stored_topic
        if is_retry_topic(origin_topic):
            origin_topic = req.origin_topic or origin_topic
        props[MC.PROPERTY_RETRY_TOPIC] = origin_topic
        origin_id = (
            props.get(MC.PROPERTY_ORIGIN_MESSAGE_ID)
            or req.origin_msg_id
            or props.get(MC.PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX, "")
        )
        props[MC.PROPERTY_ORIGIN_MESSAGE_ID] = origin_id
        extra = req.extra_properties
        for key in extra:  # keys then look-ups: a protobuf map's items() view is twice as slow
            props[key] = extra[key][:MAX_REASON_CHARS]
        delay_level = req.delay_level
        dead = reconsume >= max_times or delay_level < 0
        if dead:
            topic = get_dlq_topic(group)
            ctx.topic_config_manager.create_topic_of_dlq(group)
            queue_id = 0
            props[MC.PROPERTY_DLQ_ORIGIN_TOPIC] = origin_topic
            props[MC.PROPERTY_DLQ_ORIGIN_MESSAGE_ID] = origin_id
            props.pop(MC.PROPERTY_DELAY_TIME_LEVEL, None)
        else:
            topic = get_retry_topic(group)
            cfg = ctx.topic_config_manager.create_topic_of_retry(group, sub.retry_queue_nums)
            queue_id = random.randrange(cfg.write_queue_nums)
            if delay_level == 0:
                delay_level = 3 + reconsume
            props[MC.PROPERTY_DELAY_TIME_LEVEL] = str(delay_level)
        props[MC.PROPERTY_RECONSUME_TIME] = str(reconsume + 1)
        props[MC.PROPERTY_MAX_RECONSUME_TIMES] = str(max_times)
        store_topic, store_queue_id = topic, queue_id
        if not dead:  # the delay goes through SCHEDULE_TOPIC_XXXX, as the store's resolve_delay
            store_topic = SCHEDULE_TOPIC
            store_queue_id = ctx.store.schedule_properties(topic, queue_id, props, delay_level)
        body = record[80 : 80 + body_len]
        return _SendBack(
            topic, store_topic, store_queue_id,
            MessageToStore(body, flag, encode_properties(props), born, reconsume + 1), dead,
        )


def _chunks(
    items: list[tuple[int, MessageToStore]], max_bytes: int
) -> list[list[tuple[int, MessageToStore]]]:
    """Split so that each write stays within maxMessageSize (the batch rule)."""
    out: list[list[tuple[int, MessageToStore]]] = [[]]
    size = 0
    for item in items:
        n = len(item[1].body)
        if out[-1] and size + n > max_bytes:
            out.append([])
            size = 0
        out[-1].append(item)
        size += n
    return out

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

from pymq_proto.record import HEADER, MessageConst, decode_properties, encode_properties, split_tail
from pymq_proto.v1 import pymq_pb2

from ..common.broker_exception import BrokerException
from ..common.mix_all import get_dlq_topic, get_retry_topic, is_retry_topic
from ..store.commit_log import MessageToStore
from .context import BrokerContext
from .send_message_processor import wait_store_ok

MC = MessageConst
MAX_REASON_CHARS = 4000


class SendBackProcessor:
    def __init__(self, ctx: BrokerContext) -> None:
        self.ctx = ctx

    async def consumer_send_msg_back(
        self, req: pymq_pb2.ConsumerSendMsgBackRequest
    ) -> pymq_pb2.ConsumerSendMsgBackResponse:
        ctx = self.ctx
        group = req.group
        sub = ctx.subscription_group_manager.find_subscription_group_config(group)
        if req.max_reconsume_times > 0:  # set by a client: applies to the group, last wins
            ctx.subscription_group_manager.set_retry_max_times(group, req.max_reconsume_times)
        max_times = req.max_reconsume_times if req.max_reconsume_times > 0 else sub.retry_max_times
        record = ctx.store.look_message_by_offset(req.commit_log_offset)
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
        origin_topic = props.get(MC.PROPERTY_RETRY_TOPIC) or (
            req.origin_topic or stored_topic
        )
        if is_retry_topic(origin_topic):
            origin_topic = req.origin_topic or origin_topic
        props[MC.PROPERTY_RETRY_TOPIC] = origin_topic
        origin_id = (
            props.get(MC.PROPERTY_ORIGIN_MESSAGE_ID)
            or req.origin_msg_id
            or props.get(MC.PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX, "")
        )
        props[MC.PROPERTY_ORIGIN_MESSAGE_ID] = origin_id
        for key, value in req.extra_properties.items():
            props[key] = value[:MAX_REASON_CHARS]
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
        body = record[80 : 80 + body_len]
        msg = MessageToStore(body, flag, encode_properties(props), born, reconsume + 1)
        result = ctx.store.put_messages(topic, queue_id, [msg])
        await wait_store_ok(ctx, result)
        return pymq_pb2.ConsumerSendMsgBackResponse(
            topic=topic, commit_log_offset=result.physical_offsets[0], dead_letter=dead
        )

"""PullMessageProcessor: PULL_MESSAGE with long polling.

Answers with the stored records as they are (one bytes field, no per-message
objects): the broker copies, the client decodes.
"""

from __future__ import annotations

import time

from pymq_proto.v1 import pymq_pb2

from ..common.broker_exception import BrokerException
from ..store.results import GetMessageResult, GetMessageStatus
from .context import BrokerContext
from .pull_request_hold_service import PullRequestHoldService
from .subscription import parse_subscription

MAX_SUSPEND_MS = 60_000


class PullMessageProcessor:
    def __init__(self, ctx: BrokerContext, hold: PullRequestHoldService) -> None:
        self.ctx = ctx
        self.hold = hold
        ctx.delete_topic_hooks.append(hold.wake_topic)  # a held pull hears of a deletion at once

    async def pull_message(self, req: pymq_pb2.PullMessageRequest) -> pymq_pb2.PullMessageResponse:
        ctx = self.ctx
        mq = req.message_queue
        topic_id = ctx.check_mq(mq).topic_id
        if req.queue_offset < 0:
            raise BrokerException(
                pymq_pb2.ILLEGAL_ARGUMENT, f"queue offset {req.queue_offset} must be >= 0"
            )
        if req.max_msg_nums < 1:
            raise BrokerException(
                pymq_pb2.ILLEGAL_ARGUMENT, f"max messages {req.max_msg_nums} must be >= 1"
            )
        if req.max_bytes < 0:
            raise BrokerException(pymq_pb2.ILLEGAL_ARGUMENT, f"max bytes {req.max_bytes} must be >= 0")
        if not 0 <= req.suspend_timeout_ms <= MAX_SUSPEND_MS:
            raise BrokerException(
                pymq_pb2.ILLEGAL_ARGUMENT,
                f"suspend timeout {req.suspend_timeout_ms} ms is out of range 0..{MAX_SUSPEND_MS}",
            )
        if req.consumer_group:
            group = ctx.subscription_group_manager.find_subscription_group_config(req.consumer_group)
            if not group.consume_enable:  # RocketMQ's "subscription group no permission"
                raise BrokerException(
                    pymq_pb2.NO_PERMISSION,
                    f"consumer group {req.consumer_group!r} has consumption disabled (consumeEnable "
                    f"false); enable it with Admin(...).update_group(group, consume_enable=True)",
                )
        sub = parse_subscription(
            req.subscription, req.expression_type,
            enable_property_filter=ctx.broker_config.enable_property_filter,
        )
        max_nums = min(req.max_msg_nums, ctx.broker_config.max_pull_batch_size)
        deadline = time.monotonic() + req.suspend_timeout_ms / 1000.0
        while True:
            result = ctx.store.get_message(
                mq.topic, mq.queue_id, req.queue_offset, max_nums, req.max_bytes, sub.tag_hashes,
                sub.property_filter,
            )
            left = deadline - time.monotonic()
            status = _pull_status(req.queue_offset, result)
            # held only where the next message will land: a bad offset is answered at once
            if status != pymq_pb2.NO_NEW_MSG or left <= 0 or not ctx.broker_config.long_polling_enable:
                return self._response(status, result)
            await self.hold.suspend(mq.topic, mq.queue_id, req.queue_offset, left)
            now = ctx.topic_config_manager.select_topic_config(mq.topic)
            if now is None or now.topic_id != topic_id:
                # not the next topic's messages at the old topic's offset: a pull held at offset 3
                # when the topic was deleted and made again answered the new one's from 3 on
                raise BrokerException(
                    pymq_pb2.TOPIC_NOT_EXIST,
                    f"topic {mq.topic!r} was deleted while the pull waited for messages"
                    + ("" if now is None else " (and made again since)"),
                )

    def _response(
        self, status: pymq_pb2.PullStatus.ValueType, r: GetMessageResult
    ) -> pymq_pb2.PullMessageResponse:
        return pymq_pb2.PullMessageResponse(
            status=status,
            next_begin_offset=r.next_begin_offset,
            min_offset=r.min_offset,
            max_offset=r.max_offset,
            message_count=r.message_count,
            records=r.records,
            store_host=self.ctx.endpoint,
            record_sizes=r.sizes,
        )


def _pull_status(queue_offset: int, r: GetMessageResult) -> pymq_pb2.PullStatus.ValueType:
    """The store's answer as the pull's status (RocketMQ's PULL_OFFSET_MOVED is OFFSET_ILLEGAL)."""
    s = r.status
    if s == GetMessageStatus.FOUND:
        return pymq_pb2.FOUND
    if s == GetMessageStatus.NO_MATCHED_MESSAGE:
        return pymq_pb2.NO_MATCHED_MSG
    if s == GetMessageStatus.OFFSET_OVERFLOW_ONE:
        return pymq_pb2.NO_NEW_MSG
    if s == GetMessageStatus.NO_MATCHED_LOGIC_QUEUE:  # a queue never written to
        return pymq_pb2.NO_NEW_MSG if queue_offset == 0 else pymq_pb2.OFFSET_ILLEGAL
    if s == GetMessageStatus.NO_MESSAGE_IN_QUEUE:
        return pymq_pb2.NO_NEW_MSG if queue_offset == r.min_offset else pymq_pb2.OFFSET_ILLEGAL
    return pymq_pb2.OFFSET_ILLEGAL  # OFFSET_TOO_SMALL, OFFSET_OVERFLOW_BADLY

"""PullOffsetProcessor: apache.rocketmq.v2's PullMessage, UpdateOffset, GetOffset and QueryOffset.

RocketMQ 5's proxy leaves these four UNIMPLEMENTED; they are the pull
consumer's RPCs (the client keeps its offsets), and pymq's broker has the
pieces: the consume queues for a pull by offset, ConsumerOffsetManager for a
group's committed offsets, the store's queue bounds and time index. A v2
client can read a queue from any offset, commit its progress where pymq's
tools show it, and look up where to start, as a pymq ``PullConsumer`` does.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

from pymq_proto.rocketmq_v2 import definition_pb2 as v2
from pymq_proto.rocketmq_v2 import service_pb2 as sv

from ..common.perm import is_readable
from ..processor.context import BrokerContext
from ..processor.pull_request_hold_service import PullRequestHoldService
from ..store.results import GetMessageStatus
from .message_converter import split_records, timestamp_ms, to_v2_message
from .messaging_processor import MessagingProcessor, parse_filter
from .status import ProxyException, status

MAX_PULL_BATCH_SIZE = 1024
_EMPTY = (GetMessageStatus.OFFSET_OVERFLOW_ONE, GetMessageStatus.NO_MESSAGE_IN_QUEUE,
          GetMessageStatus.NO_MATCHED_LOGIC_QUEUE)


class PullOffsetProcessor:
    """The pull consumer's four RPCs on the store and the ConsumerOffsetManager."""

    def __init__(
        self, ctx: BrokerContext, hold: PullRequestHoldService, messaging: MessagingProcessor
    ) -> None:
        self.ctx = ctx
        self.hold = hold
        self.messaging = messaging

    def _queue(self, mq: v2.MessageQueue) -> tuple[str, int]:
        """(topic, queue id) of a readable queue; TOPIC_NOT_FOUND, FORBIDDEN or BAD_REQUEST otherwise."""
        cfg = self.messaging.topic_config(mq.topic)
        if not is_readable(cfg.perm):
            raise ProxyException(v2.FORBIDDEN, f"topic {cfg.topic_name!r} is not readable")
        if not 0 <= mq.id < cfg.read_queue_nums:
            raise ProxyException(
                v2.BAD_REQUEST,
                f"queue id {mq.id} is out of range for topic {cfg.topic_name!r}: it has "
                f"{cfg.read_queue_nums} read queues (0..{cfg.read_queue_nums - 1})",
            )
        return cfg.topic_name, mq.id

    def get_offset(self, req: sv.GetOffsetRequest) -> sv.GetOffsetResponse:
        """The group's committed offset of the queue; OFFSET_NOT_FOUND if it never committed one."""
        group = self.messaging.group_name(req.group)
        topic, queue_id = self._queue(req.message_queue)
        offset = self.ctx.consumer_offset_manager.query_offset(group, topic, queue_id)
        if offset < 0:
            raise ProxyException(
                v2.OFFSET_NOT_FOUND, f"group {group!r} has no offset for {topic}#{queue_id}"
            )
        return sv.GetOffsetResponse(status=status(), offset=offset)

    def update_offset(self, req: sv.UpdateOffsetRequest) -> sv.UpdateOffsetResponse:
        """Commit the group's progress (the next offset to consume), as UPDATE_CONSUMER_OFFSET."""
        group = self.messaging.group_name(req.group)
        topic, queue_id = self._queue(req.message_queue)
        if req.offset < 0:
            raise ProxyException(v2.ILLEGAL_OFFSET, f"offset {req.offset} must be >= 0")
        self.ctx.consumer_offset_manager.commit_offset(group, topic, queue_id, req.offset)
        return sv.UpdateOffsetResponse(status=status())

    def query_offset(self, req: sv.QueryOffsetRequest) -> sv.QueryOffsetResponse:
        """The queue's first or next offset, or the first stored at or after a time."""
        topic, queue_id = self._queue(req.message_queue)
        store = self.ctx.store
        policy = req.query_offset_policy
        if policy == v2.BEGINNING:
            offset = store.get_min_offset_in_queue(topic, queue_id)
        elif policy == v2.END:
            offset = store.get_max_offset_in_queue(topic, queue_id)
        elif policy == v2.TIMESTAMP:
            if not req.HasField("timestamp"):
                raise ProxyException(v2.BAD_REQUEST, "query offset policy TIMESTAMP needs a timestamp")
            offset = store.get_offset_in_queue_by_time(topic, queue_id, timestamp_ms(req.timestamp))
        else:
            raise ProxyException(v2.BAD_REQUEST, f"query offset policy {policy} is unknown")
        return sv.QueryOffsetResponse(status=status(), offset=offset)

    async def pull_message(self, req: sv.PullMessageRequest) -> AsyncIterator[sv.PullMessageResponse]:
        """Up to ``batch_size`` messages from ``offset`` on, then the next offset; long polling when none.

        The answer: a status (OK, MESSAGE_NOT_FOUND, or ILLEGAL_OFFSET for an
        offset outside the queue, with the offset to go on from), the messages,
        and ``next_offset``.
        """
        self.messaging.group_name(req.group)
        topic, queue_id = self._queue(req.message_queue)
        if req.offset < 0:
            raise ProxyException(v2.ILLEGAL_OFFSET, f"offset {req.offset} must be >= 0")
        if not 1 <= req.batch_size <= MAX_PULL_BATCH_SIZE:
            raise ProxyException(
                v2.BAD_REQUEST, f"batch size {req.batch_size} is out of range 1..{MAX_PULL_BATCH_SIZE}"
            )
        tag_hashes, tags, prop_filter = parse_filter(
            req.filter_expression, enable_property_filter=self.ctx.broker_config.enable_property_filter
        )
        polling_s = max(req.long_polling_timeout.ToMilliseconds(), 0) / 1000.0
        polling_s = min(polling_s, self.messaging.config.max_long_polling_timeout_mills / 1000.0)
        deadline = time.monotonic() + polling_s
        store = self.ctx.store
        while True:
            result = store.get_message(
                topic, queue_id, req.offset, req.batch_size, 0, tag_hashes, prop_filter
            )
            left = deadline - time.monotonic()
            if result.status not in _EMPTY or left <= 0 or req.offset < result.min_offset:
                break
            await self.hold.suspend(topic, queue_id, req.offset, left)
        s = result.status
        if s in (GetMessageStatus.FOUND, GetMessageStatus.NO_MATCHED_MESSAGE):
            messages = [m for m in split_records(result.records) if tags is None or m.tag in tags]
            yield sv.PullMessageResponse(
                status=status() if messages else status(v2.MESSAGE_NOT_FOUND, "no matched message")
            )
            for m in messages:
                yield sv.PullMessageResponse(message=to_v2_message(m))
        elif s in _EMPTY and result.min_offset <= req.offset <= result.max_offset:
            yield sv.PullMessageResponse(status=status(v2.MESSAGE_NOT_FOUND, "no new message"))
        else:  # OFFSET_TOO_SMALL, OFFSET_OVERFLOW_BADLY, or a queue that starts later
            yield sv.PullMessageResponse(status=status(
                v2.ILLEGAL_OFFSET,
                f"offset {req.offset} is outside {topic}#{queue_id} [{result.min_offset}, "
                f"{result.max_offset}]; go on from {result.next_begin_offset}",
            ))
        yield sv.PullMessageResponse(next_offset=result.next_begin_offset)

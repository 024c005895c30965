"""Consumer progress and offset queries: QUERY_CONSUMER_OFFSET, UPDATE_CONSUMER_OFFSET,
GET_MIN_OFFSET / GET_MAX_OFFSET / SEARCH_OFFSET_BY_TIMESTAMP; and HEART_BEAT, where a
consumer registers, and CHECK_CLIENT_CONFIG (ClientManageProcessor in RocketMQ)."""

from __future__ import annotations

from pymq_proto.v1 import pymq_pb2

from ..common.broker_exception import BrokerException
from ..common.mix_all import group_name_problem
from .context import BrokerContext
from .subscription import parse_subscription


class ConsumerManageProcessor:
    def __init__(self, ctx: BrokerContext) -> None:
        self.ctx = ctx

    def _group(self, group: str) -> str:
        problem = group_name_problem(group)
        if problem:
            raise BrokerException(pymq_pb2.ILLEGAL_ARGUMENT, problem)
        return group

    def get_offset(self, req: pymq_pb2.GetOffsetRequest) -> pymq_pb2.GetOffsetResponse:
        """QUERY_CONSUMER_OFFSET: the group's progress, or -1 (RocketMQ's QUERY_NOT_FOUND).

        As RocketMQ, a group that never committed on the queue reads 0 when
        ``set_zero_if_not_found`` is unset or true, the queue still starts at offset 0
        and its first message is in the store's memory.
        """
        group = self._group(req.consumer_group)
        mq = req.message_queue
        self.ctx.check_mq(mq)
        offset = self.ctx.consumer_offset_manager.query_offset(group, mq.topic, mq.queue_id)
        if offset < 0 and self._zero_if_not_found(req):
            store = self.ctx.store
            if (store.get_min_offset_in_queue(mq.topic, mq.queue_id) <= 0
                    and store.check_in_mem_by_consume_offset(mq.topic, mq.queue_id, 0)):
                offset = 0
        return pymq_pb2.GetOffsetResponse(offset=offset)

    @staticmethod
    def _zero_if_not_found(req: pymq_pb2.GetOffsetRequest) -> bool:
        """RocketMQ's nullable setZeroIfNotFound: only an explicit false turns it off."""
        return not req.HasField("set_zero_if_not_found") or req.set_zero_if_not_found

    def update_offset(self, req: pymq_pb2.UpdateOffsetRequest) -> pymq_pb2.UpdateOffsetResponse:
        """UPDATE_CONSUMER_OFFSET. As RocketMQ, offsets are not checked against the queue's
        bounds: a commit beyond the max offset is stored and read back as it is."""
        group = self._group(req.consumer_group)
        checked = []
        for item in req.offsets:  # validate all before changing any
            mq = item.message_queue
            self.ctx.check_mq(mq)
            if item.offset < 0:
                raise BrokerException(
                    pymq_pb2.ILLEGAL_ARGUMENT,
                    f"offset {item.offset} for {mq.topic}#{mq.queue_id} must be >= 0 (the next "
                    "offset to consume)",
                )
            checked.append((mq.topic, mq.queue_id, item.offset))
        for topic, qid, offset in checked:
            self.ctx.consumer_offset_manager.commit_offset(group, topic, qid, offset)
        return pymq_pb2.UpdateOffsetResponse()

    def heart_beat(self, req: pymq_pb2.HeartbeatRequest) -> pymq_pb2.HeartbeatResponse:
        """HEART_BEAT: a consumer registers. As RocketMQ, the group (created with defaults
        on first use) gets its %RETRY%<group> topic now, not at its first send back."""
        group = self._group(req.consumer_group)
        sub = self.ctx.subscription_group_manager.find_subscription_group_config(group)
        # nothing is stored in it yet: its config is written by the periodic task (or by the first
        # send back, before it stores)
        self.ctx.topic_config_manager.create_topic_of_retry(group, sub.retry_queue_nums)
        return pymq_pb2.HeartbeatResponse()

    def check_client_config(
        self, req: pymq_pb2.CheckClientConfigRequest
    ) -> pymq_pb2.CheckClientConfigResponse:
        """CHECK_CLIENT_CONFIG: refuse, as a pull would, a subscription this broker cannot
        serve (SQL92 while enablePropertyFilter is off, an expression that does not parse)."""
        self._group(req.consumer_group)
        parse_subscription(
            req.subscription, req.expression_type,
            enable_property_filter=self.ctx.broker_config.enable_property_filter,
        )
        return pymq_pb2.CheckClientConfigResponse()

    def query_offset(self, req: pymq_pb2.QueryOffsetRequest) -> pymq_pb2.QueryOffsetResponse:
        mq = req.message_queue
        self.ctx.check_mq(mq)
        store = self.ctx.store
        if req.type == pymq_pb2.BEGINNING:
            offset = store.get_min_offset_in_queue(mq.topic, mq.queue_id)
        elif req.type == pymq_pb2.END:
            offset = store.get_max_offset_in_queue(mq.topic, mq.queue_id)
        else:
            if req.timestamp < 0:
                raise BrokerException(
                    pymq_pb2.ILLEGAL_ARGUMENT, f"timestamp {req.timestamp} must be >= 0 (ms)"
                )
            offset = store.get_offset_in_queue_by_time(mq.topic, mq.queue_id, req.timestamp)
        return pymq_pb2.QueryOffsetResponse(offset=offset)

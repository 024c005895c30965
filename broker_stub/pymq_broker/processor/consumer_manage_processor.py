"""Consumer progress and offset queries: QUERY_CONSUMER_OFFSET, UPDATE_CONSUMER_OFFSET,
GET_MIN_OFFSET / GET_MAX_OFFSET / SEARCH_OFFSET_BY_TIMESTAMP."""

from __future__ import annotations

from pymq_proto.v1 import pymq_pb2

from ..common.broker_exception import BrokerException
from ..common.mix_all import group_name_problem
from .context import BrokerContext


class ConsumerManageProcessor:
    def __init__(self, ctx: BrokerContext) -> None:
        self.ctx = ctx

    def _group(self, group: str) -> str:
        problem = group_name_problem(group)
        if problem:
            raise BrokerException(pymq_pb2.ILLEGAL_ARGUMENT, problem)
        return group

    def get_offset(self, req: pymq_pb2.GetOffsetRequest) -> pymq_pb2.GetOffsetResponse:
        group = self._group(req.consumer_group)
        mq = req.message_queue
        self.ctx.check_mq(mq)
        offset = self.ctx.consumer_offset_manager.query_offset(group, mq.topic, mq.queue_id)
        return pymq_pb2.GetOffsetResponse(offset=offset)

    def update_offset(self, req: pymq_pb2.UpdateOffsetRequest) -> pymq_pb2.UpdateOffsetResponse:
        group = self._group(req.consumer_group)
        store = self.ctx.store
        checked = []
        for item in req.offsets:  # validate all before changing any
            mq = item.message_queue
            self.ctx.check_mq(mq)
            max_offset = store.get_max_offset_in_queue(mq.topic, mq.queue_id)
            if not 0 <= item.offset <= max_offset:
                raise BrokerException(
                    pymq_pb2.ILLEGAL_ARGUMENT,
                    f"offset {item.offset} for {mq.topic}#{mq.queue_id} is out of range "
                    f"0..{max_offset} (the queue's max offset)",
                )
            checked.append((mq.topic, mq.queue_id, item.offset))
        for topic, qid, offset in checked:
            self.ctx.consumer_offset_manager.commit_offset(group, topic, qid, offset)
        return pymq_pb2.UpdateOffsetResponse()

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

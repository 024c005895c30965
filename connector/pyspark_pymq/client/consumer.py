"""The pull consumer: read MessageQueues by offset and keep the group's progress."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pymq_proto.v1 import pymq_pb2

from .codec import decode_records
from .message import MessageQueue, PullResult, PullStatus
from .route import RouteCache
from .transport import BrokerClient

__all__ = ["DEFAULT_PULL_BATCH_SIZE", "PullConsumer"]

DEFAULT_PULL_BATCH_SIZE = 32
_PULL_STATUS = {
    pymq_pb2.FOUND: PullStatus.FOUND,
    pymq_pb2.NO_NEW_MSG: PullStatus.NO_NEW_MSG,
    pymq_pb2.NO_MATCHED_MSG: PullStatus.NO_MATCHED_MSG,
    pymq_pb2.OFFSET_ILLEGAL: PullStatus.OFFSET_ILLEGAL,
}


def mq_proto(mq: MessageQueue) -> pymq_pb2.MessageQueue:
    return pymq_pb2.MessageQueue(topic=mq.topic, broker_name=mq.broker_name, queue_id=mq.queue_id)


class PullConsumer:
    """Pulls messages by (MessageQueue, offset) for a consumer group.

    The caller owns the offsets (as Spark's checkpoint does) and tells the
    broker the group's progress with :meth:`commit`, so that lag shows on the
    broker and in ``Admin.group_progress``.

    Args:
        endpoint: ``host:port`` of a broker.
        group: the consumer group.
        timeout_ms: per request (long-polling pulls add their suspend time).

    Example::

        consumer = PullConsumer("127.0.0.1:8081", "analytics")
        for mq in consumer.queues("orders"):
            result = consumer.pull(mq, consumer.committed(mq) if consumer.committed(mq) >= 0 else 0)
            for msg in result.messages:
                print(msg.queue_offset, msg.body)
            consumer.commit(mq, result.next_begin_offset)
    """

    def __init__(self, endpoint: str, group: str, *, timeout_ms: int = 10_000) -> None:
        if not isinstance(group, str) or not group:
            raise ValueError(f"consumer group must be a non-empty string, got {group!r}")
        self.group = group
        self._client = BrokerClient(endpoint, timeout_ms / 1000.0)
        self._routes = RouteCache(self._client)

    @property
    def endpoint(self) -> str:
        return self._client.endpoint

    def queues(self, topic: str) -> list[MessageQueue]:
        """The readable MessageQueues of ``topic`` (TopicNotExistError if none)."""
        return list(self._routes.get(topic, refresh=True).subscribe_queues)

    def _broker(self, mq: MessageQueue) -> BrokerClient:
        return self._routes.client(mq.topic, mq.broker_name)

    def pull_raw(
        self,
        mq: MessageQueue,
        offset: int,
        max_nums: int = DEFAULT_PULL_BATCH_SIZE,
        *,
        subscription: str = "*",
        expression_type: str = "TAG",
        max_bytes: int = 0,
        suspend_timeout_ms: int = 0,
    ) -> Any:
        """The broker's PullMessageResponse, records undecoded (for columnar decoders)."""
        if not isinstance(offset, int) or offset < 0:
            raise ValueError(f"pull offset must be an int >= 0, got {offset!r}")
        if not isinstance(max_nums, int) or max_nums < 1:
            raise ValueError(f"max_nums must be an int >= 1, got {max_nums!r}")
        req = pymq_pb2.PullMessageRequest(
            consumer_group=self.group,
            message_queue=mq_proto(mq),
            queue_offset=offset,
            max_msg_nums=max_nums,
            max_bytes=max_bytes,
            subscription=subscription,
            expression_type=expression_type,
            suspend_timeout_ms=suspend_timeout_ms,
        )
        client = self._broker(mq)
        return client.call("PullMessage", req, client.timeout + suspend_timeout_ms / 1000.0)

    def pull(
        self,
        mq: MessageQueue,
        offset: int,
        max_nums: int = DEFAULT_PULL_BATCH_SIZE,
        *,
        subscription: str = "*",
        expression_type: str = "TAG",
        max_bytes: int = 0,
        suspend_timeout_ms: int = 0,
    ) -> PullResult:
        """Up to ``max_nums`` messages of ``mq`` from ``offset`` on.

        ``subscription`` is a tag expression (``"*"`` or ``"TagA || TagB"``).
        With ``suspend_timeout_ms`` > 0 a pull that finds nothing new waits
        (long polling) and returns as soon as a message arrives.
        """
        resp = self.pull_raw(
            mq,
            offset,
            max_nums,
            subscription=subscription,
            expression_type=expression_type,
            max_bytes=max_bytes,
            suspend_timeout_ms=suspend_timeout_ms,
        )
        return PullResult(
            status=_PULL_STATUS[resp.status],
            messages=decode_records(resp.records, mq.broker_name) if resp.records else [],
            next_begin_offset=resp.next_begin_offset,
            min_offset=resp.min_offset,
            max_offset=resp.max_offset,
        )

    def commit(self, mq: MessageQueue, offset: int) -> None:
        """Record the group's progress on ``mq``: the next offset to consume."""
        self.commit_offsets({mq: offset})

    def commit_offsets(self, offsets: Mapping[MessageQueue, int]) -> None:
        """Record the group's progress on several queues (one request per broker)."""
        by_broker: dict[str, list[pymq_pb2.QueueOffset]] = {}
        for mq, offset in offsets.items():
            if not isinstance(offset, int) or offset < 0:
                raise ValueError(f"offset for {mq} must be an int >= 0, got {offset!r}")
            by_broker.setdefault(mq.broker_name, []).append(
                pymq_pb2.QueueOffset(message_queue=mq_proto(mq), offset=offset)
            )
        for broker, items in by_broker.items():
            client = self._routes.client(items[0].message_queue.topic, broker)
            client.call(
                "UpdateOffset",
                pymq_pb2.UpdateOffsetRequest(consumer_group=self.group, offsets=items),
            )

    def committed(self, mq: MessageQueue) -> int:
        """The group's progress on ``mq``, or -1 when it has none."""
        resp = self._broker(mq).call(
            "GetOffset", pymq_pb2.GetOffsetRequest(consumer_group=self.group, message_queue=mq_proto(mq))
        )
        return int(resp.offset)

    def _query_offset(
        self, mq: MessageQueue, kind: pymq_pb2.OffsetQueryType.ValueType, timestamp: int = 0
    ) -> int:
        resp = self._broker(mq).call(
            "QueryOffset",
            pymq_pb2.QueryOffsetRequest(message_queue=mq_proto(mq), type=kind, timestamp=timestamp),
        )
        return int(resp.offset)

    def min_offset(self, mq: MessageQueue) -> int:
        return self._query_offset(mq, pymq_pb2.BEGINNING)

    def max_offset(self, mq: MessageQueue) -> int:
        """One past the last message of ``mq`` (where the next message will go)."""
        return self._query_offset(mq, pymq_pb2.END)

    def search_offset(self, mq: MessageQueue, timestamp_ms: int) -> int:
        """The first offset whose store time is >= ``timestamp_ms`` (max offset if none)."""
        return self._query_offset(mq, pymq_pb2.TIMESTAMP, timestamp_ms)

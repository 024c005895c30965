"""The pull consumer: read MessageQueues by offset and keep the group's progress."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import grpc
from pymq_proto.record import MessageConst, encode_properties
from pymq_proto.v1 import pymq_pb2

from ..errors import PymqError
from .codec import decode_records
from .message import MessageExt, MessageQueue, PullResult, PullStatus
from .route import RouteCache
from .transport import BrokerClient

__all__ = ["DEFAULT_PULL_BATCH_SIZE", "PullConsumer", "SendBackResult", "retry_topic"]

RETRY_GROUP_TOPIC_PREFIX = "%RETRY%"
DLQ_GROUP_TOPIC_PREFIX = "%DLQ%"
MC = MessageConst


def retry_topic(group: str) -> str:
    """The group's retry topic, %RETRY%<group>."""
    return RETRY_GROUP_TOPIC_PREFIX + group


def dlq_topic(group: str) -> str:
    """The group's dead-letter topic, %DLQ%<group>."""
    return DLQ_GROUP_TOPIC_PREFIX + group


@dataclass(frozen=True, slots=True)
class SendBackResult:
    """Where a sent-back message went: %RETRY%<group> or, past its retries, %DLQ%<group>."""

    topic: str
    dead_letter: bool
    fallback: bool  # True when the send back failed and a direct send to %RETRY% was made

DEFAULT_PULL_BATCH_SIZE = 32
SEND_BACK_RPC_ITEMS = 250  # send_back_batch: messages per request (requests overlap)
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

    def retry_queues(self) -> list[MessageQueue]:
        """The queues of this group's %RETRY% topic (created on first ask)."""
        return self.queues(retry_topic(self.group))

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

    def send_back(
        self,
        message: MessageExt,
        delay_level: int = 0,
        max_reconsume_times: int | None = None,
        reason: str | Mapping[str, str] | None = None,
    ) -> SendBackResult:
        """Return a message this group failed to consume (RocketMQ's sendMessageBack).

        The broker stores a new message in %RETRY%<group> that comes back after
        ``delay_level`` (0: level 3 + reconsume times, i.e. 10s, 30s, 1m...), or in
        %DLQ%<group> once it was retried ``max_reconsume_times`` times (default:
        the group's setting, 16) or when ``delay_level`` < 0. ``reason`` (a string
        or a dict of strings) is kept in the message's properties, so a dead
        letter says why it died.

        If the send back fails, the message is sent to %RETRY%<group> directly
        (RocketMQ's fallback); if that fails too, the error is raised so that the
        caller consumes the message again later.
        """
        if not isinstance(message, MessageExt):
            raise TypeError(f"send_back takes a received MessageExt, got {type(message).__name__}")
        _check_max_times(max_reconsume_times)
        extra = _reason_properties(reason)
        req = pymq_pb2.ConsumerSendMsgBackRequest(
            **self._send_back_fields(message, delay_level, max_reconsume_times, extra)
        )
        client = self._routes.client(message.topic, message.broker_name)
        try:
            resp = client.call("ConsumerSendMsgBack", req)
            return SendBackResult(resp.topic, resp.dead_letter, False)
        except PymqError:
            pass
        return self._send_back_directly(message, delay_level, max_reconsume_times, extra)

    def send_back_batch(
        self,
        messages: Sequence[MessageExt],
        delay_level: int = 0,
        max_reconsume_times: int | None = None,
        reasons: Sequence[str | Mapping[str, str] | None] | None = None,
    ) -> list[SendBackResult]:
        """:meth:`send_back` for many messages in one request per broker.

        Same rules and fallback, item by item: a message the broker cannot send
        back is sent to %RETRY%<group> directly. ``reasons`` lines up with
        ``messages``.
        """
        if reasons is not None and len(reasons) != len(messages):
            raise ValueError(
                f"reasons has {len(reasons)} items for {len(messages)} messages; give one per message"
            )
        _check_max_times(max_reconsume_times)
        extras = [_reason_properties(reasons[i] if reasons else None) for i in range(len(messages))]
        results: list[SendBackResult | None] = [None] * len(messages)
        by_broker: dict[str, list[int]] = {}
        for i, m in enumerate(messages):
            if not isinstance(m, MessageExt):
                raise TypeError(f"send_back_batch takes MessageExt items, got {type(m).__name__} at {i}")
            by_broker.setdefault(m.broker_name, []).append(i)
        calls = []
        for broker, idx in by_broker.items():
            client = self._routes.client(messages[idx[0]].topic, broker)
            # several requests in flight: the broker works on one while the next is built
            for start in range(0, len(idx), SEND_BACK_RPC_ITEMS):
                part = idx[start : start + SEND_BACK_RPC_ITEMS]
                req = pymq_pb2.ConsumerSendMsgBackBatchRequest()
                add = req.requests.add  # in place: a list of requests would be copied again
                for i in part:
                    add(**self._send_back_fields(messages[i], delay_level, max_reconsume_times, extras[i]))
                calls.append((part, client.call_future("ConsumerSendMsgBackBatch", req)))
        for part, call in calls:
            try:
                answers = list(call.result().results)
            except grpc.RpcError:  # each item falls back to a direct send below
                answers = [None] * len(part)
            for i, answer in zip(part, answers, strict=True):
                if answer is not None and not answer.error:
                    results[i] = SendBackResult(answer.topic, answer.dead_letter, False)
        for i, r in enumerate(results):
            if r is None:
                results[i] = self._send_back_directly(
                    messages[i], delay_level, max_reconsume_times, extras[i]
                )
        return [r for r in results if r is not None]

    def _send_back_fields(
        self, message: MessageExt, delay_level: int, max_times: int | None, extra: dict[str, str]
    ) -> dict[str, Any]:
        """The fields of a ConsumerSendMsgBackRequest."""
        return {
            "group": self.group,
            "commit_log_offset": message.commit_log_offset,
            "delay_level": delay_level,
            "origin_msg_id": message.msg_id,
            "origin_topic": message.retry_topic or message.topic,
            "max_reconsume_times": max_times or 0,
            "extra_properties": extra,
        }

    def _send_back_directly(
        self, message: MessageExt, delay_level: int, max_times: int | None, extra: dict[str, str]
    ) -> SendBackResult:
        props = dict(message.properties)
        props.update(extra)
        props[MC.PROPERTY_RETRY_TOPIC] = message.retry_topic or message.topic
        props.setdefault(MC.PROPERTY_ORIGIN_MESSAGE_ID, message.msg_id)
        props[MC.PROPERTY_RECONSUME_TIME] = str(message.reconsume_times + 1)
        if max_times is not None:
            props[MC.PROPERTY_MAX_RECONSUME_TIMES] = str(max_times)
        props[MC.PROPERTY_DELAY_TIME_LEVEL] = str(
            delay_level if delay_level > 0 else 3 + message.reconsume_times
        )
        topic = retry_topic(self.group)
        req = pymq_pb2.SendMessageRequest(
            topic=topic,
            queue_id=-1,
            born_timestamp=int(time.time() * 1000),
            messages=[pymq_pb2.MessageData(
                body=message.body, flag=message.flag, properties=encode_properties(props)
            )],
            reconsume_times=message.reconsume_times + 1,
        )
        self._routes.client(topic, message.broker_name).call("SendMessage", req)
        return SendBackResult(topic, False, True)


def _check_max_times(max_times: int | None) -> None:
    if max_times is not None and (not isinstance(max_times, int) or max_times < 1):
        raise ValueError(f"max_reconsume_times must be an int >= 1, got {max_times!r}")


def _reason_properties(reason: str | Mapping[str, str] | None) -> dict[str, str]:
    if reason is None:
        return {}
    if isinstance(reason, str):
        return {MC.PROPERTY_CONSUME_FAILURE_REASON: reason}
    out = {}
    for k, v in reason.items():
        if not isinstance(k, str) or not isinstance(v, str):
            raise TypeError(f"reason must map str to str, got {k!r}: {v!r}")
        out[k] = v
    return out

"""The pull consumer: read MessageQueues by offset and keep the group's progress."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import grpc
from pymq_proto.record import MessageConst, encode_properties
from pymq_proto.v1 import pymq_pb2

from ..errors import PymqError
from .codec import decode_records
from .message import MessageExt, MessageQueue, PullResult, PullStatus
from .route import RouteCache
from .transport import BrokerClient

__all__ = ["DEFAULT_PULL_BATCH_SIZE", "PullConsumer", "SendBackColumns", "SendBackResult", "retry_topic"]

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



@dataclass(frozen=True, slots=True)
class SendBackColumns:
    """Messages of one broker to send back, as columns: item i is the i-th value of each.

    What :meth:`PullConsumer.send_back_batch` builds from MessageExt, and what the
    Spark sink builds from a batch's Arrow columns without a MessageExt per row.

    Attributes:
        broker_name: the broker that stores the messages.
        commit_log_offsets: each consumed message's ``commit_log_offset``.
        delay_levels: one per message (0: level 3 + reconsume times; < 0: the DLQ).
        origin_msg_ids, origin_topics: each message's ``msg_id`` and original topic,
            or empty (the broker takes them from the stored message).
        properties: set on every message (e.g. the query and batch that failed).
        property_columns: a property name to one value per message, e.g. each
            failure reason; "" leaves that message without it.
    """

    broker_name: str
    commit_log_offsets: Sequence[int]
    delay_levels: Sequence[int]
    origin_msg_ids: Sequence[str] = ()
    origin_topics: Sequence[str] = ()
    properties: Mapping[str, str] = field(default_factory=dict)
    property_columns: Mapping[str, Sequence[str]] = field(default_factory=dict)

    def check(self) -> None:
        """ValueError naming the column whose length or property names are wrong."""
        n = len(self.commit_log_offsets)
        lengths = {"delay_levels": len(self.delay_levels), "origin_msg_ids": len(self.origin_msg_ids) or n,
                   "origin_topics": len(self.origin_topics) or n,
                   **{f"property_columns[{k!r}]": len(v) for k, v in self.property_columns.items()}}
        for name, count in lengths.items():
            if count != n:
                raise ValueError(
                    f"{name} has {count} values for {n} commit_log_offsets; give one per message"
                )
        for name in [*self.properties, *self.property_columns]:
            check_property_name(name)

    def extra_properties(self, i: int) -> dict[str, str]:
        """Item ``i``'s extra properties: the shared ones and its non-empty column values."""
        own = {k: v[i] for k, v in self.property_columns.items() if v[i]}
        return {**self.properties, **own}


DEFAULT_PULL_BATCH_SIZE = 32
SEND_BACK_RPC_ITEMS = 1000  # send back: messages per request (the requests of a call overlap)
_SEPARATORS = str.maketrans({"\x01": "\ufffd", "\x02": "\ufffd"})


def check_property_name(name: object) -> None:
    """ValueError/TypeError unless ``name`` can be an extra property of a message sent back."""
    if not isinstance(name, str):
        raise TypeError(f"a reason's property names must be str, got {name!r}")
    if not name or "\x01" in name or "\x02" in name or name in MC.SEND_BACK_PROPERTIES:
        raise ValueError(
            f"property name {name!r} cannot be a reason: names must be non-empty, without \\x01 or "
            f"\\x02, and not one the send back sets ({', '.join(sorted(MC.SEND_BACK_PROPERTIES))})"
        )


def clean_property_value(value: str) -> str:
    """``value`` with the property separators \\x01 and \\x02 replaced (U+FFFD): free text is kept."""
    return value.translate(_SEPARATORS) if "\x01" in value or "\x02" in value else value
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
        return self.send_back_batch([message], delay_level, max_reconsume_times, [reason])[0]

    def send_back_batch(
        self,
        messages: Sequence[MessageExt],
        delay_level: int = 0,
        max_reconsume_times: int | None = None,
        reasons: Sequence[str | Mapping[str, str] | None] | None = None,
    ) -> list[SendBackResult]:
        """:meth:`send_back` for many messages in few requests.

        Same rules and fallback, item by item: a message the broker cannot send
        back is sent to %RETRY%<group> directly. ``reasons`` lines up with
        ``messages``.
        """
        if reasons is not None and len(reasons) != len(messages):
            raise ValueError(
                f"reasons has {len(reasons)} items for {len(messages)} messages; give one per message"
            )
        by_broker: dict[str, list[int]] = {}
        for i, m in enumerate(messages):
            if not isinstance(m, MessageExt):
                raise TypeError(
                    f"send_back_batch takes received MessageExt items, got {type(m).__name__} at {i}"
                )
            by_broker.setdefault(m.broker_name, []).append(i)
        extras = [_reason_properties(reasons[i] if reasons else None) for i in range(len(messages))]
        names = list(dict.fromkeys(k for extra in extras for k in extra))
        results: list[SendBackResult | None] = [None] * len(messages)
        for broker, idx in by_broker.items():
            columns = SendBackColumns(
                broker,
                [messages[i].commit_log_offset for i in idx],
                [delay_level] * len(idx),
                [messages[i].msg_id for i in idx],
                [messages[i].retry_topic or messages[i].topic for i in idx],
                property_columns={k: [extras[i].get(k, "") for i in idx] for k in names},
            )
            done = self.send_back_columns(columns, _pick(messages, idx), max_reconsume_times)
            for i, r in zip(idx, done, strict=True):
                results[i] = r
        return [r for r in results if r is not None]

    def send_back_columns(
        self,
        columns: SendBackColumns,
        messages: Callable[[Sequence[int]], Sequence[MessageExt]],
        max_reconsume_times: int | None = None,
    ) -> list[SendBackResult]:
        """:meth:`send_back_batch` for messages given as columns (the Spark sink's way).

        ``messages(indexes)`` returns the MessageExt of those items: it is called
        only for the fallback, the direct send of items the broker could not send
        back. Requests of SEND_BACK_RPC_ITEMS go out together, so that the
        broker works on one while the next is on its way.
        """
        _check_max_times(max_reconsume_times)
        columns.check()
        n = len(columns.commit_log_offsets)
        # the route of a topic the messages came from (asking for %RETRY%'s would create it)
        route_topic = columns.origin_topics[0] if columns.origin_topics else retry_topic(self.group)
        client = self._routes.client(route_topic, columns.broker_name)
        parts = []
        for a in range(0, n, SEND_BACK_RPC_ITEMS):
            b = min(a + SEND_BACK_RPC_ITEMS, n)
            req = pymq_pb2.ConsumerSendMsgBackBatchRequest(
                group=self.group,
                max_reconsume_times=max_reconsume_times or 0,
                commit_log_offsets=columns.commit_log_offsets[a:b],
                delay_levels=columns.delay_levels[a:b],
                origin_msg_ids=columns.origin_msg_ids[a:b],
                origin_topics=columns.origin_topics[a:b],
                extra_properties=columns.properties,
                property_columns=[
                    pymq_pb2.PropertyColumn(name=k, values=v[a:b])
                    for k, v in columns.property_columns.items()
                ],
            )
            parts.append((a, b, req))
        results: list[SendBackResult | None] = [None] * n
        retry, dlq = retry_topic(self.group), dlq_topic(self.group)
        for a, b, resp in _answers(client, "ConsumerSendMsgBackBatch", parts):
            if resp is None:  # each item falls back to a direct send below
                continue
            for i, dead, error in zip(range(a, b), resp.dead_letters, resp.errors, strict=True):
                if not error:
                    results[i] = SendBackResult(dlq if dead else retry, dead, False)
        failed = [i for i, r in enumerate(results) if r is None]
        if failed:
            for i, message in zip(failed, messages(failed), strict=True):
                results[i] = self._send_back_directly(
                    message, columns.delay_levels[i], max_reconsume_times, columns.extra_properties(i)
                )
        return [r for r in results if r is not None]

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


def _answers(
    client: BrokerClient, method: str, parts: list[tuple[int, int, Any]]
) -> list[tuple[int, int, Any]]:
    """Each part's response, or None where the call failed.

    Several requests go out together (the broker works on one while the next
    arrives); a single one is a blocking call, as a future's thread hand-off
    would add half a millisecond to it.
    """
    if len(parts) == 1:
        a, b, req = parts[0]
        try:
            return [(a, b, client.call(method, req))]
        except PymqError:
            return [(a, b, None)]
    calls = [(a, b, client.call_future(method, req)) for a, b, req in parts]
    out = []
    for a, b, call in calls:
        try:
            out.append((a, b, call.result()))
        except grpc.RpcError:
            out.append((a, b, None))
    return out


def _pick(
    messages: Sequence[MessageExt], idx: list[int]
) -> Callable[[Sequence[int]], list[MessageExt]]:
    """``messages(part)`` of :meth:`PullConsumer.send_back_columns`, for the items ``idx``."""
    return lambda part: [messages[idx[j]] for j in part]


def _check_max_times(max_times: int | None) -> None:
    if max_times is not None and (not isinstance(max_times, int) or max_times < 1):
        raise ValueError(f"max_reconsume_times must be an int >= 1, got {max_times!r}")


def _reason_properties(reason: str | Mapping[str, str] | None) -> dict[str, str]:
    if reason is None:
        return {}
    if isinstance(reason, str):
        return {MC.PROPERTY_CONSUME_FAILURE_REASON: clean_property_value(reason)}
    out = {}
    for k, v in reason.items():
        if not isinstance(v, str):
            raise TypeError(f"reason must map str to str, got {k!r}: {v!r}")
        check_property_name(k)
        out[k] = clean_property_value(v)
    return out

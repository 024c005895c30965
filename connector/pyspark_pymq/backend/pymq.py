"""The embedded pymq broker as a backend: its gRPC service and its record layout.

Everything that knows ``pymq.proto`` messages, status enums and the
little-endian commit-log record (``pymq_proto.record``) on the connector side
lives here, in :mod:`.pymq_arrow` (records -> Arrow) and in
``client/codec.py`` (records <-> MessageExt); the Spark modules and the client
classes see only :class:`~pyspark_pymq.backend.base.Backend`.
"""

from __future__ import annotations

import functools
import os
import socket
import struct
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import Future
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt
from pymq_proto.record import (
    HEADER_DTYPE,
    HEADER_SIZE,
    MAX_PROPERTIES_SIZE,
    MESSAGE_MAGIC_CODE,
    store_host_bytes,
)
from pymq_proto.topics import is_retry_topic, is_system_topic
from pymq_proto.v1 import pymq_pb2
from pymq_proto.wire import SerializedRequest, encode_send_request

from ..client.codec import decode_messages, encode_records
from ..client.message import (
    MessageExt,
    MessageQueue,
    PullStatus,
    SendBackColumns,
    SendResult,
    SendStatus,
    frozen_msg_ids,
)
from ..client.route import RouteCache, TopicRoute
from ..client.transport import BrokerClient, UnaryRpc
from ..errors import AccessDeniedError, AuthenticationError, PymqError, TopicNotExistError
from .base import (
    Backend,
    BackendConfig,
    PullBatch,
    QueueBounds,
    SendBackOutcome,
    SendRequest,
    check_endpoint,
    filter_batch_by_tags,
    filter_by_tags,
    subscribed_tags,
)

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = ["PymqBackend"]

_PULL_STATUS = {
    pymq_pb2.FOUND: PullStatus.FOUND,
    pymq_pb2.NO_NEW_MSG: PullStatus.NO_NEW_MSG,
    pymq_pb2.NO_MATCHED_MSG: PullStatus.NO_MATCHED_MSG,
    pymq_pb2.OFFSET_ILLEGAL: PullStatus.OFFSET_ILLEGAL,
}
_SEND_STATUS = {
    pymq_pb2.SEND_OK: SendStatus.SEND_OK,
    pymq_pb2.FLUSH_DISK_TIMEOUT_STATUS: SendStatus.FLUSH_DISK_TIMEOUT,
    pymq_pb2.FLUSH_SLAVE_TIMEOUT: SendStatus.FLUSH_SLAVE_TIMEOUT,
    pymq_pb2.SLAVE_NOT_AVAILABLE: SendStatus.SLAVE_NOT_AVAILABLE,
}
_QUEUE_OFFSET = struct.Struct("<q")
_QUEUE_OFFSET_AT = 20  # QUEUEOFFSET in the record header (pymq_proto.record)
SEND_BACK_RPC_ITEMS = 1000  # send back: messages per request (the requests of a call overlap)


def mq_proto(mq: MessageQueue) -> pymq_pb2.MessageQueue:
    return pymq_pb2.MessageQueue(topic=mq.topic, broker_name=mq.broker_name, queue_id=mq.queue_id)


class PymqBackend(Backend):
    """The embedded broker (``endpoint``): routes lead from it to every broker of a cluster."""

    def __init__(self, config: BackendConfig, timeout_s: float = 10.0) -> None:
        assert config.endpoint is not None, "PymqBackend needs an endpoint"
        self.config = config
        self.timeout_s = timeout_s
        self._bootstrap = BrokerClient(check_endpoint(config.endpoint), timeout_s,
                                       access_key=config.access_key, secret_key=config.secret_key,
                                       tls=config.tls)
        self._routes = RouteCache(self._bootstrap)

    @property
    def endpoint(self) -> str:
        return self._bootstrap.endpoint

    def client(self, mq: MessageQueue) -> BrokerClient:
        """The gRPC client of the broker that serves ``mq``."""
        return self._routes.client(mq.topic, mq.broker_name)

    # -- routes and offsets -----------------------------------------------------------------

    def route(self, topic: str, *, refresh: bool = False) -> TopicRoute:
        return self._routes.get(topic, refresh=refresh)

    def _broker_bounds(self, topic: str, broker_name: str) -> dict[MessageQueue, QueueBounds] | None:
        try:
            client = self._routes.client(topic, broker_name)
            resp = client.topic_stats(pymq_pb2.TopicStatsRequest(topic=topic))
        except TopicNotExistError:
            return None
        return {
            MessageQueue(q.message_queue.topic or topic, q.message_queue.broker_name or broker_name,
                         q.message_queue.queue_id): QueueBounds(int(q.min_offset), int(q.max_offset),
                                                                 int(resp.topic_id))
            for q in resp.queues
        }

    def _query_offset(
        self, mq: MessageQueue, kind: pymq_pb2.OffsetQueryType.ValueType, timestamp: int = 0
    ) -> int:
        resp = self.client(mq).query_offset(
            pymq_pb2.QueryOffsetRequest(message_queue=mq_proto(mq), type=kind, timestamp=timestamp)
        )
        return int(resp.offset)

    def topic_names(self) -> list[str]:
        # the broker leaves its system topics out already; RocketMQ's names too, should a
        # topic be named so
        resp = self._bootstrap.list_topics(pymq_pb2.ListTopicsRequest(include_system=False))
        return sorted(t.topic_name for t in resp.topics if not is_system_topic(t.topic_name))

    def min_offset(self, mq: MessageQueue) -> int:
        return self._query_offset(mq, pymq_pb2.BEGINNING)

    def max_offset(self, mq: MessageQueue) -> int:
        return self._query_offset(mq, pymq_pb2.END)

    def search_offset(self, mq: MessageQueue, timestamp_ms: int) -> int:
        return self._query_offset(mq, pymq_pb2.TIMESTAMP, timestamp_ms)

    def committed(self, group: str, mq: MessageQueue) -> int:
        # The broker answers as RocketMQ: 0 for a group that never committed on a queue still
        # starting at 0 (setZeroIfNotFound, on unless turned off). The Backend contract is
        # -1 for "no progress", so that consumeFromWhere decides where such a group starts:
        # turned off here, as backend/rocketmq.py does for Apache RocketMQ.
        resp = self.client(mq).get_offset(
            pymq_pb2.GetOffsetRequest(
                consumer_group=group, message_queue=mq_proto(mq), set_zero_if_not_found=False
            )
        )
        return int(resp.offset)

    def commit_offsets(self, group: str, offsets: Mapping[MessageQueue, int]) -> None:
        by_broker: dict[str, list[pymq_pb2.QueueOffset]] = {}
        for mq, offset in offsets.items():
            by_broker.setdefault(mq.broker_name, []).append(
                pymq_pb2.QueueOffset(message_queue=mq_proto(mq), offset=offset)
            )
        for broker, items in by_broker.items():
            self._routes.client(items[0].message_queue.topic, broker).update_offset(
                pymq_pb2.UpdateOffsetRequest(consumer_group=group, offsets=items)
            )

    def _check_client_config(
        self, group: str, mq: MessageQueue, subscription: str, expression_type: str
    ) -> None:
        req = pymq_pb2.CheckClientConfigRequest(
            client_id=_client_id(), consumer_group=group, topic=mq.topic,
            subscription=subscription, expression_type=expression_type,
        )
        try:
            self._routes.client(mq.topic, mq.broker_name).check_client_config(req)
        except PymqError as err:
            if err.code != "REQUEST_CODE_NOT_SUPPORTED":  # a broker older than the check
                raise

    def register_consumer(self, group: str, topics: Sequence[str]) -> None:
        # HEART_BEAT to each broker of the topics: it creates %RETRY%<group>, as RocketMQ's
        # brokers do when a consumer registers (not only at the group's first send back).
        client_id = _client_id()
        wanted = [t for t in topics if not is_retry_topic(t)]
        brokers: dict[str, BrokerClient] = {}
        for topic in wanted:
            for broker in self._routes.get(topic).endpoints:
                brokers.setdefault(broker, self._routes.client(topic, broker))
        if not brokers:  # no topic given: the broker this backend was opened on
            brokers[""] = self._bootstrap
        for _name, client in sorted(brokers.items()):
            client.heart_beat(
                pymq_pb2.HeartbeatRequest(client_id=client_id, consumer_group=group, topics=wanted)
            )

    # -- pull -------------------------------------------------------------------------------

    def pull(
        self,
        group: str,
        mq: MessageQueue,
        offset: int,
        max_nums: int,
        *,
        subscription: str = "*",
        expression_type: str = "TAG",
        max_bytes: int = 0,
        suspend_timeout_ms: int = 0,
        timeout_s: float | None = None,
    ) -> PullBatch:
        req = pymq_pb2.PullMessageRequest(
            consumer_group=group,
            message_queue=mq_proto(mq),
            queue_offset=offset,
            max_msg_nums=max_nums,
            max_bytes=max_bytes,
            subscription=subscription,
            expression_type=expression_type,
            suspend_timeout_ms=suspend_timeout_ms,
        )
        client = self.client(mq)
        timeout = (client.timeout if timeout_s is None else timeout_s) + suspend_timeout_ms / 1000.0
        resp = client.pull_message(req, timeout)
        records = resp.records
        first = _QUEUE_OFFSET.unpack_from(records, _QUEUE_OFFSET_AT)[0] if records else -1
        return PullBatch(
            _PULL_STATUS[resp.status], resp.next_begin_offset, resp.min_offset, resp.max_offset,
            records, resp.message_count, first, resp.record_sizes,
        )

    def decode_arrow(
        self,
        pulled: PullBatch,
        mq: MessageQueue,
        *,
        retry: bool,
        end_offset: int | None = None,
        subscription: str = "*",
        expression_type: str = "TAG",
        columns: tuple[str, ...] | None = None,
    ) -> pa.RecordBatch:
        # The broker matches a tag subscription by the tags' hash codes, as RocketMQ's does (SQL92
        # exactly): a tag whose hash is a wanted one's is dropped here, as RocketMQ's clients do.
        from .pymq_arrow import decode_to_arrow

        tags = subscribed_tags(subscription, expression_type)
        if tags and columns is not None and "tags" not in columns:
            columns = (*columns, "tags")  # the filter below reads them
        batch = decode_to_arrow(
            pulled.records, topic=mq.topic, broker_name=mq.broker_name, retry=retry, end_offset=end_offset,
            sizes=pulled.record_sizes, columns=columns,
        )
        return filter_batch_by_tags(batch, tags) if tags else batch

    def decode_messages(
        self, pulled: PullBatch, mq: MessageQueue, *, subscription: str = "*", expression_type: str = "TAG"
    ) -> list[MessageExt]:
        messages = decode_messages(pulled.records, mq.broker_name) if pulled.records else []
        tags = subscribed_tags(subscription, expression_type)
        return filter_by_tags(messages, tags) if tags else messages

    # -- send -------------------------------------------------------------------------------

    def encode_records(
        self, topic: str, bodies: Sequence[bytes], properties: Sequence[bytes],
        flags: Sequence[int] | None = None,
    ) -> tuple[bytes, npt.NDArray[np.int32]]:
        records, sizes = encode_records(topic, bodies, properties, flags)
        return records, np.frombuffer(sizes, dtype=np.int32)

    def frame_columns(
        self, topic: str, bodies: pa.Array, body_lens: npt.NDArray[np.int64],
        property_parts: Sequence[pa.Array | pa.Scalar], property_lens: npt.NDArray[np.int64],
    ) -> tuple[bytes | memoryview, npt.NDArray[np.int32]] | None:
        import pyarrow.compute as pc

        from ..arrow_arrays import binary_scalar
        from ..client.codec import fixed_width

        n = len(body_lens)
        topic_b = topic.encode()
        if int(property_lens.max(initial=0)) > MAX_PROPERTIES_SIZE:
            return None  # the per-message encoding names the message whose properties are too long
        head = np.zeros(n, dtype=HEADER_DTYPE)
        sizes = HEADER_SIZE + body_lens + 2 + len(topic_b) + 2 + property_lens
        if int(sizes.max(initial=0)) > 0x7FFFFFFF:
            return None
        head["total"] = sizes
        head["magic"] = MESSAGE_MAGIC_CODE
        head["body_len"] = body_lens
        mid = np.empty((n, 4 + len(topic_b)), dtype=np.uint8)
        mid[:, :2] = np.frombuffer(struct.pack("<H", len(topic_b)), dtype=np.uint8)
        mid[:, 2 : 2 + len(topic_b)] = np.frombuffer(topic_b, dtype=np.uint8)
        mid[:, -2] = property_lens & 0xFF
        mid[:, -1] = property_lens >> 8
        joined = pc.binary_join_element_wise(
            fixed_width(head.view(np.uint8).reshape(n, HEADER_SIZE)), bodies, fixed_width(mid),
            *property_parts, binary_scalar(b""),
        )
        offsets = np.frombuffer(joined.buffers()[1], dtype=np.int32)[joined.offset : joined.offset + n + 1]
        # a view of Arrow's buffer, not a copy: the request is joined from it (pymq_proto.wire)
        records = memoryview(joined.buffers()[2]).cast("B")[int(offsets[0]) : int(offsets[-1])]
        return records, sizes.astype(np.int32)

    @staticmethod
    def _request(producer_group: str, request: SendRequest, mq: MessageQueue) -> SerializedRequest:
        head = pymq_pb2.SendMessageRequest(
            producer_group=producer_group,
            topic=request.topic,
            queue_id=mq.queue_id,
            born_timestamp=int(time.time() * 1000),
            batch=len(request.sizes) > 1,
            reconsume_times=request.reconsume_times,
        )
        return encode_send_request(head, request.records, request.sizes.tobytes())

    @staticmethod
    def _result(request: SendRequest, mq: MessageQueue, resp: pymq_pb2.SendMessageResponse) -> SendResult:
        return SendResult(
            status=_SEND_STATUS.get(resp.status, SendStatus.SEND_OK),
            message_queue=MessageQueue(mq.topic, mq.broker_name, resp.queue_id),
            queue_offset=resp.queue_offset,
            msg_ids=frozen_msg_ids(request.uniq_keys),
            commit_log_offsets=tuple(resp.commit_log_offsets),
            store_host=_store_host(resp.store_host),
        )

    def send(
        self, producer_group: str, request: SendRequest, mq: MessageQueue, timeout_s: float, *,
        half: bool = False,
    ) -> SendResult:
        client = self.client(mq)
        rpc = client.send_half_message_batch if half else client.send_message
        return self._result(request, mq, rpc(self._request(producer_group, request, mq), timeout_s))

    def send_future(
        self, producer_group: str, request: SendRequest, mq: MessageQueue, timeout_s: float, *,
        half: bool = False,
    ) -> Future[SendResult]:
        client = self.client(mq)
        rpc = client.send_half_message_batch if half else client.send_message
        return rpc.future(self._request(producer_group, request, mq), timeout_s,
                          then=lambda resp: self._result(request, mq, resp))

    # -- send back --------------------------------------------------------------------------

    def send_back(
        self, group: str, columns: SendBackColumns, max_reconsume_times: int | None
    ) -> list[SendBackOutcome | None]:
        n = len(columns.commit_log_offsets)
        # the route of a topic the messages came from, else of %RETRY%<group>; a group that
        # never registered has none yet: then the broker this backend was opened on
        route_topic = columns.origin_topics[0] if columns.origin_topics else "%RETRY%" + group
        try:
            client = self._routes.client(route_topic, columns.broker_name)
        except TopicNotExistError:
            client = self._bootstrap
        parts = []
        for a in range(0, n, SEND_BACK_RPC_ITEMS):
            b = min(a + SEND_BACK_RPC_ITEMS, n)
            req = pymq_pb2.ConsumerSendMsgBackBatchRequest(
                group=group,
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
        out: list[SendBackOutcome | None] = [None] * n
        for a, b, resp in _answers(client.consumer_send_msg_back_batch, parts):
            if resp is None:  # each item falls back to a direct send
                continue
            for i, dead, error in zip(range(a, b), resp.dead_letters, resp.errors, strict=True):
                if not error:
                    out[i] = SendBackOutcome(bool(dead))
        return out


_SendBackBatch = UnaryRpc[pymq_pb2.ConsumerSendMsgBackBatchRequest, pymq_pb2.ConsumerSendMsgBackBatchResponse]


def _answers(
    rpc: _SendBackBatch, parts: list[tuple[int, int, pymq_pb2.ConsumerSendMsgBackBatchRequest]]
) -> list[tuple[int, int, pymq_pb2.ConsumerSendMsgBackBatchResponse | None]]:
    """Each part's response, or None where the call failed.

    Several requests go out together (the broker works on one while the next
    arrives); a single one is a blocking call, as a future's thread hand-off
    would add half a millisecond to it.
    """
    if len(parts) == 1:
        a, b, req = parts[0]
        try:
            return [(a, b, rpc(req))]
        except _NOT_MENDED_BY_FALLBACK:
            raise
        except PymqError:
            return [(a, b, None)]
    calls = [(a, b, rpc.future(req)) for a, b, req in parts]
    out: list[tuple[int, int, pymq_pb2.ConsumerSendMsgBackBatchResponse | None]] = []
    for a, b, call in calls:
        try:
            out.append((a, b, call.result()))
        except _NOT_MENDED_BY_FALLBACK:
            raise
        except PymqError:
            out.append((a, b, None))
    return out


# a refused signature or ACL: the fallback's own send would be refused alike, so say why now
_NOT_MENDED_BY_FALLBACK = (AccessDeniedError, AuthenticationError)


@functools.lru_cache(maxsize=64)
def _store_host(store_host: str) -> bytes:
    host, _, port = store_host.rpartition(":")
    return store_host_bytes(host or "127.0.0.1", int(port) if port.isdecimal() else 0)


def _client_id() -> str:
    """This process's client id in requests that name one (RocketMQ's ``ip@pid``, with the host name)."""
    return f"{socket.gethostname()}@{os.getpid()}"

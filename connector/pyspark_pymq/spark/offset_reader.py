"""Driver side: what the broker has, and where a query starts and ends.

Runs only on the driver (the streaming source runner, or the planner of a batch
read); executors never call it. It answers, per MessageQueue of the query's
topics (and of ``%RETRY%<group>`` when retries are read along):

- the queue's bounds ``[min offset, max offset)`` (one ``TopicStats`` call per
  topic and broker, not one call per queue);
- the starting offsets for each ``startingOffsets`` mode;
- the ending offsets of a batch read.

Broker errors at this point are the user's first contact with the broker, so
they are re-raised naming the option to fix: the endpoint for an unreachable
broker, the topic for an unknown topic.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from pymq_proto.v1 import pymq_pb2

from ..client.consumer import PullConsumer
from ..client.message import MessageQueue
from ..client.route import RouteCache
from ..client.transport import BrokerClient
from ..errors import BrokerUnavailableError, PymqError, RequestTimeoutError, TopicNotExistError
from .data_loss import report_data_loss
from .options import ConsumeFromWhere, SourceOptions, StartingPosition, StartKind
from .source_offset import EARLIEST, LATEST, lookup

__all__ = ["OffsetReader", "QueueBounds"]

logger = logging.getLogger("pyspark_pymq.spark")


@dataclass(frozen=True, slots=True)
class QueueBounds:
    """A queue's offsets on the broker: messages are at ``[min_offset, max_offset)``."""

    min_offset: int
    max_offset: int


class OffsetReader:
    """Offsets of the query's queues, read from the broker (driver only).

    Holds gRPC channels: never pickled (the readers drop it in ``__getstate__``).
    """

    def __init__(self, opts: SourceOptions) -> None:
        self.opts = opts
        self.consumer = PullConsumer(
            opts.endpoint, opts.pull_group, timeout_ms=opts.connect_timeout_ms
        )
        self._bootstrap = BrokerClient(opts.endpoint, opts.connect_timeout_ms / 1000.0)
        self._routes = RouteCache(self._bootstrap)
        self._clients: dict[str, BrokerClient] = {}

    # -- errors -------------------------------------------------------------------

    def _explain(self, err: PymqError, topic: str | None = None) -> PymqError:
        """``err`` with the option that fixes it named (same error type)."""
        opts = self.opts
        if isinstance(err, (BrokerUnavailableError, RequestTimeoutError)):
            return type(err)(
                f"pymq source cannot reach the broker at {opts.endpoint} (option "
                f"endpoint={opts.endpoint!r}, connectTimeoutMs={opts.connect_timeout_ms}): "
                f"{err.remark}. Check that pymq-broker runs there and the endpoint is right"
            )
        if isinstance(err, TopicNotExistError) and topic is not None:
            return TopicNotExistError(
                f"pymq option topic={','.join(opts.topics)!r}: topic {topic!r} does not exist "
                f"on the broker at {opts.endpoint}. Create it first (e.g. "
                f"Admin({opts.endpoint!r}).create_topic({topic!r})) or correct the option"
            )
        return err

    # -- what the broker has -----------------------------------------------------------

    def _client_for(self, endpoint: str) -> BrokerClient:
        if endpoint == self._bootstrap.endpoint:
            return self._bootstrap
        client = self._clients.get(endpoint)
        if client is None:
            client = BrokerClient(endpoint, self._bootstrap.timeout)
            self._clients[endpoint] = client
        return client

    def topic_bounds(self, topic: str) -> dict[MessageQueue, QueueBounds] | None:
        """Bounds of every readable queue of ``topic``; None if the topic does not exist."""
        try:
            route = self._routes.get(topic, refresh=True)
        except TopicNotExistError:
            return None
        except PymqError as err:
            raise self._explain(err, topic) from None
        if not route.subscribe_queues:
            return None
        stats: dict[MessageQueue, QueueBounds] = {}
        for broker in sorted({mq.broker_name for mq in route.subscribe_queues}):
            endpoint = route.endpoints.get(broker, self._bootstrap.endpoint)
            try:
                resp = self._client_for(endpoint).call(
                    "TopicStats", pymq_pb2.TopicStatsRequest(topic=topic)
                )
            except TopicNotExistError:
                return None
            except PymqError as err:
                raise self._explain(err, topic) from None
            for q in resp.queues:
                mq = MessageQueue(q.message_queue.topic or topic, q.message_queue.broker_name
                                  or broker, q.message_queue.queue_id)
                stats[mq] = QueueBounds(int(q.min_offset), int(q.max_offset))
        out: dict[MessageQueue, QueueBounds] = {}
        for mq in route.subscribe_queues:
            bounds = stats.get(mq)
            if bounds is None:  # a queue the broker has not written yet
                bounds = QueueBounds(self.consumer.min_offset(mq), self.consumer.max_offset(mq))
            out[mq] = bounds
        return out

    def bounds(self, *, require_topics: bool) -> tuple[dict[MessageQueue, QueueBounds], list[str]]:
        """Bounds of all the query's queues, and the user topics that do not exist.

        With ``require_topics`` (query start) a missing user topic raises,
        naming the option; mid-stream the caller decides (data loss). A
        missing retry topic is normal (no message failed yet) and never reported.
        """
        out: dict[MessageQueue, QueueBounds] = {}
        missing: list[str] = []
        retry = self.opts.retry_topic
        for topic in self.opts.all_topics():
            found = self.topic_bounds(topic)
            if found is None:
                if topic == retry and topic not in self.opts.topics:
                    continue
                if require_topics:
                    raise self._explain(TopicNotExistError(topic), topic)
                missing.append(topic)
                continue
            out.update(found)
        return out, missing

    # -- where to start -------------------------------------------------------------------

    def _committed(self, mq: MessageQueue) -> int:
        try:
            return self.consumer.committed(mq)
        except PymqError as err:
            raise self._explain(err, mq.topic) from None

    def _search(self, mq: MessageQueue, timestamp_ms: int) -> int:
        try:
            return self.consumer.search_offset(mq, timestamp_ms)
        except PymqError as err:
            raise self._explain(err, mq.topic) from None

    def starting_offsets(
        self, bounds: Mapping[MessageQueue, QueueBounds], ending: Mapping[MessageQueue, int]
        | None = None,
    ) -> dict[MessageQueue, int]:
        """Where each queue starts, per ``startingOffsets`` (and its siblings).

        Queues of the retry topic start at the group's progress, or at their
        first message when the group has none (RocketMQ starts retry topics
        there too). An offset below a queue's first message goes through
        failOnDataLoss; when allowed it moves up to the first message.
        ``ending`` is needed for lastMessagesPerQueue.
        """
        opts = self.opts
        start = opts.starting
        retry = opts.retry_topic
        self._check_named_queues(start, bounds)
        out: dict[MessageQueue, int] = {}
        for mq in sorted(bounds):
            b = bounds[mq]
            if mq.topic == retry and mq.topic not in opts.topics:
                offset = self._start_of_retry_queue(mq, b, start)
            else:
                offset = self._start_of(mq, b, start, ending)
            if offset < b.min_offset:
                report_data_loss(
                    opts.fail_on_data_loss,
                    f"queue {mq}: the starting offset {offset} is below the queue's first "
                    f"message (min offset {b.min_offset}), so offsets [{offset}, "
                    f"{b.min_offset}) are no longer on the broker",
                    f"start {mq} at offset {b.min_offset}",
                )
                offset = b.min_offset
            out[mq] = min(offset, b.max_offset)
        return out

    def _start_of_retry_queue(
        self, mq: MessageQueue, b: QueueBounds, start: StartingPosition
    ) -> int:
        if start.kind is StartKind.OFFSETS:
            given = lookup(start.offsets, mq)
            if given is not None:
                return self._absolute(given, b)
        committed = self._committed(mq) if self.opts.consumer_group else -1
        return committed if committed >= 0 else b.min_offset

    def _start_of(
        self,
        mq: MessageQueue,
        b: QueueBounds,
        start: StartingPosition,
        ending: Mapping[MessageQueue, int] | None,
    ) -> int:
        kind = start.kind
        if kind is StartKind.EARLIEST:
            return b.min_offset
        if kind is StartKind.LATEST:
            return b.max_offset
        if kind is StartKind.TIMESTAMP:
            assert start.timestamp_ms is not None
            return self._search(mq, start.timestamp_ms)
        if kind is StartKind.OFFSETS:
            given = lookup(start.offsets, mq)
            return b.min_offset if given is None else self._absolute(given, b)
        if kind is StartKind.LAST_N:
            end = b.max_offset if ending is None else ending.get(mq, b.max_offset)
            return max(b.min_offset, end - start.count)
        # GROUP: the group's progress, else consumeFromWhere
        committed = self._committed(mq)
        if committed >= 0:
            return committed
        where = self.opts.consume_from_where
        if where is ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET:
            return b.min_offset
        if where is ConsumeFromWhere.CONSUME_FROM_TIMESTAMP:
            assert self.opts.consume_timestamp_ms is not None
            return self._search(mq, self.opts.consume_timestamp_ms)
        return b.max_offset

    @staticmethod
    def _absolute(given: int, b: QueueBounds) -> int:
        if given == EARLIEST:
            return b.min_offset
        if given == LATEST:
            return b.max_offset
        return given

    def _check_named_queues(
        self, start: StartingPosition, bounds: Mapping[MessageQueue, QueueBounds]
    ) -> None:
        if start.kind is StartKind.OFFSETS:
            _check_queue_keys("startingOffsets", start.offsets, bounds)

    # -- where a batch read ends ------------------------------------------------------------

    def ending_offsets(self, bounds: Mapping[MessageQueue, QueueBounds]) -> dict[MessageQueue, int]:
        """Exclusive end per queue of a batch read (``endingOffsets`` / ``endingTimestamp``)."""
        ending = self.opts.ending
        if ending.kind is StartKind.OFFSETS:
            _check_queue_keys("endingOffsets", ending.offsets, bounds)
        out: dict[MessageQueue, int] = {}
        for mq in sorted(bounds):
            b = bounds[mq]
            if ending.kind is StartKind.TIMESTAMP:
                assert ending.timestamp_ms is not None
                out[mq] = self._search(mq, ending.timestamp_ms)
            elif ending.kind is StartKind.OFFSETS:
                given = lookup(ending.offsets, mq)
                out[mq] = b.max_offset if given is None or given == LATEST else given
            else:
                out[mq] = b.max_offset
            out[mq] = min(out[mq], b.max_offset)
        return out

    # -- progress -------------------------------------------------------------------------

    def commit(self, offsets: Mapping[MessageQueue, int]) -> None:
        """Write ``offsets`` as the group's progress (CLUSTERING streams only)."""
        if offsets:
            self.consumer.commit_offsets(offsets)


def _check_queue_keys(
    option: str, offsets: Mapping[tuple[str, str, int], int], bounds: Iterable[MessageQueue]
) -> None:
    known = {(mq.topic, mq.broker_name, mq.queue_id) for mq in bounds}
    known_any = {(mq.topic, "", mq.queue_id) for mq in bounds}
    for key in offsets:
        if key not in known and key not in known_any:
            topic, broker, qid = key
            queues = sorted(f"{b}:{q}" for t, b, q in known if t == topic)
            raise ValueError(
                f"pymq option {option} names queue {broker + ':' if broker else ''}{qid} of "
                f"topic {topic!r}, which the broker does not have; its queues are "
                f"{', '.join(queues) or 'none'}"
            )

"""Driver side: what the broker has, and where a query starts and ends.

Runs only on the driver (the streaming source runner, or the planner of a batch
read); executors never call it. It answers, per MessageQueue of the query's
topics (and of ``%RETRY%<group>`` when retries are read along):

- the queue's bounds ``[min offset, max offset)`` (one stats call per topic and
  broker, not one call per queue, where the backend allows);
- the starting offsets for each ``startingOffsets`` mode;
- the ending offsets of a batch read.

Broker errors at this point are the user's first contact with the broker, so
they are re-raised naming the option to fix: endpoint / namesrvAddr for an
unreachable broker, the topic for an unknown topic.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import replace
from datetime import datetime, timezone

from pymq_proto.topics import not_created_yet

from ..backend.base import Backend, QueueBounds, open_backend
from ..client.message import MessageQueue
from ..errors import (
    CONNECT_HINT,
    GROUP_NOT_EXIST,
    NAMESRV_HINT,
    UNREACHABLE_HINT,
    BrokerNotReadableError,
    BrokerUnavailableError,
    NoPermissionError,
    PymqError,
    RequestTimeoutError,
    TopicNotExistError,
)
from .data_loss import report_data_loss
from .options import ConsumeFromWhere, SourceOptions, StartingPosition, StartKind, TimestampStrategy
from .source_offset import EARLIEST, LATEST, QueueKey, TopicIds, lookup, recreated_topics, topic_ids

__all__ = ["OffsetReader", "QueueBounds"]

logger = logging.getLogger("pyspark_pymq.spark")
REGISTER_INTERVAL_S = 30.0
# Topics whose bounds are asked at once. Each topic costs two round trips (its route, its queues'
# stats), mostly waiting: a pattern matching 1,000 topics took 1.1-1.5 s a trigger one by one.
BOUNDS_THREADS = 8


class OffsetReader:
    """Offsets of the query's queues, read from the broker (driver only).

    Holds connections: never pickled (the readers drop it in ``__getstate__``).
    """

    def __init__(self, opts: SourceOptions, backend: Backend | None = None) -> None:
        self.opts = opts
        self.backend = backend or open_backend(opts.backend, opts.connect_timeout_ms / 1000.0)
        self._registered_at: float | None = None
        # Brokers that did not answer the last mid-stream bounds(): their queues wait.
        self._unreachable: set[str] = set()
        self._unreadable: set[str] = set()  # of those, the brokers that answer but serve no reads
        self._skipped = 0  # messages the last starting_offsets left behind (it starts at their end)
        # The queues the last bounds() found readable: the only ones commit() writes.
        self._readable: set[MessageQueue] | None = None
        # The topic ids the last bounds() found: commit() writes no offsets of an older topic.
        self._topic_ids: TopicIds = {}
        # Whether the brokers took a pull of the query's group (checked once, at the start).
        self._group_checked = False
        # subscribePattern: the topic names of the last listing (a listing that fails mid-stream
        # falls back on them, as a named topic's queues wait for a broker that does not answer)
        self._listed: tuple[str, ...] = ()
        # assign: the topics whose named queues were looked for in this run
        self._assign_checked: set[str] = set()

    # -- errors -------------------------------------------------------------------

    def _explain(self, err: PymqError, topic: str | None = None) -> PymqError:
        """``err`` with the option that fixes it named (same error type)."""
        opts = self.opts
        cfg = opts.backend
        if isinstance(err, BrokerNotReadableError):  # it answers: its remark says why and what to do
            return type(err)(f"pymq source: {err.remark}")
        if isinstance(err, (BrokerUnavailableError, RequestTimeoutError)):
            check = NAMESRV_HINT if cfg.namesrv_addr else UNREACHABLE_HINT
            remark = err.remark.replace(f" {CONNECT_HINT}.", "").rstrip(".")  # one hint, the last
            remark = remark[: -len(check)].rstrip(". ") if remark.endswith(check) else remark
            return type(err)(
                f"pymq source cannot reach {cfg.where} (option {cfg.option}, "
                f"connectTimeoutMs={opts.connect_timeout_ms}): {remark}. {check}"
            )
        if isinstance(err, TopicNotExistError) and topic is not None:
            why = not_created_yet(topic)
            if why is not None:
                return TopicNotExistError(
                    f"pymq option {opts.topic_option}: topic {topic!r} does not exist "
                    f"on {cfg.where}: {why}"
                )
            create = (
                f"mqadmin updateTopic -n {cfg.namesrv_addr} -c <cluster> -t {topic}" if cfg.namesrv_addr
                else f"Admin({cfg.endpoint!r}).create_topic({topic!r})"
            )
            return TopicNotExistError(
                f"pymq option {opts.topic_option}: topic {topic!r} does not exist "
                f"on {cfg.where}. Create it first (e.g. {create}) or correct the option"
            )
        return err

    # -- what the broker has -----------------------------------------------------------

    def topic_bounds(
        self, topic: str, *, unreachable: set[str] | None = None, unreadable: set[str] | None = None
    ) -> dict[MessageQueue, QueueBounds] | None:
        """Bounds of every readable queue of ``topic``; None if the topic does not exist
        (``unreachable``, ``unreadable``: see :meth:`Backend.queue_bounds`)."""
        try:
            return self.backend.queue_bounds(topic, unreachable=unreachable, unreadable=unreadable)
        except PymqError as err:
            raise self._explain(err, topic) from None

    def _topics_bounds(
        self, topics: Sequence[str], unreachable: set[str] | None, unreadable: set[str] | None = None
    ) -> list[dict[MessageQueue, QueueBounds] | None]:
        """:meth:`topic_bounds` of each of ``topics``, in their order, several asked at once.

        An error is the first topic's in that order, as asking one after another would raise it;
        the topics not asked yet then are not.
        """
        if len(topics) <= 2:  # a topic and its group's retry topic: no thread is worth it
            return [self.topic_bounds(t, unreachable=unreachable, unreadable=unreadable) for t in topics]

        Found = tuple[dict[MessageQueue, QueueBounds] | None, set[str] | None, set[str] | None]

        def one(topic: str) -> Found:
            mine = None if unreachable is None else set[str]()
            not_read = None if unreadable is None else set[str]()
            return self.topic_bounds(topic, unreachable=mine, unreadable=not_read), mine, not_read

        pool = ThreadPoolExecutor(min(BOUNDS_THREADS, len(topics)), thread_name_prefix="pymq-bounds")
        try:
            futures: list[Future[Found]] = [pool.submit(one, t) for t in topics]
            out = []
            for future in futures:
                found, skipped, not_read = future.result()
                if skipped and unreachable is not None:
                    unreachable.update(skipped)
                if not_read and unreadable is not None:
                    unreadable.update(not_read)
                out.append(found)
            return out
        finally:
            pool.shutdown(wait=False, cancel_futures=True)

    def bounds(
        self, *, require_topics: bool, keep: Iterable[str] = ()
    ) -> tuple[dict[MessageQueue, QueueBounds], list[str]]:
        """Bounds of all the query's queues, and the user topics that do not exist.

        With subscribePattern the query's topics are those matching now, asked of the broker
        each time, and those of ``keep`` (the topics of a stream's checkpoint) that still match:
        one of them gone is a deleted topic, as a named one would be.

        With ``require_topics`` (query start) a missing user topic raises,
        naming the option; mid-stream the caller decides (data loss). A
        missing retry topic is normal (no message failed yet) and never reported.
        Mid-stream, the queues of a broker that does not answer are left out and
        the broker counts as unavailable (its queues wait, see
        :meth:`unavailable_brokers`); at the start its error is raised.
        """
        keep = set(keep)
        self._resolve_topics(keep, strict=require_topics)
        self._register()
        out: dict[MessageQueue, QueueBounds] = {}
        missing: list[str] = []
        retry = self.opts.retry_topic
        unreachable: set[str] | None = None if require_topics else set()
        # A new stream starts without the queues of a broker that answers but serves no reads now
        # (RocketMQ: its master down, its slave with slaveReadEnable=false), as RocketMQ's consumers
        # go on with the brokers that serve: they join it once it serves again, from the group's
        # progress or their first message, as a broker's that was down at the start. Only where that
        # is where they would start now (startingOffsets group or earliest): a stream started at
        # latest or at a time read such a broker's whole history once it served. A batch read,
        # which cannot wait for them, fails naming the broker, as such a stream does.
        joins_as_it_starts = self.opts.starting.kind in (StartKind.GROUP, StartKind.EARLIEST)
        unreadable: set[str] | None = (
            set() if require_topics and self.opts.stream and joins_as_it_starts else None)
        topics = self.opts.all_topics()
        bounds_of = self._topics_bounds(topics, unreachable, unreadable)
        # known before assign is checked (_assigned): a broker serving no reads is not one "down"
        self._unreadable = unreadable or set()
        for topic, found in zip(topics, bounds_of, strict=True):
            if found is None:
                if topic == retry and topic not in self.opts.topics:
                    continue
                if self.opts.topic_pattern is not None and topic not in keep:
                    continue  # listed but not readable (write-only, or deleted since): not read yet
                if require_topics:
                    raise self._explain(TopicNotExistError(topic), topic)
                missing.append(topic)
                continue
            if self.opts.assigned is not None:
                found = self._assigned(topic, found, strict=require_topics)
            out.update(found)
        if require_topics and not self.opts.stream:
            self._check_unlisted([t for t, found in zip(topics, bounds_of, strict=True) if found])
        self._unreadable = unreadable or set()
        self._unreachable = (unreachable or set()) | self._unreadable
        self._readable = set(out)
        self._topic_ids = topic_ids(out)
        if out and not self._group_checked:
            # at a query's start, and at the first bounds of a stream restarted from its checkpoint
            # (Spark calls no initialOffset then): the brokers may have changed meanwhile
            self._check_group(out, strict=require_topics)
        if self._unreachable:
            logger.warning("pymq source: broker(s) %s do not answer or serve no reads; their queues wait",
                           ", ".join(sorted(self._unreachable)))
        return out, missing

    def _check_unlisted(self, topics: Sequence[str]) -> None:
        """A batch read plans from the routes once: queues of a broker that a route does not list
        but that holds them (:meth:`Backend.unlisted_queues`) would be left out, silently. A
        stream needs no such look: they join it once the route lists them."""
        try:
            unlisted = self.backend.unlisted_queues(topics)
        except PymqError as err:
            raise self._explain(err) from None
        for topic, brokers in sorted(unlisted.items()):
            for broker, queues in sorted(brokers.items()):
                wanted = [mq for mq in queues if self.opts.assigns(mq)]
                if not wanted:
                    continue
                names = ", ".join(f"{mq.broker_name}:{mq.queue_id}" for mq in wanted)
                raise BrokerUnavailableError(
                    f"pymq source: broker {broker!r} holds queue(s) {names} of topic {topic!r}, but the "
                    f"topic's route on the name servers ({self.opts.backend.option}) does not list it, "
                    "so the read would leave its messages out. The name servers take a broker's routes "
                    "when it registers: a broker restarted a moment ago, or a route deleted on the name "
                    "servers alone, is listed again by its next registration (every 30 s; RocketMQ 4.x "
                    "takes the routes again only at a topic change on that broker, e.g. a new topic "
                    f"made with `mqadmin updateTopic -b <its address>`; not -t {topic} without -r and -w, "
                    "which would set its queue counts there to 8): read again once the route lists it. "
                    "To read the other brokers' queues without it, name them with option assign"
                )

    def _assigned(self, topic: str, found: dict[MessageQueue, QueueBounds], *,
                  strict: bool) -> dict[MessageQueue, QueueBounds]:
        """The queues of ``found`` that ``assign`` names. At the start (``strict``) each one it
        names must be there; mid-stream one gone waits (see MicroBatchStream.latestOffset)."""
        opts = self.opts
        assert opts.assigned is not None
        if strict or topic not in self._assign_checked:
            # a stream restarted from its checkpoint gets no strict look (Spark calls no
            # initialOffset): a queue named there that is not (a typo, a queue cut since) is said once
            self._assign_checked.add(topic)
            # a new stream's queues of a broker serving no reads join once it serves (assign gives
            # no offsets to miss), as the other queues of that broker do (see bounds)
            named = sorted(key for key in opts.assigned if key[0] == topic and key[1] not in self._unreadable)
            if strict:
                self._check_named_brokers("assign", named, found)
            for _, broker, qid in named:
                if not any(mq.queue_id == qid and broker in ("", mq.broker_name) for mq in found):
                    has = ", ".join(f"{mq.broker_name}:{mq.queue_id}" for mq in sorted(
                        found, key=lambda mq: (mq.broker_name, mq.queue_id)))
                    problem = (f"pymq option {opts.topic_option}: topic {topic!r} has no readable queue "
                               f"{f'{broker}:{qid}' if broker else qid} on {opts.backend.where}; its "
                               f"queues are {has or 'none'}")
                    if strict and not (not broker and self._unreadable):
                        raise ValueError(f"{problem}. Name those it has")
                    if not broker and self._unreadable:  # a queue id alone: it may be theirs
                        problem += (f" (broker(s) {', '.join(sorted(self._unreadable))} serve no reads "
                                    "now: it may be one of theirs)")
                    logger.warning("%s: nothing is read for it until the topic has it", problem)
        return {mq: b for mq, b in found.items() if opts.assigns(mq)}

    def _resolve_topics(self, keep: set[str], *, strict: bool) -> None:
        """subscribePattern: ``opts.topics`` become the topics that match now (see :meth:`bounds`).

        Mid-stream (not ``strict``) a listing the brokers do not answer keeps the topics found
        before; at the start it raises."""
        opts = self.opts
        if opts.topic_pattern is None:
            return
        try:
            names = tuple(self.backend.topic_names())
        except (BrokerUnavailableError, RequestTimeoutError) as err:
            if strict:
                raise self._explain(err) from None
            logger.warning("pymq source: %s: the topics could not be listed (%s); reading those found "
                           "before", opts.topic_option, err.remark)
            names = self._listed
        except NoPermissionError as err:
            raise type(err)(
                f"pymq option {opts.topic_option} lists the topics of {opts.backend.where}, which this "
                f"user may not: {err.remark}. Grant it List on the cluster, or name the topics with "
                "option topic", code=err.code,
            ) from None
        except PymqError as err:
            if err.code == "NOT_SUPPORTED":  # the name servers list no topics
                raise PymqError(f"pymq option {opts.topic_option} cannot find its topics: {err.remark}"
                                " with option topic", code=err.code) from None
            raise self._explain(err) from None
        self._listed = names
        found = tuple(sorted({t for t in (*names, *keep) if opts.matches(t)}))
        if found != opts.topics:
            logger.info("pymq source: %s matches topics %s", opts.topic_option, ", ".join(found) or "none")
            self.opts = replace(opts, topics=found)
        if not found and not opts.stream:  # as Spark's Kafka source, no rows; but say why
            logger.warning("pymq source: %s matches no topic on %s: the read has no rows",
                           opts.topic_option, opts.backend.where)

    def _check_group(self, queues: Iterable[MessageQueue], *, strict: bool = True) -> None:
        """A group the brokers refuse (RocketMQ's autoCreateSubscriptionGroup=false) fails the
        query here, naming the option, rather than each task with the broker's answer. Not
        ``strict`` (mid-stream), a broker that does not answer leaves it for the next bounds."""
        group = self.opts.pull_group
        queues = list(queues)
        try:
            self.backend.check_consumer_group(group, queues)
            self._check_subscription(group, queues)
        except PymqError as err:
            if not strict and isinstance(err, (BrokerUnavailableError, RequestTimeoutError)):
                return
            if err.code != GROUP_NOT_EXIST:
                raise self._explain(err) from None
            if self.opts.consumer_group:
                remark = f"pymq option consumerGroup={group!r}: {err.remark}"
            else:
                remark = (f"pymq source without option consumerGroup pulls as {group!r}: {err.remark}, "
                          "or set consumerGroup to a group the brokers have")
            raise type(err)(remark, code=err.code) from None
        self._group_checked = True

    def _check_subscription(self, group: str, queues: list[MessageQueue]) -> None:
        """A SQL92 subscription a broker cannot serve (its property filters off) fails the
        query here, as RocketMQ's consumers fail at start, not in every task's first pull."""
        opts = self.opts
        try:
            self.backend.check_client_config(group, queues, opts.subscription, opts.subscription_type)
        except PymqError as err:
            if err.code == GROUP_NOT_EXIST or isinstance(err, (BrokerUnavailableError, RequestTimeoutError)):
                raise
            remark = err.remark
            if "does not support consumer to filter" in remark:  # RocketMQ's own words
                remark += (": set enablePropertyFilter=true on the brokers (broker.conf, or at once with "
                           "mqadmin updateBrokerConfig -k enablePropertyFilter -v true)")
            raise type(err)(
                f"pymq options subscriptionType={opts.subscription_type!r}, "
                f"subscription={opts.subscription!r}: {remark}", code=err.code,
            ) from None

    def _register(self) -> None:
        """A stream in CLUSTERING registers its group (where the broker wants it), again every
        REGISTER_INTERVAL_S as RocketMQ's clients heartbeat: a restarted broker may have lost
        the group's %RETRY% topic until then."""
        if not (self.opts.stream and self.opts.commits_progress):
            return
        now = time.monotonic()
        if self._registered_at is not None and now - self._registered_at < REGISTER_INTERVAL_S:
            return
        self._registered_at = now
        try:
            self.backend.register_consumer(self.opts.pull_group, self.opts.topics)
        except PymqError as err:  # only what the broker's tools show depends on it
            logger.warning("pymq source: could not register group %s: %s", self.opts.pull_group, err)

    def topic_ids(self) -> TopicIds:
        """The topic ids of the last :meth:`bounds` (asked now if there was none in this run)."""
        if self._readable is None:
            self.bounds(require_topics=False)
        return dict(self._topic_ids)

    def unavailable_brokers(self, queues: Iterable[MessageQueue]) -> set[str]:
        """Brokers of ``queues`` that are down now (a broker's queues are kept, not lost):
        gone from the name servers, or not answering the last :meth:`bounds`."""
        queues = list(queues)
        unanswered = {mq.broker_name for mq in queues} & self._unreachable
        try:
            return unanswered | self.backend.unavailable_brokers(queues)
        except PymqError as err:
            raise self._explain(err) from None

    # -- where to start -------------------------------------------------------------------

    def _committed(self, mq: MessageQueue) -> int:
        try:
            return self.backend.committed(self.opts.pull_group, mq)
        except PymqError as err:
            raise self._explain(err, mq.topic) from None

    def _search(self, mq: MessageQueue, timestamp_ms: int) -> int:
        try:
            return self.backend.search_offset(mq, timestamp_ms)
        except PymqError as err:
            raise self._explain(err, mq.topic) from None

    def joining_offset(self, mq: MessageQueue, b: QueueBounds) -> int | None:
        """Where a queue that joins a running stream starts (a new queue, or one of a broker that
        was down when the query started): its first message; with ``startingOffsets=group`` the
        group's progress on it when it has some, as a RocketMQ consumer starts a queue its
        rebalance gains (else a broker down at the start had its queues read again whole).
        Progress below the queue's first message goes through failOnDataLoss, as at the start.
        None: the broker did not answer (just back, still loading): it joins at the next trigger."""
        if self.opts.starting.kind is not StartKind.GROUP:
            return b.min_offset
        try:
            committed = self.backend.committed(self.opts.pull_group, mq)
        except (BrokerUnavailableError, RequestTimeoutError) as err:
            logger.warning("pymq source: %s joins at the next trigger: its group progress could not be "
                           "read (%s)", mq, err.remark)
            return None
        except PymqError as err:
            raise self._explain(err, mq.topic) from None
        if 0 <= committed < b.min_offset:
            report_data_loss(
                self.opts.fail_on_data_loss,
                f"queue {mq}: the group's progress {committed} is below the queue's first message "
                f"(min offset {b.min_offset}), so offsets [{committed}, {b.min_offset}) are no longer "
                "on the broker",
                f"start {mq} at offset {b.min_offset}",
            )
        return b.min_offset if committed < 0 else min(max(committed, b.min_offset), b.max_offset)

    def starting_offsets(
        self, bounds: Mapping[MessageQueue, QueueBounds], ending: Mapping[MessageQueue, int]
        | None = None,
    ) -> dict[MessageQueue, int]:
        """Where each queue starts, per ``startingOffsets`` (and its siblings).

        The queues of a retry topic read along start as the topics' queues do (see
        :meth:`_start_of`). An offset below a queue's first message goes through
        failOnDataLoss; when allowed it moves up to the first message. So does an offset
        given in startingOffsets past the queue's end; when allowed it moves down to the end.
        ``ending`` is needed for lastMessagesPerQueue.
        """
        opts = self.opts
        start = opts.starting
        self._check_named_queues(start, bounds)
        out: dict[MessageQueue, int] = {}
        self._skipped = 0
        for mq in sorted(bounds):
            b = bounds[mq]
            offset = self._start_of(mq, b, start, ending)
            if offset >= b.max_offset and start.strategy is TimestampStrategy.ERROR:
                self._check_time_matched(mq, start)
            if offset < b.min_offset:
                report_data_loss(
                    opts.fail_on_data_loss,
                    f"queue {mq}: the starting offset {offset} is below the queue's first "
                    f"message (min offset {b.min_offset}), so offsets [{offset}, "
                    f"{b.min_offset}) are no longer on the broker",
                    f"start {mq} at offset {b.min_offset}",
                )
                offset = b.min_offset
            elif offset > b.max_offset and start.kind is StartKind.OFFSETS:
                # a number the user gave past the queue's end names messages that are not there
                # (a topic recreated since the offsets were taken?); Spark's Kafka source reports
                # it the same way
                report_data_loss(
                    opts.fail_on_data_loss,
                    f"queue {mq}: startingOffsets gives offset {offset}, past the queue's end "
                    f"(max offset {b.max_offset}): the queue has no such message",
                    f"start {mq} at its end, offset {b.max_offset}",
                )
            out[mq] = min(offset, b.max_offset)
        if self._skipped:
            # a new stream on a topic that holds messages read none of them, and said nothing
            how = ("startingOffsets=latest" if start.kind is StartKind.LATEST else
                   f"consumer group {opts.consumer_group!r} has no progress on them, and "
                   "consumeFromWhere=CONSUME_FROM_LAST_OFFSET (RocketMQ's default) starts there")
            logger.warning(
                "pymq source: starting at the end of the queues: %d message(s) already stored are not "
                "read (%s). To read them, set startingOffsets=earliest%s", self._skipped, how,
                "" if start.kind is StartKind.LATEST else " or consumeFromWhere=CONSUME_FROM_FIRST_OFFSET")
        return out

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
            self._skipped += b.max_offset - b.min_offset
            return b.max_offset
        if kind is StartKind.TIMESTAMP:
            assert start.timestamp_ms is not None
            return self._search(mq, start.timestamp_ms)
        if kind is StartKind.TIMESTAMPS:
            # as a queue left out of startingOffsets JSON: from its first message
            time_ms = lookup(start.timestamps, mq)
            return b.min_offset if time_ms is None else self._search(mq, time_ms)
        if kind is StartKind.OFFSETS:
            given = lookup(start.offsets, mq)
            return b.min_offset if given is None else self._absolute(given, b)
        if kind is StartKind.LAST_N:
            end = b.max_offset if ending is None else ending.get(mq, b.max_offset)
            return max(b.min_offset, end - start.count)
        # GROUP: the group's progress, else consumeFromWhere; a retry topic read along starts as
        # RocketMQ's consumers start a %RETRY% queue (RebalancePushImpl.
        # computePullFromWhereWithException): at its first message, what is in it failed in this
        # group and is due again; but at its max offset from a timestamp
        committed = self._committed(mq)
        if committed >= 0:
            return committed
        where = self.opts.consume_from_where
        if mq.topic == self.opts.retry_topic and mq.topic not in self.opts.topics:
            return b.max_offset if where is ConsumeFromWhere.CONSUME_FROM_TIMESTAMP else b.min_offset
        if where is ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET:
            return b.min_offset
        if where is ConsumeFromWhere.CONSUME_FROM_TIMESTAMP:
            assert self.opts.consume_timestamp_ms is not None
            return self._search(mq, self.opts.consume_timestamp_ms)
        self._skipped += b.max_offset - b.min_offset
        return b.max_offset

    def _check_time_matched(self, mq: MessageQueue, start: StartingPosition) -> None:
        """startingOffsetsByTimestampStrategy=error: ``mq``, resolved by a time to its end, has no
        message stored at or after that time (Kafka's offsetsForTimes found none): fail, naming
        it. A queue a JSON leaves out was not resolved by a time; nor is the retry topic read
        along under startingTimestamp (its queues are empty until a message fails)."""
        if start.kind is StartKind.TIMESTAMPS:
            time_ms = lookup(start.timestamps, mq)
        elif mq.topic in self.opts.topics:
            time_ms = start.timestamp_ms
        else:
            time_ms = None
        if time_ms is None:
            return
        raise ValueError(
            f"pymq option {start.option}: queue {mq.broker_name}:{mq.queue_id} of topic {mq.topic!r} "
            f"has no message stored at or after {time_ms} ({_iso(time_ms)}), and "
            "startingOffsetsByTimestampStrategy is 'error'. Give an earlier time, or set "
            "startingOffsetsByTimestampStrategy=latest to start such a queue at its end"
        )

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
            self._check_queue_keys("startingOffsets", start.offsets, bounds)
        if start.kind is StartKind.TIMESTAMPS:
            self._check_queue_keys("startingOffsetsByTimestamp", start.timestamps, bounds)

    def _check_queue_keys(
        self, option: str, offsets: Mapping[QueueKey, int], bounds: Iterable[MessageQueue]
    ) -> None:
        bounds = list(bounds)
        self._check_named_brokers(option, offsets, bounds)
        _check_queue_keys(option, offsets, bounds)

    def _check_named_brokers(
        self, option: str, keys: Iterable[QueueKey], bounds: Iterable[MessageQueue]
    ) -> None:
        """Queues ``option`` names on a broker that the route of their topic does not list now,
        but that still holds them: down, or not registered again yet after a restart (RocketMQ's
        name servers drop a broker that stopped, with its routes). Such a queue is not "one the
        broker does not have": the read fails naming the broker, rather than telling the user to
        leave its queues out, which would read the topic without its messages."""
        listed = {(mq.topic, mq.broker_name) for mq in bounds}
        unlisted = sorted({key for key in keys if key[1] and (key[0], key[1]) not in listed})
        if not unlisted:
            return

        def named(topic: str, broker: str) -> str:
            return ", ".join(f"{b}:{q}" for t, b, q in unlisted if (t, b) == (topic, broker))

        down = self.unavailable_brokers(MessageQueue(t, b, q) for t, b, q in unlisted)
        for topic, broker in sorted({(t, b) for t, b, _ in unlisted if b in down}):
            raise BrokerUnavailableError(
                f"pymq option {option} names queue(s) {named(topic, broker)} of topic {topic!r} on broker "
                f"{broker!r}, "
                f"which is down or not registered with the name servers now ({self.opts.backend.option}: "
                "the topic's route does not list it): the read would miss the messages it holds. Read "
                "again once the broker is back (it registers within 30 s of its start); "
                f"to read without its messages, leave its queues out of {option}"
            )

    # -- where a batch read ends ------------------------------------------------------------

    def ending_offsets(self, bounds: Mapping[MessageQueue, QueueBounds]) -> dict[MessageQueue, int]:
        """Exclusive end per queue of a batch read (``endingOffsets`` / ``endingTimestamp``)."""
        ending = self.opts.ending
        if ending.kind is StartKind.OFFSETS:
            self._check_queue_keys("endingOffsets", ending.offsets, bounds)
        if ending.kind is StartKind.TIMESTAMPS:
            self._check_queue_keys("endingOffsetsByTimestamp", ending.timestamps, bounds)
        out: dict[MessageQueue, int] = {}
        for mq in sorted(bounds):
            b = bounds[mq]
            if ending.kind is StartKind.TIMESTAMP:
                assert ending.timestamp_ms is not None
                out[mq] = self._search(mq, ending.timestamp_ms)
            elif ending.kind is StartKind.TIMESTAMPS:
                # as a queue left out of endingOffsets JSON: to its end; a time after the queue's
                # last message ends it there too (search_offset answers the max offset)
                time_ms = lookup(ending.timestamps, mq)
                out[mq] = b.max_offset if time_ms is None else self._search(mq, time_ms)
            elif ending.kind is StartKind.OFFSETS:
                given = lookup(ending.offsets, mq)
                out[mq] = b.max_offset if given is None or given == LATEST else given
            else:
                out[mq] = b.max_offset
            out[mq] = min(out[mq], b.max_offset)
        return out

    # -- progress -------------------------------------------------------------------------

    def commit(self, offsets: Mapping[MessageQueue, int], read_with: TopicIds | None = None) -> None:
        """Write ``offsets`` as the group's progress (CLUSTERING streams only), for the queues
        the brokers take now (:func:`committable`, after the last :meth:`bounds`); ``read_with``:
        the topic ids ``offsets`` were read with."""
        if self._readable is None:
            self.bounds(require_topics=False)
        kept = committable(self.backend, offsets, self._readable or set(), read_with or {}, self._topic_ids)
        if kept:
            self.backend.commit_offsets(self.opts.pull_group, kept)


def committable(
    backend: Backend, offsets: Mapping[MessageQueue, int], readable: Iterable[MessageQueue],
    read_with: TopicIds, now: TopicIds,
) -> dict[MessageQueue, int]:
    """The part of ``offsets`` the brokers take now, ``readable`` being the queues their topics read.

    A queue whose broker does not answer, or whose topic is gone from its broker, is left out.
    One cut by a scale-in of its topic's read queues is kept where the broker takes it
    (:attr:`Backend.takes_progress_of_unread_queues`: its progress is the end of what was read
    from it), and left out where the broker refuses a whole update that names it, which would
    hold back every other queue's progress. So are the queues of a topic created again since
    ``offsets`` were read (its id in ``read_with`` is not the one ``now``): they are offsets of
    the deleted topic, and would overwrite the group's progress on the new one.
    """
    readable = set(readable)
    stale = recreated_topics(read_with, now)
    if stale:
        logger.warning("pymq source: group progress of %s not committed: created again since its "
                       "offsets were read", ", ".join(f"{t}@{b}" for t, b in sorted(stale)))
    offsets = {mq: o for mq, o in offsets.items() if (mq.topic, mq.broker_name) not in stale}
    if not backend.takes_progress_of_unread_queues:
        return {mq: offset for mq, offset in offsets.items() if mq in readable}
    on_broker = {(mq.topic, mq.broker_name) for mq in readable}
    return {mq: offset for mq, offset in offsets.items() if (mq.topic, mq.broker_name) in on_broker}


def _check_queue_keys(
    option: str, offsets: Mapping[tuple[str, str, int], int], bounds: Iterable[MessageQueue]
) -> None:
    known = {(mq.topic, mq.broker_name, mq.queue_id) for mq in bounds}
    known_any = {(mq.topic, "", mq.queue_id) for mq in bounds}
    for key in offsets:
        if key not in known and key not in known_any:
            topic, broker, qid = key
            queues = sorted(f"{b}:{q}" for t, b, q in known if t == topic)
            why = None if queues else not_created_yet(topic)  # %RETRY%<consumerGroup>, read along
            raise ValueError(
                f"pymq option {option} names queue {broker + ':' if broker else ''}{qid} of "
                f"topic {topic!r}, which the broker does not have; "
                + (why if why else f"its queues are {', '.join(queues) or 'none'}")
            )


def _iso(time_ms: int) -> str:
    """``time_ms`` as a UTC time, for messages."""
    return datetime.fromtimestamp(time_ms / 1000, tz=timezone.utc).isoformat(timespec="milliseconds")

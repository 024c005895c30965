"""The streaming reader: ``spark.readStream.format("pymq")``.

Where each method runs (see the data source notes): ``initialOffset``,
``latestOffset``, ``partitions``, ``commit``, ``getDefaultReadLimit`` and
``prepareForTriggerAvailableNow`` run on the driver, in one long-lived source
runner process per query run, which keeps an :class:`OffsetReader` (gRPC
channels) between calls. ``read`` runs in tasks, on a copy of this reader
unpickled from its options only.

Offsets (see :mod:`.source_offset`) are ``{topic: {"broker:queueId": next
offset}}``. A new query starts from the ``INITIAL`` marker, resolved once by
the first ``latestOffset`` (the batch from the marker is empty), so a replay
of batch 0 after a crash reads exactly what the first run planned.

Progress: Spark calls ``commit(end)`` for a batch after it has planned the
**next** batch, and the last batch of a run is committed only by the next run
that finds new data. In CLUSTERING mode ``commit`` writes ``end`` to the broker
as the consumer group's progress, so the group's progress on the broker lags
Spark's checkpoint by one batch. The checkpoint stays the source of truth: a
restarted query resumes from it, not from the broker.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import replace
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)

from ..client.message import MessageQueue
from ..errors import PymqError
from .data_loss import report_data_loss
from .offset_range import Turn, limit_offsets, plan_ranges, split_ranges
from .offset_reader import OffsetReader, QueueBounds
from .options import SourceOptions
from .read_loop import make_partitions, read_partition
from .source_offset import (
    FROM_KEY,
    INITIAL,
    TopicIds,
    batch_start,
    is_initial,
    offsets_from_json,
    offsets_to_json,
    recreated_topics,
    topic_ids,
    topic_ids_from_json,
    with_start,
    with_topic_ids,
)
from .spark_errors import spark_call, spark_iterator

__all__ = ["PymqMicroBatchStream"]

logger = logging.getLogger("pyspark_pymq.spark")


class PymqMicroBatchStream(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Micro-batches of the query's MessageQueues (a Spark partition per queue range; small ranges
    of several queues share one)."""

    def __init__(self, options: SourceOptions) -> None:
        self._setup(options)

    def _setup(self, options: SourceOptions) -> None:
        self.options = options
        self._reader: OffsetReader | None = None
        self._target: dict[MessageQueue, int] | None = None  # Trigger.AvailableNow
        self._latest: dict[str, dict[str, int]] | None = None
        self._waiting_told: set[MessageQueue] = set()  # queues gone from their topic, warned about
        self._last_trigger: float | None = None  # monotonic s of the last end that was not held back
        self._turn = Turn()  # maxMessagesPerTrigger below the queues behind: round robin across triggers

    # Tasks get the options only: channels and driver state stay on the driver.
    def __getstate__(self) -> dict[str, Any]:
        return {"options": self.options}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._setup(state["options"])

    @property
    def offset_reader(self) -> OffsetReader:
        if self._reader is None:
            self._reader = OffsetReader(self.options)
        return self._reader

    # -- offsets (driver) -------------------------------------------------------------

    @spark_call
    def initialOffset(self) -> dict[str, Any]:
        """The INITIAL marker; the first ``latestOffset`` resolves startingOffsets.

        Checks the broker and the topics now, so that a wrong endpoint or topic
        fails the query at start.
        """
        self.offset_reader.bounds(require_topics=True)
        return dict(INITIAL)

    @spark_call
    def prepareForTriggerAvailableNow(self) -> None:
        """Trigger.AvailableNow: read up to what the queues hold now, then stop.

        A topic missing now is not an error here: a restarted query handles a
        deleted topic through failOnDataLoss, and a new one fails in initialOffset.
        """
        bounds, _ = self.offset_reader.bounds(require_topics=False)
        self._target = {mq: b.max_offset for mq, b in bounds.items()}

    def getDefaultReadLimit(self) -> ReadLimit:
        n = self.options.max_messages_per_trigger
        return ReadAllAvailable() if n is None else ReadMaxRows(n)

    def reportLatestOffset(self) -> dict[str, Any] | None:
        return self._latest

    @spark_call
    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        """The end of the next batch: ``start`` plus what ``limit`` allows.

        ``start`` equal to the result means "no new data" (Spark compares the
        JSON text). Topics or queues that disappeared and offsets below a
        queue's first message go through failOnDataLoss here, before anything
        is planned; new queues join at their first offset and are read from
        the next batch on.
        """
        reader = self.offset_reader
        if is_initial(start):
            bounds, _ = reader.bounds(require_topics=True)
            if self._target is not None:  # AvailableNow: "latest" means the target
                bounds = {
                    mq: replace(b, max_offset=min(b.max_offset, self._target[mq]))
                    for mq, b in bounds.items()
                    if mq in self._target
                }
            resolved = reader.starting_offsets(bounds)
            self._latest = offsets_to_json({mq: b.max_offset for mq, b in bounds.items()})
            self._last_trigger = time.monotonic()
            # Batch 0 reads from the resolved start on: no empty first batch.
            return with_start(self._end_offsets(resolved, {}, bounds, limit), resolved)

        current = offsets_from_json(start)
        # subscribePattern: the checkpoint's topics that still match are the query's, deleted or not
        bounds, missing = reader.bounds(require_topics=False, keep={mq.topic for mq in current})
        read_with = topic_ids_from_json(start)
        recreated = self._recreated(read_with, topic_ids(bounds))
        self._latest = offsets_to_json({mq: b.max_offset for mq, b in bounds.items()})
        fail = self.options.fail_on_data_loss

        kept: dict[MessageQueue, int] = {}
        waiting: dict[MessageQueue, int] = {}
        skipped: dict[MessageQueue, int] = {}  # expired offsets skipped: where their queues go on
        subscribed = set(reader.opts.all_topics())  # with subscribePattern: the topics matching now
        retry = self.options.retry_topic if self.options.retry_topic not in reader.opts.topics else None
        gone = [mq for mq in current if mq not in bounds and mq.topic in subscribed]
        down = reader.unavailable_brokers(gone) if gone else set()
        for mq, offset in sorted(current.items()):
            if mq.topic not in subscribed or not self.options.assigns(mq):
                # The options changed (topic list, consumerGroup, assign): the user's choice, not a
                # loss.
                logger.warning(
                    "pymq source: the checkpoint has offsets of %s, which the query no longer "
                    "reads (%s, consumerGroup=%s); dropping them",
                    mq, self.options.topic_option, self.options.consumer_group,
                )
                continue
            b = bounds.get(mq)
            if (mq.topic, mq.broker_name) in recreated:
                # The offset belongs to the deleted topic (reported once per topic in
                # _recreated): the new topic's queues are read from their first message, and
                # the old topic's queues it does not have are gone with it.
                if b is not None:
                    kept[mq] = skipped[mq] = b.min_offset
                continue
            if b is not None:
                self._waiting_told.discard(mq)
            if b is None and (mq.broker_name in down or mq.topic == retry):
                # A broker that is down (or restarting) still holds its queues: they wait
                # where they are and are read again once it is back, nothing is lost. A
                # %RETRY% queue can vanish from a restarted RocketMQ broker until the group
                # registers again (the offset reader does every REGISTER_INTERVAL_S).
                if mq not in self._waiting_told:  # once per outage: a long one must not flood the log
                    logger.warning("pymq source: %s is not in the route now (broker %s %s); it waits "
                                   "at offset %d", mq, mq.broker_name,
                                   "is unavailable" if mq.broker_name in down else "is back", offset)
                    self._waiting_told.add(mq)
                waiting[mq] = offset
                continue
            if b is None and mq.topic not in missing:
                # The topic is there with fewer read queues (RocketMQ's scale-in: write queues
                # cut first, read queues once drained). The queue's messages are still on the
                # broker: it waits where it is, and goes on if the queues are raised again
                # (dropping its offset would read it again from its first message then).
                if mq not in self._waiting_told:  # once: it may wait for good
                    logger.warning("pymq source: %s is not among topic %r's read queues now; it "
                                   "waits at offset %d", mq, mq.topic, offset)
                    self._waiting_told.add(mq)
                waiting[mq] = offset
                continue
            if b is None:
                report_data_loss(
                    fail,
                    f"queue {mq}: topic {mq.topic!r} was deleted; messages from offset {offset} on "
                    "may not have been read",
                    f"stop reading {mq}",
                )
                continue
            if offset < b.min_offset:
                report_data_loss(
                    fail,
                    f"queue {mq}: offsets [{offset}, {b.min_offset}) are no longer on the "
                    f"broker (its min offset is now {b.min_offset})",
                    f"skip {mq} to offset {b.min_offset}",
                )
                # skipped: read from its min offset on (the end says so under FROM_KEY, so the
                # batch and its replay plan from there), or maxMessagesPerTrigger would be spent
                # on offsets that are gone, batch after batch, and starve the other queues
                offset = skipped[mq] = b.min_offset
            kept[mq] = offset

        if self._holds_back(kept, bounds):
            limit = ReadMaxRows(0)  # no queue advances; a new queue still joins at its start
        end: dict[str, Any] = self._end_offsets(kept, waiting, bounds, limit, read_with)
        if FROM_KEY in start and end == {t: q for t, q in start.items() if t != FROM_KEY}:
            return start  # nothing new after a batch that skipped: the same JSON text, so no batch
        if skipped:
            end = with_start(end, skipped)
        return end

    def _holds_back(
        self, kept: Mapping[MessageQueue, int], bounds: Mapping[MessageQueue, QueueBounds]
    ) -> bool:
        """minMessagesPerTrigger (Kafka's minOffsetsPerTrigger): whether the next batch waits for
        more messages, which it does until maxTriggerDelay has passed since the last batch.
        Trigger.AvailableNow never waits: it has a fixed end to reach."""
        least = self.options.min_messages_per_trigger
        if least is None or self._target is not None:
            return False
        now = time.monotonic()
        delay_s = self.options.max_trigger_delay_ms / 1000
        if self._last_trigger is not None and now - self._last_trigger < delay_s:
            new = sum(max(0, bounds[mq].max_offset - offset) for mq, offset in kept.items() if mq in bounds)
            if new < least:
                return True
        self._last_trigger = now
        return False

    def _recreated(self, read_with: TopicIds, now: TopicIds) -> set[tuple[str, str]]:
        """The (topic, broker)s whose topic was deleted and created again since ``read_with``
        (the ids the start offset was read with): each goes through failOnDataLoss once here.

        A topic missing now, or without an id on either side (RocketMQ, an older checkpoint
        or broker), is not judged here: the offsets' own checks see what they can.
        """
        changed = recreated_topics(read_with, now)
        for topic, broker in sorted(changed):
            report_data_loss(
                self.options.fail_on_data_loss,
                f"topic {topic!r} on broker {broker} was deleted and created again since the "
                f"checkpoint's last batch (its id changed from {read_with[(topic, broker)]} to "
                f"{now[(topic, broker)]}): messages of the old topic not read by then are gone, "
                "and the new topic's offsets start again from 0",
                f"read the new topic {topic!r} from its first message",
            )
        return changed

    def _end_offsets(
        self, kept: Mapping[MessageQueue, int], waiting: Mapping[MessageQueue, int],
        bounds: Mapping[MessageQueue, QueueBounds], limit: ReadLimit, read_with: TopicIds | None = None,
    ) -> dict[str, Any]:
        """The next end: queues ``kept`` advance up to their max offset (or the target) within
        ``limit``, ``waiting`` ones stay, new queues join at their first offset; with the
        topic ids of ``bounds`` (see :mod:`.source_offset`), and those the start was read with
        (``read_with``) of topics whose queues wait on a broker that does not answer: without
        them, a topic created again during the outage was read at the old topic's offsets."""
        fail = self.options.fail_on_data_loss
        # Every queue still there stays in the offsets, at least where it is.
        end = {**kept, **waiting}
        available: dict[MessageQueue, int] = {}
        for mq, b in bounds.items():
            top = b.max_offset
            if self._target is not None:
                if mq not in self._target:
                    continue  # appeared after the AvailableNow target was taken
                top = min(top, self._target[mq])
            if mq not in kept:
                joins = self.offset_reader.joining_offset(mq, b)  # read from the next batch on
                if joins is not None:
                    end[mq] = joins
            elif b.max_offset < kept[mq]:
                report_data_loss(
                    fail,
                    f"queue {mq}: its offsets went back from {kept[mq]} to {b.max_offset} (was the "
                    "topic deleted and created again?)",
                    f"read {mq} again from its first offset",
                )
                end[mq] = top
            elif top < kept[mq]:
                # AvailableNow's target lies behind where the queue is (its expired offsets were
                # skipped past it): nothing to read, and the end stays, so the query can end
                end[mq] = kept[mq]
            else:
                available[mq] = top

        if isinstance(limit, ReadMaxRows):
            end.update(limit_offsets(kept, available, limit.max_rows, self._turn))
        else:
            end.update(available)
        ids = {**(read_with or {}), **topic_ids(bounds)}
        in_end = {(mq.topic, mq.broker_name) for mq in end}
        return with_topic_ids(offsets_to_json(end), {key: i for key, i in ids.items() if key in in_end})

    # -- planning (driver) ---------------------------------------------------------------

    @spark_call
    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        first = batch_start(start, end)
        if first is None:
            return []
        last = offsets_from_json(end)
        read_with = topic_ids_from_json(end)
        if read_with:
            # A batch replayed from the checkpoint (Spark plans it again without latestOffset)
            # after its topic was created again would read the new topic at the old offsets,
            # then the next batch the new topic from its start: its queues are left out here.
            recreated = self._recreated(read_with, self.offset_reader.topic_ids())
            first = {mq: o for mq, o in first.items() if (mq.topic, mq.broker_name) not in recreated}
            last = {mq: o for mq, o in last.items() if (mq.topic, mq.broker_name) not in recreated}
        ranges = plan_ranges(
            first,
            last,
            fail_on_data_loss=self.options.fail_on_data_loss,
        )
        ranges = split_ranges(
            ranges,
            min_partitions=self.options.min_partitions,
            max_per_partition=self.options.max_messages_per_partition,
        )
        return make_partitions(ranges, self.options)

    @spark_call
    def commit(self, end: dict[str, Any]) -> None:
        """CLUSTERING: write ``end`` as the group's progress (one batch late, see above)."""
        if not self.options.commits_progress or is_initial(end):
            return
        try:
            self.offset_reader.commit(offsets_from_json(end), topic_ids_from_json(end))
        except PymqError as err:
            # The checkpoint is the source of truth; a failed progress update only
            # delays what the broker shows (the next commit carries it).
            logger.warning("pymq source: could not commit group progress: %s", err)

    # -- reading (executors) -----------------------------------------------------------------

    @spark_iterator
    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return read_partition(self.options, partition)


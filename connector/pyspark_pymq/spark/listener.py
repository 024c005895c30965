"""RocketMQ-style message listeners for ``foreachBatch``: consume, and send failures back.

A listener is a plain Python function over a list of messages (RocketMQ's
``consumeMessage(List<MessageExt>)``), run on the executors. Its answer decides
each message's fate, as in RocketMQ:

- ``CONSUME_SUCCESS``: the row is returned in the DataFrame of successes;
- ``RECONSUME_LATER``, ``None`` or an exception: the message is sent back to
  ``%RETRY%<group>`` (with the exception kept in its properties) and returns
  later with a growing delay; after ``max_reconsume_times`` it goes to the DLQ.

Orderly mode (for ordered topics): each MessageQueue's messages are consumed by
one task, one at a time, in queue-offset order, however the read split them into
Spark partitions (the batch is repartitioned by queue first: one shuffle). A
failure is retried in place after ``suspend_current_queue_time_millis``, holding
back only the rest of that queue's messages in the batch, up to
``max_reconsume_times`` (then the DLQ).
BROADCASTING: failures are not retried, only counted and logged.

Example::

    from pyspark_pymq.spark.listener import ConsumeConcurrentlyStatus, MessageListener

    def handle(msgs):
        for m in msgs:
            charge(json.loads(m.body))
        return ConsumeConcurrentlyStatus.CONSUME_SUCCESS

    listener = MessageListener("127.0.0.1:8081", "billing", handle)

    def each_batch(df, batch_id):
        good = listener.process(df, batch_id)        # failures went back to %RETRY%billing
        good.write.format("delta").mode("append").save("/tables/orders")

    stream.writeStream.foreachBatch(each_batch).start()

A micro-batch completes only after its send backs are acknowledged; if one
cannot be done, the task (and so the batch) fails and is run again:
at-least-once, so a message may be processed twice — make the output
idempotent (Delta's txnAppId/txnVersion, MERGE on msg_id...).
"""

from __future__ import annotations

import enum
import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from pymq_proto.record import MessageConst as MC
from pymq_proto.topics import get_retry_topic

from ..backend.base import BackendConfig, backend_config, cached_backend, client_tls
from ..client.consumer import PullConsumer
from ..client.message import MessageExt, MessageQueue
from ..errors import PymqError, TopicNotExistError
from .option_registry import SINK_OPTIONS
from .rows import column, messages_from_batch, send_back_acknowledged
from .schema import source_schema
from .stop import interruptions_kept_short

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame

    from ..tls import TlsConfig

__all__ = [
    "ConsumeConcurrentlyStatus",
    "ConsumeOrderlyStatus",
    "ConsumeStats",
    "MessageListener",
]

log = logging.getLogger(__name__)


class ConsumeConcurrentlyStatus(enum.Enum):
    CONSUME_SUCCESS = "CONSUME_SUCCESS"
    RECONSUME_LATER = "RECONSUME_LATER"


class ConsumeOrderlyStatus(enum.Enum):
    SUCCESS = "SUCCESS"
    SUSPEND_CURRENT_QUEUE_A_MOMENT = "SUSPEND_CURRENT_QUEUE_A_MOMENT"


_OK = (ConsumeConcurrentlyStatus.CONSUME_SUCCESS, ConsumeOrderlyStatus.SUCCESS)
Listener = Callable[[list[MessageExt]], Any]


@dataclass
class ConsumeStats:
    """What one ``process`` call did."""

    consumed: int = 0
    reconsume_later: int = 0
    dead_letters: int = 0
    dropped: int = 0  # BROADCASTING failures (not retried)
    retried_in_place: int = 0  # orderly mode


@dataclass(frozen=True)
class _Config:
    backend: BackendConfig
    group: str
    orderly: bool
    broadcasting: bool
    batch_max_size: int
    max_reconsume_times: int | None
    suspend_ms: int
    delay_level: int


def _call(listener: Listener, msgs: list[MessageExt]) -> tuple[bool, str, str]:
    """(succeeded, exception class, message) of one listener call."""
    try:
        # a list of its own: one the listener empties (``msgs.pop()``) must not empty the record of
        # what it was given (RocketMQ hands it an unmodifiable list)
        status = listener(list(msgs))
    except Exception as err:  # an exception is RECONSUME_LATER, as in RocketMQ
        return False, type(err).__name__, str(err)[:2000]
    if status in _OK:
        return True, "", ""
    said = status.name if isinstance(status, enum.Enum) else repr(status)
    return False, "", f"listener returned {said}"


def _send_back(consumer: PullConsumer, cfg: _Config, failed: list[tuple[MessageExt, dict[str, str]]],
               level: int, stats: ConsumeStats) -> None:
    results = send_back_acknowledged(
        lambda done: consumer.send_back_batch([m for m, _ in failed], level, cfg.max_reconsume_times,
                                              [r for _, r in failed], done=done),
        len(failed),
        lambda items: f"{len(items)} message(s) the listener failed to %RETRY%{consumer.group}",
    )
    dead = sum(r.dead_letter for r in results)
    stats.dead_letters += dead
    stats.reconsume_later += len(results) - dead


def _stored(consumer: PullConsumer, m: MessageExt, topic: str) -> MessageExt:
    """``m`` as its broker stores it in the queue read (``topic``): a Spark row has no ``flag``,
    which RocketMQ's orderly copy keeps. ``m`` itself where it cannot be read again."""
    try:
        got = consumer.pull(MessageQueue(topic, m.broker_name, m.queue_id), m.queue_offset, 1).messages
    except PymqError:
        return m
    return got[0] if got and got[0].queue_offset == m.queue_offset else m


def _give_up(consumer: PullConsumer, m: MessageExt, reconsume_times: int, limit: int,
             reason: dict[str, str], stats: ConsumeStats) -> None:
    """An orderly message over its limit: to the DLQ with its in-place retries counted, as
    RocketMQ's orderly consumer sends it (a send back would count the stored message's)."""
    send_back_acknowledged(
        lambda _: [consumer.send_back_orderly(m, reconsume_times, limit, reason)], 1,
        lambda _: f"message {m.msg_id} the orderly listener gave up on to %DLQ%{consumer.group}",
    )
    stats.dead_letters += 1


def _reason(exc_class: str, text: str, batch_id: str) -> dict[str, str]:
    return {
        MC.PROPERTY_CONSUME_FAILURE_REASON: text,
        MC.PROPERTY_CONSUME_FAILURE_EXCEPTION: exc_class,
        MC.PROPERTY_CONSUME_FAILURE_STAGE: "listener",
        MC.PROPERTY_CONSUME_FAILURE_BATCH_ID: batch_id,
    }


def consume_partition(
    cfg: _Config, listener: Listener, batches: Iterator[pa.RecordBatch], batch_id: str,
    stats: ConsumeStats,
) -> Iterator[pa.RecordBatch]:
    """The executor side: yields the rows whose messages were consumed."""
    import pyarrow as pa

    consumer = PullConsumer(group=cfg.group, backend=cached_backend(cfg.backend))
    for batch in batches:
        messages = messages_from_batch(batch)
        ok = [False] * len(messages)
        if cfg.orderly:
            # the queue read: a retried message's topic column holds its original topic
            read_from = [r or t for r, t in
                         zip(column(batch, "retry_topic"), column(batch, "topic"), strict=True)]
            _consume_orderly(cfg, consumer, listener, messages, read_from, ok, batch_id, stats)
        else:
            failed: list[tuple[MessageExt, dict[str, str]]] = []
            step = cfg.batch_max_size
            for start in range(0, len(messages), step):
                chunk = messages[start : start + step]
                success, exc_class, text = _call(listener, chunk)
                if success:
                    ok[start : start + len(chunk)] = [True] * len(chunk)
                    stats.consumed += len(chunk)
                elif cfg.broadcasting:
                    stats.dropped += len(chunk)
                    log.warning("BROADCASTING: %d message(s) failed and are not retried: %s",
                                len(chunk), text)
                else:
                    failed.extend((m, _reason(exc_class, text, batch_id)) for m in chunk)
            if failed:
                _send_back(consumer, cfg, failed, cfg.delay_level, stats)
        if any(ok):
            yield batch.filter(pa.array(ok, type=pa.bool_()))


def _consume_orderly(
    cfg: _Config, consumer: PullConsumer, listener: Listener, messages: list[MessageExt],
    read_from: list[str], ok: list[bool], batch_id: str, stats: ConsumeStats,
) -> None:
    """Per queue read (``read_from[i]``: its topic), in offset order; a failure blocks only its queue."""
    by_queue: dict[tuple[str, str, int], list[int]] = {}
    for i, m in enumerate(messages):
        by_queue.setdefault((read_from[i], m.broker_name, m.queue_id), []).append(i)
    limit = cfg.max_reconsume_times
    for indexes in by_queue.values():
        indexes.sort(key=lambda i: messages[i].queue_offset)
        for i in indexes:
            m = messages[i]
            attempts = 0
            while True:
                # each retry in place counts, as RocketMQ's checkReconsumeTimes raises the message's
                # reconsumeTimes before it: a listener may give up on its own (``reconsume_times >= n``)
                tried = m if attempts == 0 else replace(m, reconsume_times=m.reconsume_times + attempts)
                success, exc_class, text = _call(listener, [tried])
                if success:
                    ok[i] = True
                    stats.consumed += 1
                    break
                attempts += 1
                if limit is not None and m.reconsume_times + attempts > limit:
                    _give_up(consumer, _stored(consumer, m, read_from[i]), m.reconsume_times + attempts - 1,
                             limit, _reason(exc_class, text, batch_id), stats)
                    break
                stats.retried_in_place += 1
                time.sleep(cfg.suspend_ms / 1000.0)


class MessageListener:
    """Run a RocketMQ-style listener over a micro-batch read from a pymq source.

    Args:
        endpoint: ``host:port`` of a pymq broker.
        consumer_group: the group whose %RETRY% / %DLQ% topics take failures
            (the source's ``consumerGroup``).
        listener: ``f(list[MessageExt]) -> ConsumeConcurrentlyStatus`` (or
            ``ConsumeOrderlyStatus`` in orderly mode); ``None`` and exceptions
            mean RECONSUME_LATER.
        orderly: consume each queue's messages one at a time in offset order, in one
            task, and retry failures in place instead of sending them back (the batch
            is repartitioned by queue first, so ``minPartitions`` and
            ``maxMessagesPerPartition`` on the read cannot split a queue across tasks).
        message_model: ``"CLUSTERING"`` (default) or ``"BROADCASTING"`` (failures
            are counted and logged, not retried).
        consume_message_batch_max_size: messages per listener call (1).
        max_reconsume_times: retries before the DLQ (default: the group's
            ``retryMaxTimes``, 16, on a pymq broker; 16 on Apache RocketMQ, as its push
            consumer sends; orderly default: unlimited, as in RocketMQ).
        suspend_current_queue_time_millis: orderly retry pause (1000).
        delay_level: delay of a sent-back message (0: RocketMQ's 3 + retries).
        namesrv_addr: Apache RocketMQ instead of ``endpoint``
            (``MessageListener(None, group, f, namesrv_addr="host:9876")``).
        access_key, secret_key: ACL credentials (a user of the broker; requests are signed).
        tls, tls_ca_file, tls_cert_file, tls_key_file: TLS to the broker (as Producer's).
    """

    def __init__(
        self,
        endpoint: str | None,
        consumer_group: str,
        listener: Listener,
        *,
        namesrv_addr: str | None = None,
        access_key: str | None = None,
        secret_key: str | None = None,
        tls: bool | TlsConfig | None = None,
        tls_ca_file: str | None = None,
        tls_cert_file: str | None = None,
        tls_key_file: str | None = None,
        orderly: bool = False,
        message_model: str = "CLUSTERING",
        consume_message_batch_max_size: int = 1,
        max_reconsume_times: int | None = None,
        suspend_current_queue_time_millis: int = 1000,
        delay_level: int = 0,
    ) -> None:
        if not callable(listener):
            raise TypeError(f"listener must be callable, got {type(listener).__name__}")
        if message_model not in ("CLUSTERING", "BROADCASTING"):
            raise ValueError(f"message_model must be CLUSTERING or BROADCASTING, got {message_model!r}")
        size = consume_message_batch_max_size
        if not isinstance(size, int) or not 1 <= size <= 1024:
            raise ValueError(
                "consume_message_batch_max_size must be an int in 1..1024, got "
                f"{consume_message_batch_max_size!r}"
            )
        if max_reconsume_times is not None and (
            not isinstance(max_reconsume_times, int) or max_reconsume_times < 1
        ):
            # checked here, not at the first failed message: there it would fail a Spark task
            # after the listener had already run over the partition
            raise ValueError(
                "max_reconsume_times must be an int >= 1 (None: the group's retryMaxTimes), got "
                f"{max_reconsume_times!r}"
            )
        levels = SINK_OPTIONS["delayLevel"]  # the sink's own bounds for a send back's level
        assert levels.minimum is not None and levels.maximum is not None
        if isinstance(delay_level, bool) or not isinstance(delay_level, int) or not (
            levels.minimum <= delay_level <= levels.maximum
        ):
            raise ValueError(
                f"delay_level must be an int in {levels.minimum}..{levels.maximum} (-1: straight to the "
                f"DLQ, 0: RocketMQ's 3 + retries), got {delay_level!r}"
            )
        if suspend_current_queue_time_millis < 0:
            raise ValueError(
                f"suspend_current_queue_time_millis must be >= 0, got {suspend_current_queue_time_millis}"
            )
        self.listener = listener
        self.config = _Config(
            backend=backend_config(endpoint, namesrv_addr, access_key, secret_key,
                                   client_tls(tls, tls_ca_file, tls_cert_file, tls_key_file)),
            group=consumer_group,
            orderly=orderly,
            broadcasting=message_model == "BROADCASTING",
            batch_max_size=consume_message_batch_max_size,
            max_reconsume_times=max_reconsume_times,
            suspend_ms=suspend_current_queue_time_millis,
            delay_level=delay_level,
        )
        self.last_stats = ConsumeStats()
        self._results: list[tuple[str, DataFrame]] = []  # (batch id, result) until a later batch
        self._group_looked_at = False

    def process(self, df: DataFrame, batch_id: int | str = "") -> DataFrame:
        """Consume ``df`` (rows of a pymq source) once; return the rows consumed successfully.

        The work runs exactly once, here: the result is checkpointed locally (memory, then disk),
        so writing the returned DataFrame never runs the listener again. A ``process`` with
        another ``batch_id`` (the next micro-batch's) releases the results of the earlier ones,
        as :meth:`release` does: write a result before the next batch. A released result fails
        when read (Spark's CHECKPOINT_RDD_BLOCK_ID_NOT_FOUND) rather than consume its messages
        again. One listener per query.
        """
        missing = [name for name in source_schema().names if name not in df.columns]
        if missing:  # else the listener would get messages with those fields empty
            raise ValueError(
                f"MessageListener.process needs every column of the pymq source (listeners get whole "
                f"messages); the DataFrame lacks {missing}: read it without .schema(...) or keep them"
            )
        import pyarrow as pa
        from pyspark.sql import functions as F
        from pyspark.sql.types import ArrayType, LongType, StructField, StructType

        cfg, listener, bid = self.config, self.listener, str(batch_id)
        names = list(ConsumeStats.__dataclass_fields__)
        if cfg.orderly:
            df = _by_queue(df)
        # Each partition's counts come back as one more row, in a column of their own (every
        # other column null), not through accumulators: Spark Connect has none (no SparkContext).
        counts = pa.field(_STATS_COLUMN, pa.list_(pa.int64()))

        def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
            stats = ConsumeStats()
            schemas: list[pa.Schema] = []

            def noted(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
                for batch in batches:
                    if not schemas:
                        schemas.append(batch.schema)
                    yield batch

            for good in consume_partition(cfg, listener, noted(batches), bid, stats):
                yield good.append_column(counts, pa.nulls(good.num_rows, counts.type))
            if schemas:
                totals = pa.array([[getattr(stats, n) for n in names]], counts.type)
                yield pa.RecordBatch.from_arrays([pa.nulls(1, f.type) for f in schemas[0]] + [totals],
                                                 schema=schemas[0].append(counts))

        self._warn_if_no_consumer_of_the_group()
        marked = StructType([*df.schema.fields, StructField(_STATS_COLUMN, ArrayType(LongType()))])
        # A query.stop() that interrupts these jobs: a short error, which Spark takes for the stop
        # (the Java stack trace in a Py4J error overflows Spark's regex for it: .stop).
        with interruptions_kept_short():
            # Earlier batches' results are written by now. Left to the JVM's garbage collection,
            # their blocks stayed: a soak held 83 of them, 925 MB of storage memory. A cache
            # (persist) in their place would run the listener again, silently, for a result read
            # after its release.
            self._release(keep=bid)
            done = df.mapInArrow(run, marked).localCheckpoint(eager=True)  # the listener runs here, once
            self._results.append((bid, done))
            row = done.where(F.col(_STATS_COLUMN).isNotNull()).agg(
                *[F.sum(F.col(_STATS_COLUMN)[i]).alias(n) for i, n in enumerate(names)]).first()
        self.last_stats = ConsumeStats(**{n: int(row[n] or 0) if row is not None else 0 for n in names})
        log.info("pymq listener batch %s: %s", bid, self.last_stats)
        return done.where(F.col(_STATS_COLUMN).isNull()).drop(_STATS_COLUMN)

    def _warn_if_no_consumer_of_the_group(self) -> None:
        """Once, before the first send back: a group whose consumers registered with the brokers has
        its %RETRY% topic (their heartbeat makes it, as RocketMQ's). Without it, nothing reads what
        this listener sends back: a listener whose group was misspelt ('billng' for the stream's
        'billing') sent every failure where no stream read it, and nothing said so."""
        cfg = self.config
        if self._group_looked_at or cfg.broadcasting:  # BROADCASTING sends nothing back
            return
        self._group_looked_at = True
        retry = get_retry_topic(cfg.group)
        try:
            cached_backend(cfg.backend).route(retry, refresh=True)
        except TopicNotExistError:
            log.warning(
                "MessageListener of consumer group %r: no consumer of the group has registered with %s "
                "(%s does not exist), so the messages it sends back come back only to a stream whose "
                "consumerGroup is %r. If the stream reading these rows has another consumerGroup, give "
                "the listener that one", cfg.group, cfg.backend.where, retry, cfg.group)
        except PymqError:
            pass  # the brokers cannot say now: the sends back will tell what is wrong, if anything

    def release(self) -> None:
        """Free what the results of :meth:`process` hold in Spark's storage (the next micro-batch's
        ``process`` frees the earlier batches' anyway)."""
        self._release(keep=None)

    def _release(self, keep: str | None) -> None:
        for bid, result in self._results:
            if bid != keep:
                _free_local_checkpoint(result)
        self._results = [(bid, result) for bid, result in self._results if bid == keep]


def _free_local_checkpoint(result: DataFrame) -> None:
    """Unpersist the RDD behind a local checkpoint (classic Spark). Under Spark Connect the server
    frees it once no DataFrame of the client refers to it any more."""
    jdf = getattr(result, "_jdf", None)
    if jdf is None:
        return
    try:
        jdf.queryExecution().logical().rdd().unpersist(False)
    except Exception as err:  # a Spark without a LogicalRDD there: its garbage collection frees it
        log.debug("pymq listener: could not free a result's checkpoint: %s", err)


_STATS_COLUMN = "__pymq_listener_stats"


def _by_queue(df: DataFrame) -> DataFrame:
    """``df`` with each MessageQueue's rows in one partition, in queue-offset order.

    The read may split a queue's range over several partitions (``minPartitions``,
    ``maxMessagesPerPartition``) that run at once; RocketMQ's orderly consumers hold a
    queue's lock instead. As many partitions as Spark runs tasks at once (a number, so
    that adaptive execution does not coalesce them into one).
    """
    from pyspark.sql import functions as F

    queue = [F.coalesce(F.col("retry_topic"), F.col("topic")), F.col("broker_name"), F.col("queue_id")]
    spark = df.sparkSession
    try:
        tasks = spark.sparkContext.defaultParallelism
    except AttributeError:  # Spark Connect: no SparkContext (its PySparkAttributeError)
        conf = (spark.conf.get("spark.default.parallelism", None)
                or spark.conf.get("spark.sql.shuffle.partitions", None))
        tasks = int(conf) if conf and str(conf).isdigit() else 2
    return df.repartition(max(1, tasks), *queue).sortWithinPartitions(*queue, F.col("queue_offset"))

"""``format("pymq")``: the PySpark data source of pymq."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pyspark.sql.datasource import DataSource

from .options import SourceOptions, parse_source_options
from .schema import SOURCE_DDL, source_schema
from .views import VIEWS, ViewReader, parse_view_options, view_requested

if TYPE_CHECKING:
    from pyspark.sql.types import StructType

    from .batch_reader import PymqBatchReader
    from .micro_batch_stream import PymqMicroBatchStream
    from .writer import PymqSinkWriter, PymqStreamSinkWriter

__all__ = ["PymqDataSource"]


class PymqDataSource(DataSource):
    """Read a pymq broker or an Apache RocketMQ cluster from Spark, as a stream or a batch, and write to it.

    ``format("pymq")`` works once ``pyspark_pymq`` is installed (Spark finds
    ``pyspark_pymq.DefaultSource``); ``spark.dataSource.register(PymqDataSource)``
    works too.

    Each MessageQueue (topic, broker name, queue id) with data in a batch is one
    Spark partition (large ranges may be split). Offsets are kept in Spark's
    checkpoint as ``{topic: {"brokerName:queueId": next offset}}``.

    Options (names are case-insensitive; all are checked before the query starts):

    ========================  ==========================================================
    endpoint                  ``host:port`` of a pymq broker (the embedded broker).
    namesrvAddr               instead of ``endpoint``: Apache RocketMQ's name servers,
                              ``host:9876;host2:9876``. Exactly one of the two.
    accessKey, secretKey      RocketMQ ACL credentials (with ``namesrvAddr``): every
                              request is signed; the secret never shows in plans or logs.
    topic                     required. One topic or a comma-separated list.
    consumerGroup             the consumer group. Required for streams in CLUSTERING;
                              batch reads need none.
    messageModel              ``CLUSTERING`` (default): progress is written to the
                              broker as the group's, retries are read along.
                              ``BROADCASTING``: nothing is written to the broker,
                              no retries.
    subscription              tag expression: ``*`` (default) or ``TagA || TagB``; with
                              ``subscriptionType=SQL92`` a property filter such as
                              ``amount > 100 AND region IN ('eu')`` (the broker
                              needs ``--enable-property-filter``).
    subscriptionType          ``TAG`` (default) or ``SQL92``.
    startingOffsets           ``group`` (streams in CLUSTERING, default): the group's
                              progress on the broker, else ``consumeFromWhere``;
                              ``earliest`` (batch default); ``latest``; or JSON
                              ``{"orders": {"broker-a:0": 42}}`` (-2 earliest,
                              -1 latest; unlisted queues start at earliest).
    startingTimestamp         ms since the epoch: start at the first message stored
                              at or after it (instead of startingOffsets).
    consumeFromWhere          where ``group`` starts on queues without progress:
                              ``CONSUME_FROM_LAST_OFFSET`` (default),
                              ``CONSUME_FROM_FIRST_OFFSET``,
                              ``CONSUME_FROM_TIMESTAMP`` (+ ``consumeTimestamp`` ms).
    endingOffsets             batch only: ``latest`` (default) or JSON (-1 latest).
    endingTimestamp           batch only: stop before messages stored at or after it.
    lastMessagesPerQueue      batch only: the last N messages of each queue.
    maxMessagesPerTrigger     streams only: at most N messages (queue offsets) per
                              micro-batch, shared by backlog; Trigger.AvailableNow
                              honours it over several batches.
    failOnDataLoss            ``true`` (default): fail when messages to read are gone
                              (retention, deleted topic); ``false``: log, skip ahead.
    includeRetry              read ``%RETRY%<consumerGroup>`` too (default true for
                              streams in CLUSTERING, false otherwise).
    pullBatchSize             at most this many messages per pull (default 32768,
                              at most 100000).
    pullMaxBytes              at most this many bytes per pull (default 1048576;
                              ~1 MiB answers are the fastest over gRPC).
    pollTimeoutMs             timeout of one pull in a task (default 60000).
    connectTimeoutMs          timeout of the driver's calls (default 10000): an
                              unreachable broker fails the query within it.
    minPartitions             split ranges to get at least this many partitions.
    maxMessagesPerPartition   split ranges larger than this.
    ========================  ==========================================================

    Schema (``SOURCE_DDL``)::

        topic string, queue_id int, broker_name string, queue_offset bigint,
        msg_id string, offset_msg_id string, commit_log_offset bigint, tags string,
        keys array<string>, body binary, properties map<string,string>,
        born_timestamp timestamp, store_timestamp timestamp, reconsume_times int,
        retry_topic string

    A message read from ``%RETRY%<group>`` shows its original topic in ``topic``
    and the retry topic in ``retry_topic``.

    Progress: Spark calls ``commit`` for a micro-batch after it has planned the
    next one, so the group's progress on the broker lags Spark's checkpoint by
    one batch (the last batch of a run is committed by the next run). The
    checkpoint is the source of truth.

    Example::

        df = (spark.readStream.format("pymq")
              .option("endpoint", "127.0.0.1:8081")
              .option("topic", "orders")
              .option("consumerGroup", "analytics")
              .option("maxMessagesPerTrigger", 100000)
              .load())
        df.selectExpr("CAST(body AS STRING)", "tags").writeStream \\
            .format("parquet").option("checkpointLocation", "/tmp/ckpt") \\
            .trigger(availableNow=True).start("/tmp/out")

    Broker tables as DataFrames (see :mod:`pyspark_pymq.spark.views`): the option
    ``view`` = ``topics`` | ``queues`` | ``groups`` | ``lag`` | ``deadLetters``::

        spark.read.format("pymq").option("endpoint", ep).option("view", "lag") \\
            .option("consumerGroup", "analytics").load().show()

    Example::

        last10 = (spark.read.format("pymq")
                  .option("endpoint", "127.0.0.1:8081")
                  .option("topic", "%DLQ%analytics")
                  .option("lastMessagesPerQueue", 10)
                  .load())

    Writing (``df.write`` / ``df.writeStream``): columns ``body`` (required),
    ``topic``, ``tags``, ``keys``, ``properties``, ``delay_level``, ``sharding_key``,
    ``queue_id``; options:

    ==============================  ====================================================
    endpoint                        ``host:port`` of a pymq broker, or
    namesrvAddr                     Apache RocketMQ's name servers (exactly one);
    accessKey, secretKey            RocketMQ ACL credentials (with ``namesrvAddr``).
    topic                           the topic when there is no ``topic`` column.
    action                          ``send`` (default) or ``reconsumeLater``: rows read
                                    from pymq go back to ``%RETRY%<consumerGroup>``.
    sendMode                        ``sync`` (default), ``async`` (the task still waits
                                    for every answer) or ``oneway`` (lossy).
    deliveryGuarantee               ``at-least-once`` (default) or ``exactly-once``
                                    (streams: rows are half messages committed with
                                    the micro-batch; see
                                    :mod:`pyspark_pymq.spark.transactional_sink`;
                                    pymq endpoint only for now).
    producerGroup                   PGROUP (default ``PYMQ_SPARK_SINK``; exactly-once:
                                    one per checkpoint).
    retryTimesWhenSendFailed        2; ``retryTimesWhenSendAsyncFailed`` 0.
    sendMsgTimeoutMs                3000 per request.
    maxInFlight                     4 unanswered async or oneway batches per task.
    maxBatchBytes                   4 MiB per batch of messages.
    consumerGroup                   ``reconsumeLater``: whose ``%RETRY%`` topic.
    maxReconsumeTimes, delayLevel   ``reconsumeLater``: retries before the DLQ (the
                                    group's), and the delay (0: 3 + retries; -1: DLQ).
    ==============================  ====================================================

    Example::

        (df.selectExpr("CAST(id AS STRING) AS keys", "to_json(struct(*)) AS body")
           .writeStream.format("pymq").option("endpoint", "127.0.0.1:8081")
           .option("topic", "orders").option("deliveryGuarantee", "exactly-once")
           .option("checkpointLocation", "/chk/orders-out").start())
    """

    @classmethod
    def name(cls) -> str:
        return "pymq"

    def schema(self) -> StructType | str:
        # Spark calls schema() at load() for reads only (never for writes), before
        # it says stream or batch: check what does not depend on that, so most
        # option mistakes fail at load() rather than when the query starts.
        if view_requested(self.options):
            return VIEWS[parse_view_options(dict(self.options)).view]
        parse_source_options(dict(self.options), stream=None)
        return source_schema()

    def _source_options(self, schema: StructType | None, *, stream: bool) -> SourceOptions:
        if schema is not None and schema != source_schema():
            raise ValueError(
                "the pymq source has a fixed schema; remove .schema(...) and select or cast "
                f"columns after load(). Its schema is: {SOURCE_DDL}"
            )
        return parse_source_options(dict(self.options), stream=stream)

    def reader(self, schema: StructType) -> PymqBatchReader | ViewReader:
        from .batch_reader import PymqBatchReader

        if view_requested(self.options):
            return ViewReader(parse_view_options(dict(self.options)))

        return PymqBatchReader(self._source_options(schema, stream=False))

    def streamReader(self, schema: StructType) -> PymqMicroBatchStream:
        from .micro_batch_stream import PymqMicroBatchStream

        if view_requested(self.options):
            raise ValueError("pymq views (option view) are tables for spark.read, not streams")

        return PymqMicroBatchStream(self._source_options(schema, stream=True))

    # -- the sink -------------------------------------------------------------------

    def writer(self, schema: StructType, overwrite: bool) -> PymqSinkWriter:
        """``df.write.format("pymq")``: see :mod:`pyspark_pymq.spark.writer`."""
        from .sink_options import parse_sink_options
        from .writer import PymqSinkWriter

        if overwrite:  # Spark's own error for the default mode suggests "Overwrite": say why not
            raise ValueError(
                "pymq sink: mode('overwrite') would have to remove the messages a topic already "
                "holds, and a topic is append-only; write with .mode('append')"
            )
        return PymqSinkWriter(parse_sink_options(dict(self.options), schema, stream=False))

    def streamWriter(self, schema: StructType, overwrite: bool) -> PymqStreamSinkWriter:
        """``df.writeStream.format("pymq")``: see :mod:`pyspark_pymq.spark.writer`."""
        from .sink_options import parse_sink_options
        from .writer import PymqStreamSinkWriter

        options = parse_sink_options(dict(self.options), schema, stream=True)
        if options.exactly_once:
            from .transactional_sink import TransactionalStreamSinkWriter

            return TransactionalStreamSinkWriter(options)
        return PymqStreamSinkWriter(options)

"""``format("pymq")``: the PySpark data source of pymq."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition

from .options import SourceOptions, parse_source_options
from .schema import select_columns, source_schema
from .spark_errors import spark_call, spark_iterator
from .views import VIEWS, ViewReader, check_view_schema, parse_view_options, view_requested

if TYPE_CHECKING:
    from pyspark.sql.streaming.datasource import ReadLimit
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

    Options of a read, below; of a write and of a broker table, further down. Names and
    keyword values are case-insensitive, and every option is checked before the query starts.
    These lists are rendered from :mod:`pyspark_pymq.spark.option_registry` (run
    ``python -m pyspark_pymq.spark.option_docs`` after changing it; it rewrites README.md too).

    .. options:source:begin

    ``endpoint``
        (string; ``endpoint`` or ``namesrvAddr`` required; pymq only) ``host:port`` of a pymq broker:
        the address ``pymq-broker`` prints (``pymq broker listening on HOST:PORT``) or
        ``EmbeddedBroker.endpoint``. Set exactly one of ``endpoint`` and ``namesrvAddr``.

    ``namesrvAddr``
        (string; ``endpoint`` or ``namesrvAddr`` required; RocketMQ only) Apache RocketMQ's name
        servers, ``host:9876;host2:9876`` (see "Use with Apache RocketMQ" in README.md): requests go to
        the brokers of each topic's route.

    ``accessKey``
        (string) ACL access key (a user of the broker), with ``secretKey`` (both or neither): every
        request is signed, to a pymq broker as RocketMQ 5's gRPC clients sign (``MQv2-HMAC-SHA1``), to
        Apache RocketMQ as its ``AclClientRPCHook`` does.

    ``secretKey``
        (string) ACL secret key, with ``accessKey``; it never shows in plans, logs or error messages
        (under Spark Connect see ``secretKeyFile``).

    ``secretKeyFile``
        (string) instead of ``secretKey``: a file whose first line is the ACL secret key, read on the
        driver when the query is planned. The secret is then in no option: a Spark Connect server, which
        records each request's options in its event log and UI, never sees it.

    ``tls``
        (boolean; default ``false``) encrypt connections with TLS and verify the broker's certificate
        and host name (or IP address) against ``tlsCaFile``, or the system's trust store without it.

    ``tlsCaFile``
        (string) with ``tls=true``: PEM file of the certificate authorities to trust (a self-signed
        broker certificate or its CA). The file must be readable on the driver and every executor.

    ``tlsCertFile``
        (string) with ``tls=true`` and ``tlsKeyFile``: PEM certificate chain this client presents
        (mutual TLS).

    ``tlsKeyFile``
        (string) with ``tls=true`` and ``tlsCertFile``: the client certificate's PEM private key
        (unencrypted).

    ``topic``
        (comma-separated list; ``topic``, ``subscribePattern`` or ``assign`` required) one topic or a
        comma-separated list (``orders,payments``; a topic named twice is read once). Names are 1-127
        letters, digits, ``%``, ``|``, ``_`` or ``-``, so ``%RETRY%<group>`` and ``%DLQ%<group>`` can be
        read too.

    ``subscribePattern``
        (string; ``topic``, ``subscribePattern`` or ``assign`` required) the topics whose whole name
        matches this regular expression (Spark's Kafka option; Python's ``re`` syntax, which agrees with
        Java's for the usual ``orders-.*`` or ``(orders|payments)_eu``). A stream looks for matching
        topics at every trigger and reads a new one from its first message (one deleted goes through
        ``failOnDataLoss``); a batch read takes those there are when it is planned (none: no rows).
        System topics (``%RETRY%``, ``%DLQ%``, ``RMQ_SYS_*``, ``SCHEDULE_TOPIC_XXXX``, ``TBW102``, ...)
        never match. Instead of ``topic``; listing topics needs the broker's LIST permission where users
        are on.

    ``assign``
        (JSON; ``topic``, ``subscribePattern`` or ``assign`` required) some queues of some topics, and
        only those (Spark's Kafka option; RocketMQ's ``DefaultLitePullConsumer.assign``): ``{"orders":
        ["broker-a:0", "broker-a:1"], "payments": [2]}`` (a bare queue id: that queue on any broker).
        Queries that split a topic's queues between them can share a ``consumerGroup``: each commits the
        progress of its own queues; before another query takes a queue over from the group's progress,
        write the last batch of the query that read it (``commit_group_progress``: a stopped query's
        last batch is not committed). No retries are read along unless named:
        ``%RETRY%<consumerGroup>``'s queues in one query's ``assign`` are read as ``includeRetry`` reads
        them (which is refused with ``assign``). A named queue the topic does not have fails the query
        at its start, and is logged once when a stream restarted from its checkpoint finds it missing;
        one gone mid-stream waits, as any queue a topic no longer reads. Instead of ``topic`` and
        ``subscribePattern``.

    ``consumerGroup``
        (string) the consumer group: 1-127 letters, digits, ``|``, ``_`` or ``-``. Required for streams
        in CLUSTERING, whose progress on the broker is the group's; batch reads need none (their pulls
        carry ``PYMQ_SPARK_READER``, or RocketMQ's ``TOOLS_CONSUMER`` on RocketMQ, under which nothing
        is committed).

    ``messageModel``
        (one of ``CLUSTERING``, ``BROADCASTING``; default ``CLUSTERING``) ``CLUSTERING``: Spark's
        commits of a stream become the group's progress on the broker, and retries are read along.
        ``BROADCASTING``: nothing is written to the broker and there are no retries; progress lives in
        Spark's checkpoint only.

    ``subscription``
        (string; default ``*``) which messages, filtered on the broker: a tag expression such as ``*``
        or ``TagA || TagB``; with ``subscriptionType=SQL92`` a filter on user properties such as
        ``amount > 100 AND region IN ('eu')``.

    ``subscriptionType``
        (one of ``TAG``, ``SQL92``; default ``TAG``) how ``subscription`` is read: ``TAG``, a tag
        expression; ``SQL92``, RocketMQ's filter on user properties. Before the query starts its syntax
        is checked and each broker asked whether it serves SQL92 (RocketMQ's CHECK_CLIENT_CONFIG): the
        broker must allow it, ``pymq-broker --enable-property-filter``, or ``enablePropertyFilter=true``
        on RocketMQ.

    ``startingOffsets``
        (keyword or JSON; default streams: ``group`` (CLUSTERING); batch: ``earliest``) where reading
        starts. ``group``: the group's progress on the broker, else ``consumeFromWhere`` (CLUSTERING
        only); ``earliest``; ``latest`` (streams: a batch read would read nothing); or JSON ``{"orders":
        {"broker-a:0": 42, "broker-a:1": -2}}`` (-2 earliest, -1 latest, streams only; a key ``"1"``
        means queue 1 on any broker; unlisted queues start at earliest), naming the query's topics and,
        with ``includeRetry``, ``%RETRY%<consumerGroup>``; an offset before a queue's first message or
        past its end goes through ``failOnDataLoss``. A BROADCASTING stream without it starts where
        ``consumeFromWhere`` says.

    ``startingTimestamp``
        (integer >= 0) milliseconds since the epoch: each queue starts at its first message stored at or
        after it; one without such a message starts at its end (see
        ``startingOffsetsByTimestampStrategy``). Instead of ``startingOffsets``,
        ``startingOffsetsByTimestamp`` and ``lastMessagesPerQueue``.

    ``startingOffsetsByTimestamp``
        (JSON) a time per queue, in milliseconds since the epoch, keyed as ``startingOffsets`` JSON
        (Spark's Kafka option): ``{"orders": {"broker-a:0": 1700000000000, "1": 1700000060000}}``; each
        queue named starts at its first message stored at or after its time, unlisted queues start at
        earliest (as in ``startingOffsets`` JSON). It names the query's topics and, with
        ``includeRetry``, ``%RETRY%<consumerGroup>``. Instead of ``startingOffsets``,
        ``startingTimestamp`` and ``lastMessagesPerQueue``.

    ``startingOffsetsByTimestampStrategy``
        (one of ``error``, ``latest``; default ``error`` with ``startingOffsetsByTimestamp`` (Kafka's
        default); ``latest`` with ``startingTimestamp``) what a queue does that has no message stored at
        or after its starting time: ``error`` fails the query naming the topic, the queue and the time
        (an empty queue too, as Kafka's); ``latest`` starts it at its end. ``startingTimestamp`` keeps
        ``latest`` unless this says ``error``, as it always started such a queue at its end (a stream
        started at a time yet to come reads what comes from then); with it, ``%RETRY%<consumerGroup>``
        read along is never refused. Only with ``startingTimestamp`` or ``startingOffsetsByTimestamp``.

    ``consumeFromWhere``
        (one of ``CONSUME_FROM_LAST_OFFSET``, ``CONSUME_FROM_FIRST_OFFSET``, ``CONSUME_FROM_TIMESTAMP``;
        default ``CONSUME_FROM_LAST_OFFSET``) where ``startingOffsets=group`` starts on a queue where
        the group has no progress, and where a BROADCASTING stream starts (RocketMQ's names): the
        queue's end (new messages only), its first message, or ``consumeTimestamp``. Also accepted:
        ``LAST``, ``LAST_OFFSET``, ``FIRST``, ``FIRST_OFFSET``, ``TIMESTAMP``.

    ``consumeTimestamp``
        (integer >= 0) milliseconds since the epoch, for ``consumeFromWhere=CONSUME_FROM_TIMESTAMP``
        (which needs it, and only it takes it): start at the first message stored at or after it.

    ``endingOffsets``
        (keyword or JSON; default ``latest``; ``read`` only) where the read ends (exclusive):
        ``latest``, resolved once when the read is planned, or JSON ``{"orders": {"broker-a:0": 100}}``
        (-1 latest; unlisted queues end at latest), naming the query's topics and, with
        ``includeRetry``, ``%RETRY%<consumerGroup>``; a queue that ``startingOffsets`` starts after its
        end here is refused.

    ``endingTimestamp``
        (integer >= 0; ``read`` only) milliseconds since the epoch: each queue ends before its first
        message stored at or after it. Instead of ``endingOffsets`` and ``endingOffsetsByTimestamp``;
        not before the starting time.

    ``endingOffsetsByTimestamp``
        (JSON; ``read`` only) a time per queue, in milliseconds since the epoch, keyed as
        ``endingOffsets`` JSON (Spark's Kafka option): ``{"orders": {"broker-a:0": 1700000000000}}``;
        each queue named ends before its first message stored at or after its time (at its end if there
        is none), unlisted queues end at latest. Instead of ``endingOffsets`` and ``endingTimestamp``; a
        queue whose starting time is after its time here is refused.

    ``lastMessagesPerQueue``
        (integer >= 1; ``read`` only) the last N messages of each queue (before the end
        ``endingOffsets`` or ``endingTimestamp`` sets). Instead of ``startingOffsets`` and
        ``startingTimestamp``. It counts queue offsets, so a filtered subscription returns fewer rows.

    ``maxMessagesPerTrigger``
        (integer >= 1; default all; ``readStream`` only) at most N messages per micro-batch, shared
        among queues by backlog; it counts queue offsets, so a filtered subscription returns fewer rows.
        ``Trigger.AvailableNow`` honours it over several batches.

    ``minMessagesPerTrigger``
        (integer >= 1; default none; ``readStream`` only) a micro-batch waits until at least N new
        messages are there, or ``maxTriggerDelay`` has passed since the last one (Spark's Kafka
        ``minOffsetsPerTrigger``): fewer, larger batches from a trickle. Counts queue offsets as
        ``maxMessagesPerTrigger``, and is not above it. ``Trigger.AvailableNow`` ignores it.

    ``maxTriggerDelay``
        (string; default ``15m``; ``readStream`` only) with ``minMessagesPerTrigger``: the longest a
        micro-batch waits for them, since the last batch, e.g. ``30s``, ``15m`` (units ms, s, m, h, d; a
        bare number is ms), as Kafka's.

    ``failOnDataLoss``
        (boolean; default ``true``) what happens when messages to read are gone (expired by
        ``fileReservedTime``, topic deleted, or deleted and created again): ``true`` fails the query
        saying what was lost; ``false`` logs it and skips ahead (a re-created topic is read from its
        first message). The pymq broker gives each topic an id when it is created, so a stream tells a
        re-created topic whatever its offsets. Where there is no id (a RocketMQ cluster,
        ``%RETRY%``/``%DLQ%`` topics, topics made before pymq had ids, batch reads), as in Spark's Kafka
        source only offsets going back show it, and a topic re-created with as many messages as the
        stream had read goes unnoticed (its first ones are skipped); give the new topic a new name or
        start a new checkpoint.

    ``includeRetry``
        (boolean; default streams in CLUSTERING with a ``consumerGroup`` (without ``assign``): ``true``;
        else ``false``) read ``%RETRY%<consumerGroup>`` too (needs ``consumerGroup`` and CLUSTERING).
        Its queues start as the topics' do (``startingOffsets``, ``startingTimestamp``,
        ``lastMessagesPerQueue``), except that with ``startingOffsets=group`` a queue without the
        group's progress starts as RocketMQ's consumers start retry topics: at its first message, or
        with ``consumeFromWhere=CONSUME_FROM_TIMESTAMP`` at its last. A retried message shows its
        original topic in ``topic`` and the retry topic in ``retry_topic``.

    ``pullBatchSize``
        (integer 1..100000; default 32768) at most this many messages per pull. RocketMQ's brokers
        answer at most ``maxTransferCountOnMessageInMemory`` (32) per pull, so an unfiltered pull goes
        out to them as up to 64 pulls in flight.

    ``pullMaxBytes``
        (integer 1..67108864; default 1048576; pymq only) at most this many bytes per pull (~1 MiB
        answers are the fastest over gRPC). RocketMQ's brokers apply their own
        ``maxTransferBytesOnMessageInMemory`` instead.

    ``pollTimeoutMs``
        (integer >= 1; default 60000) timeout of one pull in a task; a broker that does not answer
        (restarting, or crashed in a cluster) is asked again until its pulls have failed for this long.

    ``connectTimeoutMs``
        (integer >= 1; default 10000) timeout of the driver's calls to the broker (routes, offsets,
        progress): an unreachable broker fails the query within it, naming the endpoint.

    ``minPartitions``
        (integer >= 1; default one per queue with 1,000 messages or more; smaller ones together) split
        large ranges so that a batch has at least this many Spark partitions (shared by size, as Spark's
        Kafka source does), and give each queue's range a partition of its own. Without it, the ranges
        of queues with fewer than 1,000 new messages share partitions of up to 1,000 messages: a Python
        source's task costs ~50 ms whatever it reads, so a trickle over 256 queues would make 256 tasks
        a batch (768 messages on 256 queues: 0.7 s read together, 8 to 9 s one task a queue).

    ``maxMessagesPerPartition``
        (integer >= 1; default no limit) split ranges larger than this: no Spark partition reads more
        messages (small ranges share partitions of at most this many).

    .. options:source:end

    Schema (``SOURCE_DDL``)::

        topic string, queue_id int, broker_name string, queue_offset bigint,
        msg_id string, offset_msg_id string, commit_log_offset bigint, tags string,
        keys array<string>, body binary, properties map<string,string>,
        born_timestamp timestamp, store_timestamp timestamp, reconsume_times int,
        retry_topic string

    A message read from ``%RETRY%<group>`` shows its original topic in ``topic``
    and the retry topic in ``retry_topic``.

    Fewer columns: ``.schema("body binary, queue_offset bigint")`` keeps only the
    columns it names (any of the above, in any order, with the types above) and
    costs Spark much less per row; ``select()`` after ``load()`` does not (Python
    data sources hand Spark every column they declare). A name the source does not
    have or another type is an error that says what to declare, raised when the query
    runs (Spark does not ask a source about a schema it was given). Sending rows back
    (``action=reconsumeLater``) needs ``commit_log_offset``, ``msg_id``, ``topic``,
    ``broker_name``, ``reconsume_times``, ``body`` and ``properties``;
    :class:`~pyspark_pymq.spark.listener.MessageListener` needs every column.

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

    Options of a broker table:

    .. options:view:begin

    ``endpoint``
        (string; ``endpoint`` or ``namesrvAddr`` required; pymq only) ``host:port`` of a pymq broker:
        the address ``pymq-broker`` prints (``pymq broker listening on HOST:PORT``) or
        ``EmbeddedBroker.endpoint``. Set exactly one of ``endpoint`` and ``namesrvAddr``.

    ``namesrvAddr``
        (string; ``endpoint`` or ``namesrvAddr`` required; RocketMQ only) Apache RocketMQ's name
        servers, ``host:9876;host2:9876`` (see "Use with Apache RocketMQ" in README.md): requests go to
        the brokers of each topic's route.

    ``accessKey``
        (string) ACL access key (a user of the broker), with ``secretKey`` (both or neither): every
        request is signed, to a pymq broker as RocketMQ 5's gRPC clients sign (``MQv2-HMAC-SHA1``), to
        Apache RocketMQ as its ``AclClientRPCHook`` does.

    ``secretKey``
        (string) ACL secret key, with ``accessKey``; it never shows in plans, logs or error messages
        (under Spark Connect see ``secretKeyFile``).

    ``secretKeyFile``
        (string) instead of ``secretKey``: a file whose first line is the ACL secret key, read on the
        driver when the query is planned. The secret is then in no option: a Spark Connect server, which
        records each request's options in its event log and UI, never sees it.

    ``tls``
        (boolean; default ``false``) encrypt connections with TLS and verify the broker's certificate
        and host name (or IP address) against ``tlsCaFile``, or the system's trust store without it.

    ``tlsCaFile``
        (string) with ``tls=true``: PEM file of the certificate authorities to trust (a self-signed
        broker certificate or its CA). The file must be readable on the driver and every executor.

    ``tlsCertFile``
        (string) with ``tls=true`` and ``tlsKeyFile``: PEM certificate chain this client presents
        (mutual TLS).

    ``tlsKeyFile``
        (string) with ``tls=true`` and ``tlsCertFile``: the client certificate's PEM private key
        (unencrypted).

    ``view``
        (one of ``topics``, ``queues``, ``groups``, ``lag``, ``deadLetters``; required) the table:
        ``topics`` (one row per topic: ``messages`` in all its queues, ``min_offset`` / ``max_offset``
        the lowest / highest of its queues'), ``queues`` (per queue), ``groups`` (per consumer group,
        with its retry settings), ``lag`` (per queue of the topics a group consumes; consumer offset 0
        where it never committed, as RocketMQ's consumerProgress shows), ``deadLetters`` (per dead
        letter of ``consumerGroup``).

    ``consumerGroup``
        (string) ``lag``: the group (without it, every group), a group no broker knows fails naming it;
        ``deadLetters`` (required there): whose ``%DLQ%`` topic.

    ``topic``
        (string) ``topics``, ``queues`` and ``lag``: this topic only.

    ``includeSystem``
        (boolean; default ``false``) ``topics`` and ``queues``: show ``%RETRY%``, ``%DLQ%`` and system
        topics too.

    ``maxMessages``
        (integer >= 1; default 10000) ``deadLetters``: at most this many rows.

    .. options:view:end

    Example::

        last10 = (spark.read.format("pymq")
                  .option("endpoint", "127.0.0.1:8081")
                  .option("topic", "%DLQ%analytics")
                  .option("lastMessagesPerQueue", 10)
                  .load())

    Writing (``df.write`` / ``df.writeStream``): columns ``body`` (required),
    ``topic``, ``tags``, ``keys``, ``properties``, ``delay_level``, ``sharding_key``,
    ``queue_id``, ``deliver_time_ms``. Options:

    .. options:sink:begin

    ``endpoint``
        (string; ``endpoint`` or ``namesrvAddr`` required; pymq only) ``host:port`` of a pymq broker:
        the address ``pymq-broker`` prints (``pymq broker listening on HOST:PORT``) or
        ``EmbeddedBroker.endpoint``. Set exactly one of ``endpoint`` and ``namesrvAddr``.

    ``namesrvAddr``
        (string; ``endpoint`` or ``namesrvAddr`` required; RocketMQ only) Apache RocketMQ's name
        servers, ``host:9876;host2:9876`` (see "Use with Apache RocketMQ" in README.md): requests go to
        the brokers of each topic's route.

    ``accessKey``
        (string) ACL access key (a user of the broker), with ``secretKey`` (both or neither): every
        request is signed, to a pymq broker as RocketMQ 5's gRPC clients sign (``MQv2-HMAC-SHA1``), to
        Apache RocketMQ as its ``AclClientRPCHook`` does.

    ``secretKey``
        (string) ACL secret key, with ``accessKey``; it never shows in plans, logs or error messages
        (under Spark Connect see ``secretKeyFile``).

    ``secretKeyFile``
        (string) instead of ``secretKey``: a file whose first line is the ACL secret key, read on the
        driver when the query is planned. The secret is then in no option: a Spark Connect server, which
        records each request's options in its event log and UI, never sees it.

    ``tls``
        (boolean; default ``false``) encrypt connections with TLS and verify the broker's certificate
        and host name (or IP address) against ``tlsCaFile``, or the system's trust store without it.

    ``tlsCaFile``
        (string) with ``tls=true``: PEM file of the certificate authorities to trust (a self-signed
        broker certificate or its CA). The file must be readable on the driver and every executor.

    ``tlsCertFile``
        (string) with ``tls=true`` and ``tlsKeyFile``: PEM certificate chain this client presents
        (mutual TLS).

    ``tlsKeyFile``
        (string) with ``tls=true`` and ``tlsCertFile``: the client certificate's PEM private key
        (unencrypted).

    ``topic``
        (string) the topic of every row; without it, each row's ``topic`` column. As in Spark's Kafka
        sink the option wins over a ``topic`` column, so rows read from pymq and written on are not sent
        back to their own topics. One topic: use a ``topic`` column (and no option) for several.

    ``action``
        (one of ``send``, ``reconsumeLater``; default ``send``) ``send``: produce the rows as messages;
        ``reconsumeLater``: send rows read from a pymq source back to ``%RETRY%<consumerGroup>``
        (RocketMQ's send back: after ``maxReconsumeTimes`` retries they go to ``%DLQ%<consumerGroup>``).

    ``sendMode``
        (one of ``sync``, ``async``, ``oneway``; default ``sync``) ``sync``: every batch acknowledged; a
        timeout, an unreachable or a busy broker is retried ``retryTimesWhenSendFailed`` times, on
        another broker where there is one, unless a ``queue_id`` or ``sharding_key`` column pins the
        queue. ``async``: a bounded in-flight window; the task still waits for every acknowledgement and
        fails on a failed one; not retried unless ``retryTimesWhenSendAsyncFailed`` > 0, as in RocketMQ.
        ``oneway``: **lossy** in its answers: a send a broker took but failed does not fail the task
        (the executor log says how many rows were not acknowledged); as RocketMQ's ``sendOneway``
        throws, a send that reaches no broker (no route, a broker that does not answer) or can never
        succeed, such as to a topic without write permission, still fails it. An answer other than
        ``SEND_OK`` (``FLUSH_DISK_TIMEOUT``, ``FLUSH_SLAVE_TIMEOUT``, ``SLAVE_NOT_AVAILABLE``: stored,
        not yet durable) fails the task too, so that Spark sends those rows again with the same msgIds;
        ``sync`` first sends them to another broker where there is one (RocketMQ's
        ``retryAnotherBrokerWhenNotStoreOK``).

    ``deliveryGuarantee``
        (one of ``at-least-once``, ``exactly-once``; default ``at-least-once``) ``exactly-once``
        (``writeStream`` with ``action=send``, pymq ``endpoint`` only for now): each micro-batch's rows
        are half messages committed with the batch, so consumers see every row once. It needs a local or
        mounted ``checkpointLocation`` and ``sendMode`` ``sync`` or ``async``.

    ``producerGroup``
        (string; default ``PYMQ_SPARK_SINK``; with ``exactly-once``: ``PYMQ_SPARK_SINK_TX_<hash>``)
        RocketMQ's producer group (PGROUP). With ``deliveryGuarantee=exactly-once`` it is the group the
        broker's check-backs go to, so the default is one per checkpoint.

    ``writeId``
        (string; default a new one for each ``write``; ``write`` only) what a ``df.write``'s msgIds are
        derived from, with the task and row (a ``writeStream``'s come from its query and batch ids).
        Inside a ``foreachBatch``, give each write of the function its own ``writeId`` made with the
        batch id (``f"orders-{batch_id}"``, ``f"refunds-{batch_id}"``; two queries writing one topic:
        their names too): a micro-batch that Spark runs again then sends the same msgIds, which a
        topic's de-duplication window drops; without it, each run sends new ones. Under Spark Connect
        the function's writes do not see the stream's ids: a ``writeId`` without the batch id would send
        the same msgIds in every micro-batch, and a de-duplication window would drop all but the
        first's. Outside a stream a ``writeId`` names one write: running it again with the same
        ``writeId`` sends the same msgIds (a de-duplication window drops rows already sent) as long as
        each row lands in the same partition at the same place (a msgId is the partition and the row's
        index in it: read the input in a fixed order, without a ``repartition``), so give new data a new
        one (``orders-2026-11-27``).

    ``retryTimesWhenSendFailed``
        (integer 0..16; default 2) ``sendMode=sync``: retries of a failed send.

    ``retryTimesWhenSendAsyncFailed``
        (integer 0..16; default 0) ``sendMode=async``: retries of a failed send.

    ``sendMsgTimeoutMs``
        (integer >= 1; default 3000) timeout of one send request (a batch of up to ``maxBatchBytes``).

    ``maxInFlight``
        (integer 1..4096; default 4) ``async`` and ``oneway``: unanswered batches (of up to
        ``maxBatchBytes``) per task.

    ``maxBatchBytes``
        (integer 1024..134217728; default 4194304 (4 MiB), or ``maxMessageSize`` when that is smaller)
        rows go out as batches of up to this many bytes (at most ``maxMessageSize``: the broker refuses
        a larger request whole).

    ``maxMessageSize``
        (integer 1024..134217728; default 4194304 (4 MiB)) the largest body a row may send, as
        RocketMQ's producer ``maxMessageSize``: a larger one fails its task naming the row. Raise the
        broker's with it (``pymq-broker --max-message-size``, RocketMQ's ``maxMessageSize``).

    ``consumerGroup``
        (string) ``reconsumeLater`` (required there): the group whose ``%RETRY%`` topic the rows go back
        to.

    ``maxReconsumeTimes``
        (integer 1..2147483647; default the group's ``retryMaxTimes`` (16) on a pymq broker; 16 on
        Apache RocketMQ) ``reconsumeLater``: retries before a message goes to ``%DLQ%<consumerGroup>``.

    ``delayLevel``
        (integer -1..2147483647; default 0) ``reconsumeLater``: the delay level of the retry; 0 =
        RocketMQ's 3 + retries, -1 = straight to the DLQ, a level past the broker's last is its last (as
        RocketMQ's). A row's ``delay_level`` column overrides it (within the same bounds).

    ``stage``
        (string; default ``spark-stream-sink`` (``writeStream``), ``spark-sink`` (``write``); pymq only)
        ``reconsumeLater``: the name each message sent back keeps in its ``CONSUME_FAILURE_STAGE``
        property, next to the error, the query id and the batch id, so a dead letter says which step
        failed it (the listener helper writes ``listener``). RocketMQ's send back keeps no properties.

    .. options:sink:end

    How ``deliveryGuarantee=exactly-once`` commits each micro-batch once:
    :mod:`pyspark_pymq.spark.transactional_sink`.

    Example::

        (df.selectExpr("CAST(id AS STRING) AS keys", "to_json(struct(*)) AS body")
           .writeStream.format("pymq").option("endpoint", "127.0.0.1:8081")
           .option("topic", "orders").option("deliveryGuarantee", "exactly-once")
           .option("checkpointLocation", "/chk/orders-out").start())
    """

    @classmethod
    def name(cls) -> str:
        return "pymq"

    @spark_call
    def schema(self) -> StructType | str:
        # Spark calls schema() at load() for reads only (never for writes), before
        # it says stream or batch: check what does not depend on that, so most
        # option mistakes fail at load() rather than when the query starts.
        if view_requested(self.options):
            return VIEWS[parse_view_options(dict(self.options)).view]
        parse_source_options(dict(self.options), stream=None)
        return source_schema()

    def _source_options(self, schema: StructType | None, *, stream: bool) -> SourceOptions:
        columns = select_columns(schema)  # first: a bad schema is named before any option
        options = parse_source_options(dict(self.options), stream=stream)
        return options if columns is None else dataclasses.replace(options, columns=columns)

    @spark_call
    def reader(self, schema: StructType) -> PymqBatchReader | ViewReader:
        from .batch_reader import PymqBatchReader

        if view_requested(self.options):
            view_options = parse_view_options(dict(self.options))
            check_view_schema(view_options.view, schema)
            return ViewReader(view_options)

        return PymqBatchReader(self._source_options(schema, stream=False))

    @spark_call
    def streamReader(self, schema: StructType) -> PymqMicroBatchStream | _RefusedStream:
        from .micro_batch_stream import PymqMicroBatchStream

        try:
            if view_requested(self.options):
                raise ValueError("pymq views (option view) are tables for spark.read, not streams")
            options = self._source_options(schema, stream=True)
        except ValueError as err:
            # pyspark 4.2's stream runner calls reader.stop() in a `finally` where `reader` is
            # unbound when streamReader raises: the user would read an UnboundLocalError on top
            # of this message. The stream's first call raises it instead.
            return _RefusedStream(err)
        return PymqMicroBatchStream(options)

    # -- the sink -------------------------------------------------------------------

    @spark_call
    def writer(self, schema: StructType, overwrite: bool) -> PymqSinkWriter:
        """``df.write.format("pymq")``: see :mod:`pyspark_pymq.spark.writer`."""
        from .sink_options import parse_sink_options
        from .writer import PymqSinkWriter, check_sink_topic

        if overwrite:  # Spark's own error for the default mode suggests "Overwrite": say why not
            raise ValueError(
                "pymq sink: mode('overwrite') would have to remove the messages a topic already "
                "holds, and a topic is append-only; write with .mode('append')"
            )
        options = parse_sink_options(dict(self.options), schema, stream=False)
        check_sink_topic(options)
        return PymqSinkWriter(options)

    @spark_call
    def streamWriter(self, schema: StructType, overwrite: bool) -> PymqStreamSinkWriter:
        """``df.writeStream.format("pymq")``: see :mod:`pyspark_pymq.spark.writer`."""
        from .sink_options import parse_sink_options
        from .writer import PymqStreamSinkWriter, check_sink_topic

        options = parse_sink_options(dict(self.options), schema, stream=True)
        check_sink_topic(options)
        if options.exactly_once:
            from .transactional_sink import TransactionalStreamSinkWriter

            return TransactionalStreamSinkWriter(options)
        return PymqStreamSinkWriter(options)


class _RefusedStream(DataSourceStreamReader):
    """The stream reader of options refused when the stream starts: every call raises their error."""

    def __init__(self, error: ValueError) -> None:
        self.error = error

    @spark_call
    def initialOffset(self) -> dict[str, Any]:
        raise self.error

    @spark_call
    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        raise self.error

    @spark_call
    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> list[InputPartition]:
        raise self.error

    @spark_iterator
    def read(self, partition: InputPartition) -> Iterator[tuple[Any, ...]]:
        raise self.error

    def stop(self) -> None:
        pass

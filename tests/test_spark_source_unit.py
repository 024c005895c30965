"""Pure tests of the Spark source: options, offset JSON, range planning, decoding.

No broker and no Spark session: these pin down the rules the integration tests
rely on, and run in well under a second.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import random
import re
import struct
import threading
import time
from typing import Any

import pyarrow as pa
import pytest
from column_subsets import SUBSETS
from pymq_proto.record import encode_properties, encode_record, store_host_bytes
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    IntegerType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampNTZType,
)
from pyspark_pymq.backend import pymq_arrow
from pyspark_pymq.backend.pymq_arrow import (
    _properties,
    decode_to_arrow,
    empty_batch,
    find_record_starts,
    messages_to_batch,
)
from pyspark_pymq.client.codec import decode_messages
from pyspark_pymq.client.message import MessageQueue
from pyspark_pymq.errors import AccessDeniedError, BrokerUnavailableError, NoPermissionError, PymqError
from pyspark_pymq.spark.data_loss import DataLossError, report_data_loss
from pyspark_pymq.spark.micro_batch_stream import PymqMicroBatchStream
from pyspark_pymq.spark.offset_range import (
    OffsetRange,
    Turn,
    limit_offsets,
    pack_ranges,
    plan_ranges,
    split_ranges,
)
from pyspark_pymq.spark.offset_reader import OffsetReader, QueueBounds
from pyspark_pymq.spark.options import (
    ConsumeFromWhere,
    MessageModel,
    StartKind,
    TimestampStrategy,
    parse_source_options,
)
from pyspark_pymq.spark.read_loop import make_partitions, read_partition
from pyspark_pymq.spark.schema import (
    COLUMNS,
    SOURCE_DDL,
    arrow_schema,
    project,
    select_columns,
    source_schema,
)
from pyspark_pymq.spark.source_offset import (
    FROM_KEY,
    INITIAL,
    TOPIC_IDS_KEY,
    is_initial,
    offsets_from_json,
    offsets_to_json,
    parse_offsets_json,
)

EP = "127.0.0.1:8081"


def stream(**extra: str) -> dict[str, str]:
    return {"endpoint": EP, "topic": "orders", "consumerGroup": "g", **extra}


def batch(**extra: str) -> dict[str, str]:
    return {"endpoint": EP, "topic": "orders", **extra}


# -- options ---------------------------------------------------------------------------


def test_stream_defaults_in_clustering() -> None:
    o = parse_source_options(stream(), stream=True)
    assert o.message_model is MessageModel.CLUSTERING
    assert o.starting.kind is StartKind.GROUP
    assert o.consume_from_where is ConsumeFromWhere.CONSUME_FROM_LAST_OFFSET
    assert o.include_retry and o.retry_topic == "%RETRY%g"
    assert o.all_topics() == ("orders", "%RETRY%g")
    assert o.fail_on_data_loss and o.commits_progress
    assert o.subscription == "*"


def test_batch_defaults() -> None:
    o = parse_source_options(batch(topic="a, b,a"), stream=False)
    assert o.topics == ("a", "b")
    assert o.starting.kind is StartKind.EARLIEST and o.ending.kind is StartKind.LATEST
    assert not o.include_retry and not o.commits_progress and o.consumer_group is None


def test_broadcasting_starts_from_consume_from_where_and_has_no_retries() -> None:
    o = parse_source_options(
        {"endpoint": EP, "topic": "t", "messageModel": "broadcasting"}, stream=True
    )
    assert o.starting.kind is StartKind.LATEST
    assert not o.include_retry and not o.commits_progress
    o = parse_source_options(
        {"endpoint": EP, "topic": "t", "messageModel": "BROADCASTING",
         "consumeFromWhere": "CONSUME_FROM_FIRST_OFFSET"},
        stream=True,
    )
    assert o.starting.kind is StartKind.EARLIEST


def test_option_names_are_case_insensitive() -> None:
    o = parse_source_options(
        {"ENDPOINT": EP, "Topic": "t", "CONSUMERGROUP": "g", "maxmessagespertrigger": "10",
         "FailOnDataLoss": "FALSE"},
        stream=True,
    )
    assert o.max_messages_per_trigger == 10 and not o.fail_on_data_loss


@pytest.mark.parametrize(
    ("raw", "is_stream", "needles"),
    [
        ({"topic": "t", "consumerGroup": "g"}, True, ["endpoint is required"]),
        (batch(endpoint="nohost"), False, ["endpoint='nohost'", "host:port"]),
        (batch(endpoint="http://127.0.0.1:8081"), False, ["has a scheme: drop 'http://'"]),
        (batch(startingTimestamp="1795962000"), False,  # seconds: it read from January 1970
         ["startingTimestamp=1795962000", "1970-01-21 18:52:42 UTC", "if it is seconds give 1795962000000"]),
        (batch(endingOffsetsByTimestamp='{"orders": {"0": 1795962000}}'), False,
         ["timestamp 1795962000 for 'orders'/'0'", "a 10-digit time is seconds"]),
        (stream(consumeFromWhere="CONSUME_FROM_TIMESTAMP", consumeTimestamp="1795962000"), True,
         ["consumeTimestamp=1795962000", "if it is seconds"]),
        (batch(endpoint="h1:8081,h2:8082"), False, ["'h1:8081,h2:8082' holds more than one address"]),
        ({"namesrvAddr": "h1:9876,h2:9876", "topic": "t"}, False,
         ["'h1:9876,h2:9876' holds more than one address", "separated by ';'"]),
        ({"namesrvAddr": "127.0.0.1:9876;tcp://h:9876", "topic": "t"}, False,
         ["'tcp://h:9876' has a scheme"]),
        ({"endpoint": EP}, False, ["topic is required"]),
        (batch(topic="bad topic!"), False, ["topic='bad topic!'", "letters, digits"]),
        ({"endpoint": EP, "topic": "t"}, True, ["consumerGroup is required", "BROADCASTING"]),
        (stream(startingOffset="earliest"), True, ["'startingOffset' is unknown",
                                                   "Did you mean 'startingOffsets'"]),
        (stream(endingOffsets="latest"), True, ["endingOffsets='latest'", "batch reads"]),
        (stream(lastMessagesPerQueue="3"), True, ["lastMessagesPerQueue", "batch reads"]),
        (batch(maxMessagesPerTrigger="3"), False, ["maxMessagesPerTrigger", "streams"]),
        (stream(startingOffsets="newest"), True, ["startingOffsets='newest'", "'earliest'"]),
        (batch(startingOffsets="latest"), False, ["startingOffsets='latest'", "reads nothing"]),
        (batch(startingOffsets='{"orders": {"1": 500, "b:0": 7}}', endingOffsets='{"orders": {"b:1": 100}}'),
         False, ["queue b:1 of 'orders' starts at 500 (startingOffsets) after its end 100"]),
        (batch(startingOffsets='{"orders": {"b:0": 5}}', endingOffsets='{"orders": {"b:0": 4, "c:0": 9}}'),
         False, ["queue b:0 of 'orders' starts at 5 (startingOffsets) after its end 4"]),
        (batch(startingOffsets='{"orders": {"b:1": 3, "b:0": -1}}'), False,
         ["cannot start queue b:0 of 'orders' at -1 (latest)", "-2 (earliest)"]),
        (stream(startingOffsets="{oops"), True, ["startingOffsets", "not valid JSON"]),
        (stream(startingOffsets='{"orders": {"q0": 1}}'), True, ["queue key 'q0'",
                                                                 "brokerName:queueId"]),
        (stream(startingOffsets='{"orders": {"b:0": -7}}'), True, ["offset -7", "-2 (earliest)"]),
        (batch(endingOffsets='{"orders": {"b:0": -2}}'), False, ["offset -2", "-1 (latest)"]),
        (stream(startingOffsets='{"other": {"b:0": 1}}'), True,
         ["topics ['other'] that the query does not read: it can name 'orders', '%RETRY%g'"]),
        # %RETRY%<consumerGroup> only when it is read along
        (batch(consumerGroup="g", startingOffsets='{"%RETRY%g": {"0": 1}}'), False,
         ["topics ['%RETRY%g']", "can name 'orders' (", "includeRetry=true"]),
        (stream(includeRetry="false", endingOffsets='{"%RETRY%g": {"0": 1}}'), None,
         ["endingOffsets=", "topics ['%RETRY%g']"]),
        (batch(consumerGroup="g", includeRetry="true", endingOffsets='{"%RETRY%h": {"0": 1}}'), False,
         ["topics ['%RETRY%h']", "can name 'orders', '%RETRY%g'"]),
        (stream(startingOffsets="earliest", startingTimestamp="5"), True,
         ["startingOffsets and startingTimestamp cannot be used together"]),
        ({"endpoint": EP, "topic": "t", "messageModel": "BROADCASTING",
          "startingOffsets": "group"}, True, ["startingOffsets='group'", "BROADCASTING"]),
        ({"endpoint": EP, "topic": "t", "messageModel": "BROADCASTING",
          "includeRetry": "true"}, True, ["includeRetry='true'", "BROADCASTING"]),
        (stream(messageModel="p2p"), True, ["messageModel='p2p'", "CLUSTERING, BROADCASTING"]),
        (stream(consumeFromWhere="CONSUME_FROM_TIMESTAMP"), True, ["needs consumeTimestamp"]),
        (stream(startingOffsets="earliest", consumeFromWhere="first"), True,
         ["consumeFromWhere='first' cannot apply"]),
        (stream(pullBatchSize="0"), True, ["pullBatchSize='0'", ">= 1 and <= 100000"]),
        (stream(failOnDataLoss="yes"), True, ["failOnDataLoss='yes'", "'true' or 'false'"]),
        (batch(startingOffsets="group"), False, ["startingOffsets=group needs consumerGroup"]),
        (batch(includeRetry="true"), False, ["includeRetry=true needs consumerGroup"]),
        (batch(endingOffsets="latest", endingTimestamp="9"), False, ["cannot be used together"]),
        (batch(startingTimestamp="10", endingTimestamp="9"), False, ["before startingTimestamp"]),
        (stream(consumerGroup="%RETRY%x"), True, ["consumerGroup='%RETRY%x'"]),
        (batch(subscription="TagA ||"), False, ["subscription='TagA ||'", "has an empty tag"]),
        (stream(subscription="||"), True, ["subscription='||'", "'TagA || TagB'"]),
        # startingOffsetsByTimestamp / endingOffsetsByTimestamp: startingOffsets' JSON, of times
        (stream(startingOffsetsByTimestamp='{"orders": {"b:0": 5}}', startingTimestamp="5"), True,
         ["startingTimestamp and startingOffsetsByTimestamp cannot be used together"]),
        (batch(startingOffsets="earliest", startingOffsetsByTimestamp='{"orders": {"0": 5}}'), False,
         ["startingOffsets and startingOffsetsByTimestamp cannot be used together"]),
        (batch(lastMessagesPerQueue="3", startingOffsetsByTimestamp='{"orders": {"0": 5}}'), None,
         ["startingOffsetsByTimestamp and lastMessagesPerQueue cannot be used together"]),
        (batch(endingOffsetsByTimestamp='{"orders": {"0": 5}}', endingTimestamp="5"), False,
         ["endingTimestamp and endingOffsetsByTimestamp cannot be used together"]),
        (batch(endingOffsetsByTimestamp='{"orders": {"0": 5}}', endingOffsets="latest"), False,
         ["endingOffsets and endingOffsetsByTimestamp cannot be used together"]),
        (stream(endingOffsetsByTimestamp='{"orders": {"0": 5}}'), True,
         ["endingOffsetsByTimestamp=", "cannot apply to a stream"]),
        (stream(startingOffsetsByTimestamp='{"orders": {"b:0": -1}}'), True,
         ["startingOffsetsByTimestamp: timestamp -1 for 'orders'/'b:0'", "milliseconds since the epoch"]),
        (batch(endingOffsetsByTimestamp='{"orders": {"b:0": "5"}}'), False,
         ["endingOffsetsByTimestamp: timestamp '5'"]),
        (stream(startingOffsetsByTimestamp='{"orders": 5}'), True,
         ["startingOffsetsByTimestamp: the value for topic 'orders'", "'brokerName:queueId' -> timestamp"]),
        (stream(startingOffsetsByTimestamp="1700000000000"), True,
         ["startingOffsetsByTimestamp='1700000000000' is not valid", "non-empty JSON object"]),
        (batch(startingOffsetsByTimestamp='{"other": {"0": 5}}'), False,
         ["startingOffsetsByTimestamp=", "topics ['other'] that the query does not read"]),
        (batch(endingOffsetsByTimestamp='{"orders": {"0": 5}, "x": {"0": 5}}'), False,
         ["endingOffsetsByTimestamp=", "topics ['x']"]),
        (batch(startingOffsetsByTimestamp='{"orders": {"b:0": 9}}',
               endingOffsetsByTimestamp='{"orders": {"0": 5}}'), False,
         ["queue b:0 of 'orders' starts at time 9 (startingOffsetsByTimestamp) after its end at "
          "time 5 (endingOffsetsByTimestamp)"]),
        (batch(startingTimestamp="9", endingOffsetsByTimestamp='{"orders": {"c:3": 5}}'), False,
         ["queue c:3 of 'orders' starts at time 9 (startingTimestamp) after its end at time 5 "
          "(endingOffsetsByTimestamp)"]),
        (batch(startingOffsetsByTimestamp='{"orders": {"1": 9}}', endingTimestamp="5"), False,
         ["queue 1 of 'orders' starts at time 9 (startingOffsetsByTimestamp) after its end at time 5 "
          "(endingTimestamp)"]),
        (batch(startingOffsetsByTimestampStrategy="error"), None,
         ["startingOffsetsByTimestampStrategy='error'", "set startingOffsetsByTimestamp or "
          "startingTimestamp too, or remove it"]),
        (stream(startingTimestamp="5", startingOffsetsByTimestampStrategy="earliest"), True,
         ["startingOffsetsByTimestampStrategy='earliest'", "use one of error, latest"]),
    ],
)
def test_bad_options_name_option_value_and_fix(
    raw: dict[str, str], is_stream: bool | None, needles: list[str]
) -> None:
    with pytest.raises(ValueError) as info:
        parse_source_options(raw, stream=is_stream)
    for needle in needles:
        assert needle in str(info.value), str(info.value)


@pytest.mark.parametrize(
    "raw",
    [
        batch(),
        stream(maxMessagesPerTrigger="5", startingOffsets="latest"),
        batch(lastMessagesPerQueue="5", endingOffsets="latest"),
        stream(consumeFromWhere="CONSUME_FROM_FIRST_OFFSET"),
        {"endpoint": EP, "topic": "t", "messageModel": "BROADCASTING"},
        stream(startingOffsets='{"%RETRY%g": {"0": 1}}'),  # a stream reads it along by default
    ],
)
def test_load_time_check_accepts_what_a_stream_or_a_batch_read_accepts(
    raw: dict[str, str],
) -> None:
    parse_source_options(raw, stream=None)


@pytest.mark.parametrize(
    ("raw", "needle"),
    [
        ({"topic": "t"}, "endpoint is required"),
        (batch(startingOffset="earliest"), "Did you mean 'startingOffsets'"),
        (batch(failOnDataLoss="maybe"), "failOnDataLoss='maybe'"),
        (batch(startingOffsets="earliest", lastMessagesPerQueue="3"), "cannot be used together"),
    ],
)
def test_load_time_check_rejects_what_no_read_accepts(raw: dict[str, str], needle: str) -> None:
    with pytest.raises(ValueError, match=needle):
        parse_source_options(raw, stream=None)


def test_a_start_at_or_before_its_end_or_on_another_queue_is_accepted() -> None:
    for start, end in [('{"orders": {"b:0": 4}}', '{"orders": {"b:0": 4}}'),
                       ('{"orders": {"b:0": 9}}', '{"orders": {"c:0": 4, "b:1": 2}}'),
                       ('{"orders": {"b:0": -2}}', '{"orders": {"0": 3}}'),
                       ('{"orders": {"0": 9}}', '{"orders": {"0": -1}}')]:
        parse_source_options(batch(startingOffsets=start, endingOffsets=end), stream=False)


def test_offsets_by_timestamp_parse_as_offsets_json_and_pick_a_strategy() -> None:
    o = parse_source_options(stream(startingOffsetsByTimestamp='{"orders": {"b:0": 5, "1": 7}}'), stream=True)
    assert o.starting.kind is StartKind.TIMESTAMPS
    assert dict(o.starting.timestamps) == {("orders", "b", 0): 5, ("orders", "", 1): 7}
    assert o.starting.strategy is TimestampStrategy.ERROR  # Kafka's default
    o = parse_source_options(batch(startingOffsetsByTimestamp='{"orders": {"0": 5}}',
                                   startingOffsetsByTimestampStrategy="LATEST"), stream=False)
    assert o.starting.strategy is TimestampStrategy.LATEST
    # startingTimestamp keeps starting a queue without a message after the time at its end
    o = parse_source_options(stream(startingTimestamp="5"), stream=True)
    assert o.starting.strategy is TimestampStrategy.LATEST
    o = parse_source_options(stream(startingTimestamp="5", startingOffsetsByTimestampStrategy="error"),
                             stream=None)
    assert o.starting.strategy is TimestampStrategy.ERROR
    o = parse_source_options(batch(consumerGroup="g", includeRetry="true",
                                   startingOffsetsByTimestamp='{"%RETRY%g": {"0": 3}}',
                                   endingOffsetsByTimestamp='{"orders": {"b:0": 9}, "%RETRY%g": {"0": 3}}'),
                             stream=False)
    assert dict(o.starting.timestamps) == {("%RETRY%g", "", 0): 3}
    assert o.ending.kind is StartKind.TIMESTAMPS
    assert dict(o.ending.timestamps) == {("orders", "b", 0): 9, ("%RETRY%g", "", 0): 3}
    # a start at its end's time, or on another queue than an earlier end, is no mistake
    parse_source_options(batch(startingOffsetsByTimestamp='{"orders": {"b:0": 9, "b:1": 20}}',
                               endingOffsetsByTimestamp='{"orders": {"b:0": 9, "c:1": 3}}'), stream=False)
    parse_source_options(batch(startingTimestamp="9", endingOffsetsByTimestamp='{"orders": {"0": 9}}'),
                         stream=False)


class TimeBackend:
    """The part of a Backend that OffsetReader's start and end use: queues whose messages were
    stored at the given times (offset i at times[i])."""

    def __init__(self, times: dict[MessageQueue, list[int]]) -> None:
        self.times = times

    def search_offset(self, mq: MessageQueue, timestamp_ms: int) -> int:
        # the first offset stored at or after the time, the max offset if none (the contract)
        return next((i for i, t in enumerate(self.times[mq]) if t >= timestamp_ms), len(self.times[mq]))

    def bounds(self) -> dict[MessageQueue, QueueBounds]:
        return {mq: QueueBounds(0, len(times)) for mq, times in self.times.items()}


def test_a_stream_starting_at_the_end_says_how_many_stored_messages_it_leaves(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A new stream with the defaults on a topic holding 50 messages read none, and said nothing."""
    Q0, Q1 = (MessageQueue("orders", "b", qid) for qid in range(2))
    bounds = {Q0: QueueBounds(3, 30), Q1: QueueBounds(0, 20)}

    class NoProgress:
        def committed(self, group: str, mq: MessageQueue) -> int:
            return 7 if mq == Q1 and group == "old" else -1

    def start(**extra: str) -> dict[MessageQueue, int]:
        opts = parse_source_options(stream(**extra), stream=True)
        return OffsetReader(opts, backend=NoProgress()).starting_offsets(bounds)  # type: ignore[arg-type]

    with caplog.at_level(logging.WARNING, logger="pyspark_pymq.spark"):
        assert start(startingOffsets="latest") == {Q0: 30, Q1: 20}
        assert "47 message(s) already stored are not read (startingOffsets=latest)" in caplog.text
        caplog.clear()
        assert start() == {Q0: 30, Q1: 20}  # a new group: RocketMQ's CONSUME_FROM_LAST_OFFSET
        assert "47 message(s) already stored" in caplog.text and "consumeFromWhere=CONSUME_FROM_FIRST" in (
            caplog.text)
        caplog.clear()
        assert start(consumerGroup="old") == {Q0: 30, Q1: 7}  # its progress on Q1: only Q0's are left
        assert "27 message(s) already stored are not read (consumer group 'old' has no progress" in (
            caplog.text)
        caplog.clear()
        assert start(startingOffsets="earliest") == {Q0: 3, Q1: 0}
        assert "already stored" not in caplog.text


def test_offsets_by_timestamp_resolve_per_queue_and_the_strategy_names_a_queue_without_a_match() -> None:
    Q0, Q1, Q2 = (MessageQueue("orders", "b", qid) for qid in range(3))
    R0 = MessageQueue("%RETRY%g", "b", 0)
    fake = TimeBackend({Q0: [10, 20, 30], Q1: [15, 25], Q2: [5], R0: []})
    bounds = fake.bounds()

    def reader(**extra: str) -> OffsetReader:
        opts = parse_source_options(batch(**extra), stream=False)
        return OffsetReader(opts, backend=fake)  # type: ignore[arg-type]

    by_time = '{"orders": {"b:0": 20, "1": 26}}'
    # Q1 has nothing at or after 26: Kafka's default strategy fails, naming queue and time
    with pytest.raises(ValueError) as info:
        reader(startingOffsetsByTimestamp=by_time).starting_offsets(bounds)
    assert ("startingOffsetsByTimestamp: queue b:1 of topic 'orders' has no message stored at or after 26 "
            "(1970-01-01T00:00:00.026+00:00)") in str(info.value)
    assert "startingOffsetsByTimestampStrategy=latest" in str(info.value)
    # latest: that queue starts at its end; Q2, not in the JSON, at earliest (as startingOffsets JSON)
    got = reader(startingOffsetsByTimestamp=by_time,
                 startingOffsetsByTimestampStrategy="latest").starting_offsets(bounds)
    assert got == {Q0: 1, Q1: 2, Q2: 0, R0: 0}
    # startingTimestamp: latest unless told; with error, the retry topic read along is not judged
    assert reader(startingTimestamp="26").starting_offsets(bounds) == {Q0: 2, Q1: 2, Q2: 1, R0: 0}
    with pytest.raises(ValueError, match="startingTimestamp: queue b:1 of topic 'orders' has no message"):
        reader(startingTimestamp="26", startingOffsetsByTimestampStrategy="error").starting_offsets(bounds)
    got = reader(startingTimestamp="5", startingOffsetsByTimestampStrategy="error", consumerGroup="g",
                 includeRetry="true").starting_offsets(bounds)
    assert got == {Q0: 0, Q1: 0, Q2: 0, R0: 0}
    # an empty queue has no message after any time, as in Kafka
    with pytest.raises(ValueError, match="queue b:0 of topic '%RETRY%g' has no message"):
        reader(consumerGroup="g", includeRetry="true",
               startingOffsetsByTimestamp='{"%RETRY%g": {"0": 1}}').starting_offsets(bounds)
    # ends: per queue, unlisted at latest, a time past the last message at the end
    ending = reader(endingOffsetsByTimestamp='{"orders": {"b:0": 30, "1": 99}}').ending_offsets(bounds)
    assert ending == {Q0: 2, Q1: 2, Q2: 1, R0: 0}
    # a queue the broker does not have is named, as in startingOffsets JSON
    with pytest.raises(ValueError, match="endingOffsetsByTimestamp names queue b:7 of topic 'orders'"):
        reader(endingOffsetsByTimestamp='{"orders": {"b:7": 30}}').ending_offsets(bounds)
    with pytest.raises(ValueError, match="startingOffsetsByTimestamp names queue 9 of topic 'orders'"):
        reader(startingOffsetsByTimestamp='{"orders": {"9": 30}}').starting_offsets(bounds)


def test_subscribe_pattern_is_one_of_topic_or_it_and_matches_whole_user_topic_names() -> None:
    o = parse_source_options(batch(topic="", subscribePattern="orders-.*"), stream=False)
    assert o.topic_pattern == "orders-.*" and o.topics == ()
    assert o.topic_option == "subscribePattern='orders-.*'"
    assert o.matches("orders-eu") and o.matches("orders-")
    assert not o.matches("orders") and not o.matches("my-orders-eu")  # the whole name, as Java's matches()
    every = parse_source_options({"endpoint": EP, "subscribePattern": ".*"}, stream=False)
    for system in ("%RETRY%g", "%DLQ%g", "RMQ_SYS_TRACE_TOPIC", "SCHEDULE_TOPIC_XXXX", "TBW102",
                   "rmq_sys_wheel_timer", "TRANS_CHECK_MAX_TIME_TOPIC", "CHECKPOINT_TOPIC",
                   "DefaultHeartBeatSyncerTopic"):
        assert not every.matches(system), system
    assert every.matches("payments")
    # offsets JSON may name topics the pattern matches, and the retry topic read along
    parse_source_options({"endpoint": EP, "subscribePattern": "o.*", "consumerGroup": "g",
                          "startingOffsets": '{"orders": {"0": 1}, "%RETRY%g": {"0": 1}}'}, stream=True)
    for raw, needles in [
        (batch(subscribePattern="o.*"),
         ["topic='orders' and subscribePattern='o.*' cannot be used together"]),
        ({"endpoint": EP}, ["topic is required", "subscribePattern='orders-.*' for the topics"]),
        ({"endpoint": EP, "subscribePattern": ""}, ["subscribePattern='' is not valid"]),
        ({"endpoint": EP, "subscribePattern": "orders-("}, ["subscribePattern='orders-(' is not valid",
                                                            "no regular expression"]),
        ({"endpoint": EP, "subscribePattern": "o.*", "startingOffsets": '{"payments": {"0": 1}}'},
         ["startingOffsets=", "topics ['payments'] that subscribePattern='o.*' does not match"]),
    ]:
        with pytest.raises(ValueError) as info:
            parse_source_options(raw, stream=None)
        for needle in needles:
            assert needle in str(info.value), str(info.value)


def test_assign_names_queues_instead_of_topics_and_reads_no_retries() -> None:
    o = parse_source_options({"endpoint": EP, "consumerGroup": "g",
                              "assign": '{"orders": ["broker-a:1", 0], "payments": ["2"]}'}, stream=True)
    assert o.topics == ("orders", "payments") and o.assigned is not None
    assert o.include_retry is False and o.all_topics() == ("orders", "payments")
    assert o.topic_option == """assign='{"orders":[0,"broker-a:1"],"payments":[2]}'"""
    assert o.assigns(MessageQueue("orders", "broker-a", 1)) and o.assigns(MessageQueue("orders", "any", 0))
    assert not o.assigns(MessageQueue("orders", "broker-b", 1))  # another broker's queue 1
    assert not o.assigns(MessageQueue("payments", "broker-a", 0))
    assert parse_source_options(stream(), stream=True).assigns(MessageQueue("orders", "b", 9))
    # offsets JSON of assigned queues (a broker-less key names them on any broker)
    parse_source_options({"endpoint": EP, "consumerGroup": "g", "assign": '{"orders": ["broker-a:1"]}',
                          "startingOffsets": '{"orders": {"1": 5}}'}, stream=True)
    retry = '{"%RETRY%g": [0], "orders": [0]}'  # the group's retry queues named: read along
    along = parse_source_options({"endpoint": EP, "consumerGroup": "g", "assign": retry}, stream=True)
    assert along.topics == ("orders",) and along.include_retry
    assert along.all_topics() == ("orders", "%RETRY%g") and along.retry_topic == "%RETRY%g"
    assert along.assigns(MessageQueue("%RETRY%g", "b", 0))
    assert not along.assigns(MessageQueue("%RETRY%g", "b", 1))
    other = parse_source_options({"endpoint": EP, "consumerGroup": "h", "assign": retry}, stream=True)
    assert other.topics == ("%RETRY%g", "orders") and not other.include_retry  # another group's: a topic
    for raw, needles in [
        (batch(assign='{"orders": [0]}'),
         ["assign='{\"orders\": [0]}' and topic='orders' cannot be used together"]),
        ({"endpoint": EP, "subscribePattern": "o.*", "assign": '{"orders": [0]}'},
         ["and subscribePattern='o.*' cannot be used together"]),
        ({"endpoint": EP, "assign": "orders:0"}, ["assign='orders:0' is not valid JSON"]),
        ({"endpoint": EP, "assign": "{}"}, ["non-empty JSON object of topic -> [queues]"]),
        ({"endpoint": EP, "assign": '{"orders": []}'}, ["topic 'orders' must be a non-empty list"]),
        ({"endpoint": EP, "assign": '{"orders": {"0": 1}}'}, ["must be a non-empty list of queues"]),
        ({"endpoint": EP, "assign": '{"orders": ["a:b"]}'}, ["queue 'a:b' of topic 'orders' must be"]),
        ({"endpoint": EP, "assign": '{"orders": [-1]}'}, ["queue -1 of topic 'orders' must be"]),
        ({"endpoint": EP, "assign": '{"orders": [true]}'}, ["queue True of topic 'orders' must be"]),
        ({"endpoint": EP, "assign": '{"orders": [1, "1"]}'}, ["names queue '1' of 'orders' twice"]),
        ({"endpoint": EP, "assign": '{"orders": [1], "orders": [2]}'}, ["names 'orders' twice"]),
        ({"endpoint": EP, "assign": '{"or ders": [1]}'}, ["topic 'or ders' must be 1-127 letters"]),
        ({"endpoint": EP, "consumerGroup": "g", "assign": '{"orders": [0]}', "includeRetry": "true"},
         ["includeRetry='true' is not valid", "name the queues of '%RETRY%g' in assign"]),
        ({"endpoint": EP, "consumerGroup": "g", "assign": '{"orders": [0]}',
          "startingOffsets": '{"%RETRY%g": {"0": 5}}'},
         ["with assign, name %RETRY%<consumerGroup>'s queues"]),
        ({"endpoint": EP, "assign": '{"orders": ["broker-a:0"]}',
          "startingOffsets": '{"orders": {"broker-a:1": 5}}'},
         ["startingOffsets=", "names queue broker-a:1 of 'orders', which assign=", "name only assigned"]),
        ({"endpoint": EP}, ["topic is required", "or assign"]),
    ]:
        with pytest.raises(ValueError) as info:
            parse_source_options(raw, stream=None)
        for needle in needles:
            assert needle in str(info.value), str(info.value)


class TopicsBackend:
    """The part of a Backend that OffsetReader.bounds uses: topics with queues of given bounds."""

    def __init__(self, topics: dict[str, int]) -> None:
        self.topics = topics  # topic -> max offset of its one queue
        self.write_only: set[str] = set()  # listed, no readable queue (perm=2)
        self.listing_fails: PymqError | None = None
        self.refused_subscription: PymqError | None = None
        self.checks = 0

    def topic_names(self) -> list[str]:
        if self.listing_fails is not None:
            raise self.listing_fails
        return sorted(self.topics)

    def queue_bounds(self, topic: str, *, unreachable: Any = None,
                     unreadable: Any = None) -> dict[MessageQueue, QueueBounds] | None:
        if topic not in self.topics or topic in self.write_only:
            return None
        return {MessageQueue(topic, "b", 0): QueueBounds(0, self.topics[topic])}

    def check_consumer_group(self, group: str, queues: Any) -> None:
        pass

    def check_client_config(self, group: str, queues: Any, subscription: str, expression_type: str) -> None:
        self.checks += 1
        if self.refused_subscription is not None:
            raise self.refused_subscription

    def register_consumer(self, group: str, topics: Any) -> None:
        self.registered = list(topics)

    def unavailable_brokers(self, queues: Any) -> set[str]:
        return set()  # as a pymq broker's: a queue its route does not have is not held elsewhere

    def unlisted_queues(self, topics: Any) -> dict[str, dict[str, list[MessageQueue]]]:
        return {}


class QueuesBackend(TopicsBackend):
    """Topics of several queues on broker "b", each holding 10 messages."""

    def queue_bounds(self, topic: str, *, unreachable: Any = None,
                     unreadable: Any = None) -> dict[MessageQueue, QueueBounds] | None:
        if topic not in self.topics:
            return None
        return {MessageQueue(topic, "b", q): QueueBounds(0, 10) for q in range(self.topics[topic])}


def test_subscribe_pattern_topics_are_asked_at_every_bounds_and_a_gone_one_is_missing() -> None:
    backend = TopicsBackend({"orders-eu": 3, "payments": 5, "%RETRY%g": 1, "TBW102": 1})
    opts = parse_source_options({"endpoint": EP, "subscribePattern": "orders-.*|%RETRY%g|TBW102",
                                 "consumerGroup": "g", "includeRetry": "false"}, stream=True)
    reader = OffsetReader(opts, backend=backend)  # type: ignore[arg-type]
    bounds, missing = reader.bounds(require_topics=True)
    assert sorted(mq.topic for mq in bounds) == ["orders-eu"] and missing == []
    assert backend.registered == ["orders-eu"]
    backend.topics["orders-us"] = 2  # a new topic joins at the next look
    bounds, _ = reader.bounds(require_topics=False)
    assert sorted(mq.topic for mq in bounds) == ["orders-eu", "orders-us"]
    del backend.topics["orders-eu"]  # gone: a topic of the checkpoint that matches is missing
    bounds, missing = reader.bounds(require_topics=False, keep={"orders-eu", "payments"})
    assert sorted(mq.topic for mq in bounds) == ["orders-us"] and missing == ["orders-eu"]
    assert reader.opts.topics == ("orders-eu", "orders-us")


def test_subscribe_pattern_mid_stream_outlives_a_listing_the_broker_does_not_answer() -> None:
    """One trigger during a broker restart ended a pattern stream; a named topic's queues wait."""
    backend = TopicsBackend({"orders-eu": 3, "orders-us": 2})
    opts = parse_source_options({"endpoint": EP, "subscribePattern": "orders-.*", "consumerGroup": "g",
                                 "includeRetry": "false"}, stream=True)
    reader = OffsetReader(opts, backend=backend)  # type: ignore[arg-type]
    reader.bounds(require_topics=True)
    backend.listing_fails = BrokerUnavailableError("broker at b is unavailable (ListTopics)")
    bounds, missing = reader.bounds(require_topics=False, keep={"orders-eu"})
    assert sorted(mq.topic for mq in bounds) == ["orders-eu", "orders-us"] and missing == []
    restarted = OffsetReader(opts, backend=backend)  # type: ignore[arg-type]
    bounds, _ = restarted.bounds(require_topics=False, keep={"orders-eu"})  # the checkpoint's topics
    assert sorted(mq.topic for mq in bounds) == ["orders-eu"]
    with pytest.raises(BrokerUnavailableError):  # at the start it is the error
        OffsetReader(opts, backend=backend).bounds(require_topics=True)  # type: ignore[arg-type]
    backend.listing_fails = AccessDeniedError("user 'bob' may not List on Cluster:b")
    with pytest.raises(AccessDeniedError, match=r"subscribePattern='orders-\.\*' lists the topics .*"
                                                r"may not List on Cluster:b.*Grant it List"):
        OffsetReader(opts, backend=backend).bounds(require_topics=True)  # type: ignore[arg-type]
    backend.listing_fails = PymqError("the name servers do not list their topics (enableAllTopicList="
                                      "false in their configuration). Set ..., or name the topics",
                                      code="NOT_SUPPORTED")
    with pytest.raises(PymqError, match=r"^\[NOT_SUPPORTED\] pymq option subscribePattern='orders-\.\*' "
                                        r"cannot find its topics: the name servers do not list .*name "
                                        r"the topics with option topic$"):
        OffsetReader(opts, backend=backend).bounds(require_topics=True)  # type: ignore[arg-type]


class SlowBackend(TopicsBackend):
    """Each topic's bounds take 20 ms (two round trips); the brokers of ``down`` do not answer."""

    def __init__(self, topics: dict[str, int], down: set[str]) -> None:
        super().__init__(topics)
        self.down = down
        self.asking = self.most_at_once = 0
        self.lock = threading.Lock()

    def queue_bounds(self, topic: str, *, unreachable: Any = None,
                     unreadable: Any = None) -> dict[MessageQueue, QueueBounds] | None:
        with self.lock:
            self.asking += 1
            self.most_at_once = max(self.most_at_once, self.asking)
        time.sleep(0.02)
        with self.lock:
            self.asking -= 1
        if topic in self.down:
            if unreachable is None:
                raise BrokerUnavailableError(f"broker of {topic} is unavailable (TopicStats)")
            unreachable.add(f"broker-{topic}")
            return {}
        return super().queue_bounds(topic, unreachable=unreachable)

    def unavailable_brokers(self, queues: Any) -> set[str]:
        return set()


def test_subscribe_pattern_asks_many_topics_at_once_and_keeps_their_order() -> None:
    """A pattern matching 1,000 topics took 1.1-1.5 s a trigger, each topic's two round trips one
    after another. Now several at once; an error is the first topic's, as one by one."""
    topics = {f"t-{i:02d}": i for i in range(40)}
    backend = SlowBackend(topics, down={"t-05", "t-20"})
    opts = parse_source_options({"endpoint": EP, "subscribePattern": "t-.*", "consumerGroup": "g",
                                 "includeRetry": "false"}, stream=True)
    with pytest.raises(BrokerUnavailableError, match="broker of t-05 ") as info:  # at the start: the error
        OffsetReader(opts, backend=backend).bounds(require_topics=True)  # type: ignore[arg-type]
    assert "t-20" not in str(info.value)
    assert backend.most_at_once > 1
    reader = OffsetReader(opts, backend=backend)  # type: ignore[arg-type]
    backend.down = set()
    reader.bounds(require_topics=True)
    backend.down = {"t-05", "t-20"}
    started = time.monotonic()
    bounds, missing = reader.bounds(require_topics=False)  # mid-stream: their queues wait
    assert time.monotonic() - started < 0.5  # 40 x 20 ms one after another
    assert sorted({mq.topic for mq in bounds}) == sorted(set(topics) - {"t-05", "t-20"}) and missing == []
    assert [bounds[MessageQueue(t, "b", 0)].max_offset for t in ("t-00", "t-39")] == [0, 39]
    queues = [MessageQueue("t-05", "broker-t-05", 0), MessageQueue("t-20", "broker-t-20", 0),
              MessageQueue("t-01", "b", 0)]
    assert reader.unavailable_brokers(queues) == {"broker-t-05", "broker-t-20"}


def test_assign_bounds_are_the_named_queues_and_each_must_be_there_at_the_start(
    caplog: pytest.LogCaptureFixture,
) -> None:
    backend = QueuesBackend({"orders": 4})
    opts = parse_source_options({"endpoint": EP, "consumerGroup": "g",
                                 "assign": '{"orders": ["b:1", 3]}'}, stream=True)
    reader = OffsetReader(opts, backend=backend)  # type: ignore[arg-type]
    bounds, missing = reader.bounds(require_topics=True)
    assert sorted(mq.queue_id for mq in bounds) == [1, 3] and missing == []
    backend.topics["orders"] = 2  # scaled in: queue 3 gone mid-stream is left out, not an error
    bounds, missing = reader.bounds(require_topics=False)
    assert sorted(mq.queue_id for mq in bounds) == [1] and missing == []
    with pytest.raises(ValueError, match=r"""pymq option assign='\{"orders":\[3,"b:1"\]\}': topic """
                                         r"'orders' has no readable queue 3 on .*; its queues are b:0, "
                                         r"b:1. Name those it has"):
        OffsetReader(opts, backend=backend).bounds(require_topics=True)  # type: ignore[arg-type]
    other = parse_source_options({"endpoint": EP, "assign": '{"orders": ["c:1"]}'}, stream=False)
    with pytest.raises(ValueError, match="has no readable queue c:1"):  # queue 1 of another broker
        OffsetReader(other, backend=backend).bounds(require_topics=True)  # type: ignore[arg-type]
    # a stream restarted from its checkpoint (no strict look): said once, not raised
    restarted = OffsetReader(opts, backend=backend)  # type: ignore[arg-type]
    with caplog.at_level(logging.WARNING, logger="pyspark_pymq.spark"):
        restarted.bounds(require_topics=False)
        restarted.bounds(require_topics=False)
    said = [r.getMessage() for r in caplog.records if "has no readable queue 3" in r.getMessage()]
    assert len(said) == 1 and "nothing is read for it until the topic has it" in said[0]


def test_subscribe_pattern_skips_a_listed_topic_it_cannot_read() -> None:
    """A write-only topic (perm=2) that matches failed the query as one that 'does not exist'."""
    backend = TopicsBackend({"orders-eu": 3, "orders-us": 2})
    backend.write_only.add("orders-us")
    opts = parse_source_options({"endpoint": EP, "subscribePattern": "orders-.*", "consumerGroup": "g",
                                 "includeRetry": "false"}, stream=True)
    reader = OffsetReader(opts, backend=backend)  # type: ignore[arg-type]
    bounds, missing = reader.bounds(require_topics=True)
    assert sorted(mq.topic for mq in bounds) == ["orders-eu"] and missing == []
    _, missing = reader.bounds(require_topics=False, keep={"orders-eu", "orders-us"})
    assert missing == ["orders-us"]  # read before: the checkpoint's, so its loss is reported


def test_a_restarted_stream_checks_its_subscription_at_its_first_bounds() -> None:
    """Spark calls no initialOffset for a stream restarted from its checkpoint: the brokers' check
    of the subscription ran only at a query's first start, so a broker that lost its SQL92
    failed every task instead."""
    backend = TopicsBackend({"orders": 3})
    opts = parse_source_options({"endpoint": EP, "topic": "orders", "consumerGroup": "g",
                                 "subscriptionType": "SQL92", "subscription": "a > 1"}, stream=True)
    backend.refused_subscription = NoPermissionError("SQL92 filters are off on this broker")
    reader = OffsetReader(opts, backend=backend)  # type: ignore[arg-type]
    with pytest.raises(NoPermissionError, match="subscriptionType='SQL92', subscription='a > 1': SQL92"):
        reader.bounds(require_topics=False, keep={"orders"})
    backend.refused_subscription = BrokerUnavailableError("broker b is unavailable")
    reader.bounds(require_topics=False)  # mid-stream, a broker not answering: checked later
    backend.refused_subscription = None
    reader.bounds(require_topics=False)
    checks = backend.checks
    reader.bounds(require_topics=False)
    assert backend.checks == checks == 3  # once it passed, not again


def test_starting_modes_parse() -> None:
    assert parse_source_options(stream(startingOffsets="LATEST"), stream=True).starting.kind is (
        StartKind.LATEST
    )
    o = parse_source_options(stream(startingTimestamp="1700000000000"), stream=True)
    assert o.starting.kind is StartKind.TIMESTAMP and o.starting.timestamp_ms == 1700000000000
    o = parse_source_options(
        stream(startingOffsets='{"orders": {"broker-a:0": 5, "1": -2}}'), stream=True
    )
    assert dict(o.starting.offsets) == {("orders", "broker-a", 0): 5, ("orders", "", 1): -2}
    o = parse_source_options(batch(lastMessagesPerQueue="7"), stream=False)
    assert o.starting.kind is StartKind.LAST_N and o.starting.count == 7
    # the retry topic read along can be positioned, as the checkpoint keeps its offsets
    o = parse_source_options(stream(startingOffsets='{"orders": {"0": 1}, "%RETRY%g": {"0": 3}}'),
                             stream=True)
    assert dict(o.starting.offsets) == {("orders", "", 0): 1, ("%RETRY%g", "", 0): 3}
    o = parse_source_options(batch(consumerGroup="g", includeRetry="true",
                                   endingOffsets='{"%RETRY%g": {"b:0": 3}}'), stream=False)
    assert dict(o.ending.offsets) == {("%RETRY%g", "b", 0): 3}
    o = parse_source_options(
        stream(consumeFromWhere="timestamp", consumeTimestamp="12"), stream=True
    )
    assert o.consume_from_where is ConsumeFromWhere.CONSUME_FROM_TIMESTAMP
    assert o.consume_timestamp_ms == 12


# -- offsets JSON -------------------------------------------------------------------------


def test_offset_json_has_one_deterministic_order() -> None:
    a = {
        MessageQueue("t2", "broker-a", 0): 5,
        MessageQueue("t1", "broker-b", 10): 1,
        MessageQueue("t1", "broker-b", 2): 3,
        MessageQueue("t1", "broker-a", 1): 4,
    }
    b = dict(reversed(list(a.items())))
    assert json.dumps(offsets_to_json(a)) == json.dumps(offsets_to_json(b))
    assert json.dumps(offsets_to_json(a)) == (
        '{"t1": {"broker-a:1": 4, "broker-b:2": 3, "broker-b:10": 1}, "t2": {"broker-a:0": 5}}'
    )
    # Spark stores json.dumps text and gives json.loads back: a round trip is exact.
    assert offsets_from_json(json.loads(json.dumps(offsets_to_json(a)))) == a
    # a key a later version adds ("$..." cannot be a topic) leaves the offsets readable, so that
    # going back a version does not strand a checkpoint (as $topicIds did the version before it)
    later = {"$later": {"t1": [1, 2]}, **offsets_to_json(a)}
    assert offsets_from_json(later) == a


def test_initial_marker() -> None:
    assert is_initial(json.loads(json.dumps(INITIAL)))
    assert not is_initial({"t": {"b:0": 1}})
    with pytest.raises(ValueError):
        offsets_from_json(INITIAL)
    with pytest.raises(ValueError, match="malformed"):
        offsets_from_json({"t": {"b:0": -1}})


def test_user_offsets_allow_broker_less_keys() -> None:
    assert parse_offsets_json('{"t": {"0": 3}}', "startingOffsets", allow_earliest=True) == {
        ("t", "", 0): 3
    }


def test_user_offsets_refuse_a_key_given_twice_and_digits_that_are_no_number() -> None:
    for text in ('{"t": {"0": 1}, "t": {"1": 2}}', '{"t": {"0": 1, "0": 2}}'):
        with pytest.raises(ValueError, match=r"startingOffsets names '.*' twice"):
            parse_offsets_json(text, "startingOffsets", allow_earliest=True)
    for text in ('{"t": {"b:1": 5, "b:01": 7}}', '{"t": {"0": 5, " 0": 9}}'):  # one queue, two spellings
        with pytest.raises(ValueError, match=r"startingOffsets names queue '.*' of 't' twice"):
            parse_offsets_json(text, "startingOffsets", allow_earliest=True)
    # "²" is a digit to str.isdigit, not to int(): the option's own message, not int()'s
    with pytest.raises(ValueError, match=r"queue key 'b:²' of topic 't' must be 'brokerName:queueId'"):
        parse_offsets_json('{"t": {"b:²": 1}}', "startingOffsets", allow_earliest=True)


# -- range planning ----------------------------------------------------------------------

Q0, Q1, Q2 = (MessageQueue("t", "broker-a", i) for i in range(3))


def test_plan_ranges_skips_empty_new_and_dropped_queues() -> None:
    ranges = plan_ranges({Q0: 5, Q1: 7, Q2: 3}, {Q0: 9, Q1: 7}, fail_on_data_loss=True)
    assert ranges == [OffsetRange(Q0, 5, 9)]
    # a new queue (only in end) starts where end says: nothing to read yet
    assert plan_ranges({Q0: 1}, {Q0: 1, Q1: 4}, fail_on_data_loss=True) == []


def test_plan_ranges_reset_queue_goes_through_fail_on_data_loss() -> None:
    with pytest.raises(DataLossError, match="failOnDataLoss=false"):
        plan_ranges({Q0: 50}, {Q0: 10}, fail_on_data_loss=True)
    assert plan_ranges({Q0: 50}, {Q0: 10}, fail_on_data_loss=False) == [OffsetRange(Q0, 0, 10)]


def test_split_ranges_covers_every_offset_once() -> None:
    ranges = [OffsetRange(Q0, 0, 100), OffsetRange(Q1, 10, 13)]
    assert split_ranges(ranges) == ranges
    split = split_ranges(ranges, max_per_partition=30)
    assert [(r.start, r.end) for r in split if r.mq == Q0] == [(0, 25), (25, 50), (50, 75),
                                                             (75, 100)]
    assert [r for r in split if r.mq == Q1] == [OffsetRange(Q1, 10, 13)]
    split = split_ranges(ranges, min_partitions=8)
    assert len(split) >= 8
    for mq, lo, hi in ((Q0, 0, 100), (Q1, 10, 13)):
        mine = [r for r in split if r.mq == mq]
        assert mine[0].start == lo and mine[-1].end == hi
        assert all(a.end == b.start for a, b in itertools.pairwise(mine))


def test_split_ranges_gives_at_least_min_partitions_where_rounding_gives_fewer() -> None:
    three = [OffsetRange(Q0, 0, 10), OffsetRange(Q1, 0, 10), OffsetRange(Q2, 0, 10)]
    split = split_ranges(three, min_partitions=4)  # Kafka's rounding alone: 3 x round(1.33) = 3
    assert len(split) == 4
    assert sorted((r.mq.queue_id, r.start, r.end) for r in split) == sorted(
        {(r.mq.queue_id, r.start, r.end) for r in split})
    assert sum(r.size for r in split) == 30
    # never more pieces than messages
    assert len(split_ranges([OffsetRange(Q0, 0, 2), OffsetRange(Q1, 0, 1)], min_partitions=9)) == 3
    # the biggest backlog is cut first
    uneven = split_ranges([OffsetRange(Q0, 0, 90), OffsetRange(Q1, 0, 9), OffsetRange(Q2, 0, 9)],
                          min_partitions=5)
    assert len(uneven) >= 5 and len([r for r in uneven if r.mq == Q0]) >= 3


def test_small_ranges_of_several_queues_share_a_partition() -> None:
    """A Python source's task costs ~50 ms: a trickle over 256 queues made 256 tasks a batch."""
    queues = [MessageQueue("t", "b", i) for i in range(256)]
    trickle = [OffsetRange(q, 10, 15) for q in queues]  # 5 new messages a queue
    assert [len(p) for p in pack_ranges(trickle)] == [200, 56]
    assert [r for p in pack_ranges(trickle) for r in p] == trickle  # every range once, in order
    mixed = [OffsetRange(Q0, 0, 5000), OffsetRange(Q1, 0, 10), OffsetRange(Q2, 0, 995)]
    assert pack_ranges(mixed) == [[mixed[0]], [mixed[1]], [mixed[2]]]  # 10 + 995 > 1000
    assert pack_ranges(mixed, capacity=20) == [[mixed[0]], [mixed[2]], [mixed[1]]]  # large ones alone
    assert pack_ranges(mixed[1:], capacity=1005) == [mixed[1:]]
    opts = parse_source_options(batch(), stream=False)
    parts = make_partitions(trickle, opts)
    assert [len(p.ranges) for p in parts] == [200, 56] and [p.value for p in parts] == [0, 1]
    assert [(r.queue_id, r.start, r.end) for r in parts[1].ranges][-1] == (255, 10, 15)
    # minPartitions asks for parallelism: one range a partition; maxMessagesPerPartition caps a pack
    assert len(make_partitions(trickle, parse_source_options(batch(minPartitions="2"), stream=False))) == 256
    capped = make_partitions(trickle, parse_source_options(batch(maxMessagesPerPartition="30"), stream=False))
    assert {len(p.ranges) for p in capped} == {6, 4} and len(capped) == 43


def test_a_partition_reads_its_ranges_one_after_the_other(monkeypatch: pytest.MonkeyPatch) -> None:
    from pyspark_pymq.spark import read_loop

    read: list[tuple[int, int, int]] = []

    def fake_range(opts: Any, r: Any) -> Any:
        read.append((r.queue_id, r.start, r.end))
        yield pa.RecordBatch.from_pydict({"queue_id": [r.queue_id] * (r.end - r.start)})

    monkeypatch.setattr(read_loop, "_read_range", fake_range)
    opts = parse_source_options(batch(), stream=False)
    part = make_partitions([OffsetRange(Q0, 0, 2), OffsetRange(Q1, 5, 5), OffsetRange(Q2, 1, 4)], opts)[0]
    rows = [v for b in read_partition(opts, part) for v in b.column(0).to_pylist()]
    assert read == [(0, 0, 2), (2, 1, 4)] and rows == [0, 0, 2, 2, 2]  # an empty range is not pulled


def test_limit_offsets_shares_the_budget_by_backlog() -> None:
    start = {Q0: 0, Q1: 100, Q2: 5}
    available = {Q0: 300, Q1: 200, Q2: 5}
    end = limit_offsets(start, available, 100)
    assert sum(end[q] - start[q] for q in start) == 100
    assert end[Q2] == 5 and end[Q0] - 0 == 75 and end[Q1] - 100 == 25
    assert limit_offsets(start, available, 10_000) == available
    # tiny budgets still move: exactly the budget, never past the backlog
    end = limit_offsets({Q0: 0, Q1: 0}, {Q0: 1, Q1: 1}, 1)
    assert sum(end.values()) == 1


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_budget_below_the_queues_behind_goes_round_robin(seed: int) -> None:
    """1,024 queues, 100 new messages a trigger landing anywhere, maxMessagesPerTrigger 100: with
    the turn taken from the offsets a queue went up to 96 triggers unread (a scale probe); in
    turn, at most about 1,024 / 100."""
    rng = random.Random(seed)
    queues = [MessageQueue("t", "b", i) for i in range(1024)]
    at = dict.fromkeys(queues, 0)
    available = dict.fromkeys(queues, 5)  # every queue behind at first
    turn, waited, longest = Turn(), dict.fromkeys(queues, 0), 0
    for _ in range(400):
        for _ in range(100):
            available[rng.choice(queues)] += 1
        end = limit_offsets(at, available, 100, turn)
        assert sum(end[q] - at[q] for q in queues) == 100
        for q in queues:
            waited[q] = 0 if end[q] > at[q] or end[q] == available[q] else waited[q] + 1
            longest = max(longest, waited[q])
        at = end
    assert longest <= 11


def test_limit_offsets_holds_no_small_queue_back_behind_big_ones() -> None:
    # seven queues 1M behind and one 100 behind, 1000 a trigger: the small one moves at once
    big = [MessageQueue("t", "b", i) for i in range(7)]
    small = MessageQueue("t", "b", 7)
    start = dict.fromkeys([*big, small], 0)
    available = {**dict.fromkeys(big, 1_000_000), small: 100}
    end = limit_offsets(start, available, 1000)
    assert end[small] >= 1 and sum(end.values()) == 1000
    # a budget below the number of queues behind: over a few triggers, every queue moves
    queues = [MessageQueue("t", "b", i) for i in range(5)]
    at = dict.fromkeys(queues, 0)
    moved: set[MessageQueue] = set()
    for _ in range(5):
        end = limit_offsets(at, dict.fromkeys(queues, 1_000), 2)
        assert sum(end[q] - at[q] for q in queues) == 2
        moved |= {q for q in queues if end[q] > at[q]}
        at = end
    assert moved == set(queues)


def test_report_data_loss_fails_or_logs(caplog: pytest.LogCaptureFixture) -> None:
    with pytest.raises(DataLossError) as info:
        report_data_loss(True, "queue t@b#0: offsets [0, 5) are gone", "skip to offset 5")
    text = str(info.value)
    assert "offsets [0, 5) are gone" in text and "failOnDataLoss=false" in text
    assert "skip to offset 5" in text
    with caplog.at_level(logging.WARNING, logger="pyspark_pymq.spark"):
        report_data_loss(False, "queue t@b#0: offsets [0, 5) are gone", "skip to offset 5")
    assert "skip to offset 5" in caplog.text


# -- schema and decoding -----------------------------------------------------------------


def test_arrow_schema_is_what_spark_checks() -> None:
    expected = to_arrow_schema(source_schema(), timezone="UTC")
    assert arrow_schema().equals(expected)
    assert str(arrow_schema().field("topic").type) == "string"
    assert str(arrow_schema().field("store_timestamp").type) == "timestamp[us, tz=UTC]"
    assert source_schema().simpleString() == (
        "struct<" + ",".join(f"{name}:{sql_type}" for name, sql_type, _ in COLUMNS) + ">"
    )
    assert SOURCE_DDL.startswith("topic string, queue_id int, broker_name string")
    assert empty_batch().schema.equals(expected)


HOST = store_host_bytes("127.0.0.1", 8081)


def records(n: int, *, topic: str = "orders", props: list[dict[str, str]] | None = None,
            first_offset: int = 0, body_size: int = 16) -> bytes:
    out, phy = [], 4096
    for i in range(n):
        p = props[i % len(props)] if props else {
            "TAGS": "A" if i % 2 else "B", "KEYS": f"k{i} order-{i}", "UNIQ_KEY": f"U{i:031d}",
        }
        rec = encode_record(
            topic=topic.encode(), queue_id=2, flag=0, body=os.urandom(body_size) + bytes([1, 2]),
            properties=encode_properties(p), queue_offset=first_offset + i, physical_offset=phy,
            sys_flag=0, born_timestamp=1_700_000_000_000 + i, store_timestamp=1_700_000_000_500 + i,
            store_host=HOST, reconsume_times=i % 3,
        )
        out.append(rec)
        phy += len(rec)
    return b"".join(out)


def assert_same(batch: pa.RecordBatch, raw: bytes, read_from: str, retry: bool) -> None:
    reference = messages_to_batch(decode_messages(raw, "broker-a"), read_from=read_from,
                                  retry=retry)
    assert batch.schema.equals(arrow_schema())
    for name in batch.schema.names:
        assert batch.column(name).equals(reference.column(name)), name


@pytest.mark.parametrize(
    "props",
    [
        None,
        [{}],  # no properties at all: msg_id falls back to offset_msg_id
        [{"TAGS": "x"}, {}, {"KEYS": "one", "user": ""}, {"a": "1", "UNIQ_KEY": "U1"}],
    ],
)
def test_vectorised_decoder_matches_the_client_decoder(
    props: list[dict[str, str]] | None,
) -> None:
    raw = records(37, props=props)
    assert_same(decode_to_arrow(raw, topic="orders", broker_name="broker-a", retry=False), raw,
                "orders", False)


def test_retry_rows_show_the_original_topic() -> None:
    raw = records(5, topic="%RETRY%g", props=[{"RETRY_TOPIC": "orders", "UNIQ_KEY": "U"}, {}])
    batch = decode_to_arrow(raw, topic="%RETRY%g", broker_name="broker-a", retry=True)
    assert_same(batch, raw, "%RETRY%g", True)
    assert batch.column("topic").to_pylist() == ["orders", "%RETRY%g"] * 2 + ["orders"]
    assert set(batch.column("retry_topic").to_pylist()) == {"%RETRY%g"}


def test_decoder_stops_at_the_range_end_and_handles_odd_properties() -> None:
    raw = records(10, first_offset=100)
    batch = decode_to_arrow(raw, topic="orders", broker_name="broker-a", retry=False,
                           end_offset=104)
    assert batch.column("queue_offset").to_pylist() == [100, 101, 102, 103]
    # a property without its trailing separator: the per-message fallback decodes it
    odd = encode_record(
        topic=b"orders", queue_id=0, flag=0, body=b"x", properties=b"TAGS\x01a\x02KEYS\x01k",
        queue_offset=0, physical_offset=0, sys_flag=0, born_timestamp=1, store_timestamp=2,
        store_host=HOST, reconsume_times=0,
    )
    batch = decode_to_arrow(odd, topic="orders", broker_name="broker-a", retry=False)
    assert batch.column("tags").to_pylist() == ["a"] and batch.column("keys").to_pylist() == [
        ["k"]
    ]
    assert decode_to_arrow(b"", topic="t", broker_name="b", retry=False).num_rows == 0


def _orders_record(props: bytes, offset: int) -> bytes:
    """A record of topic 'orders' with these raw properties, at queue offset ``offset``."""
    return encode_record(
        topic=b"orders", queue_id=0, flag=0, body=b"x", properties=props, queue_offset=offset,
        physical_offset=1000 + offset, sys_flag=0, born_timestamp=1, store_timestamp=2,
        store_host=HOST, reconsume_times=0,
    )


def test_keys_of_a_record_naming_keys_twice_or_empty_stay_its_own() -> None:
    # a foreign producer's properties: KEYS twice in one record, or an empty KEYS, between
    # ordinary records: each row keeps its keys (the last KEYS counts, as the client decoder says)
    for odd, keys in ((b"KEYS\x01a\x02KEYS\x01b c\x02", ["b", "c"]), (b"KEYS\x01\x02UNIQ_KEY\x01U\x02", [])):
        raw = (_orders_record(b"KEYS\x01p\x02", 0) + _orders_record(odd, 1)
               + _orders_record(b"KEYS\x01q r\x02", 2))
        batch = decode_to_arrow(raw, topic="orders", broker_name="broker-a", retry=False)
        assert batch.column("keys").to_pylist() == [["p"], keys, ["q", "r"]]
        assert batch.column("keys").equals(messages_to_batch(
            decode_messages(raw, "broker-a"), read_from="orders", retry=False).column("keys"))


def test_a_record_naming_a_property_twice_gets_one_map_entry_the_last_as_the_client_decoder() -> None:
    twice = b"UNIQ_KEY\x01U1\x02TAGS\x01first\x02color\x01red\x02TAGS\x01second\x02color\x01blue\x02"
    alike = b"ab1c\x01x\x02ab2c\x01y\x02"  # same length, first and last byte: told apart all the same
    raw = (_orders_record(b"UNIQ_KEY\x01U0\x02TAGS\x01t\x02", 0) + _orders_record(twice, 1)
           + _orders_record(alike, 2))
    batch = decode_to_arrow(raw, topic="orders", broker_name="broker-a", retry=False)
    maps = batch.column("properties").to_pylist()
    assert maps[1] == [("UNIQ_KEY", "U1"), ("TAGS", "second"), ("color", "blue")]
    assert dict(maps[2]) == {"ab1c": "x", "ab2c": "y"}
    assert batch.column("tags").to_pylist() == ["t", "second", None]
    assert_same(batch, raw, "orders", False)
    # ordinary records keep the vectorised path
    props = pa.array([b"UNIQ_KEY\x01U\x02TAGS\x01t\x02KEYS\x01k\x02"] * 3, pa.binary())
    assert _properties(props, 3, batch.schema.field("properties").type) is not None
    assert _properties(pa.array([twice], pa.binary()), 1, batch.schema.field("properties").type) is None


def test_record_starts_fast_path_and_fallback() -> None:
    def rec(body_size: int, offset: int) -> bytes:
        return encode_record(
            topic=b"t", queue_id=0, flag=0, body=b"b" * body_size, properties=b"",
            queue_offset=offset, physical_offset=0, sys_flag=0, born_timestamp=0,
            store_timestamp=0, store_host=HOST, reconsume_times=0,
        )

    same = b"".join(rec(115, i) for i in range(4))
    assert find_record_starts(same).tolist() == [0, 200, 400, 600]
    # the total is a multiple of the first size, but the sizes differ
    mixed = rec(115, 0) + rec(115, 1) + rec(175, 2) + rec(55, 3)
    assert len(mixed) == 800
    assert find_record_starts(mixed).tolist() == [0, 200, 400, 660]
    with pytest.raises(ValueError, match="truncated"):
        find_record_starts(mixed[:-1])


def test_record_starts_from_the_sizes_the_broker_sent(monkeypatch: pytest.MonkeyPatch) -> None:
    def rec(body_size: int) -> bytes:
        return encode_record(
            topic=b"t", queue_id=0, flag=0, body=b"b" * body_size, properties=b"",
            queue_offset=0, physical_offset=0, sys_flag=0, born_timestamp=0,
            store_timestamp=0, store_host=HOST, reconsume_times=0,
        )

    mixed = rec(115) + rec(175) + rec(55) + rec(300)
    sizes = struct.pack("<4i", 200, 260, 140, 385)
    expected = [0, 200, 460, 600]
    assert find_record_starts(mixed, sizes).tolist() == expected
    # sizes that disagree with the records (a short list, a wrong size, a wrong sum) are not
    # trusted: the records' own sizes are followed instead
    for wrong in (sizes[:8], struct.pack("<4i", 200, 200, 200, 385), struct.pack("<4i", 200, 260, 140, 384),
                  struct.pack("<4i", 260, 200, 140, 385),
                  struct.pack("<4i", 460, -260, 400, 385), b"\x01\x02\x03"):
        assert find_record_starts(mixed, wrong).tolist() == expected
    # with the right sizes no record is visited one by one
    monkeypatch.setattr(pymq_arrow, "_TOTAL_SIZE", None)
    assert find_record_starts(mixed, sizes).tolist() == expected
    rows = decode_to_arrow(mixed, topic="t", broker_name="b", retry=False, sizes=sizes)
    assert rows.column("body").to_pylist() == [b"b" * n for n in (115, 175, 55, 300)]


def test_vectorised_decoder_on_random_messages() -> None:
    rng = random.Random(7)
    names = ["TAGS", "KEYS", "UNIQ_KEY", "RETRY_TOPIC", "a", "long-name", "x"]
    props = []
    for _ in range(50):
        chosen = rng.sample(names, rng.randint(0, len(names)))
        props.append({
            n: " ".join(f"k{rng.randint(0, 9)}" for _ in range(rng.randint(1, 3)))
            if n == "KEYS" else "".join(rng.choice("abc\u00e9") for _ in range(rng.randint(0, 5)))
            for n in chosen
        })
    raw = b"".join(
        records(1, topic="%RETRY%g", props=[p], first_offset=i,
                body_size=rng.randint(0, 300))
        for i, p in enumerate(props)
    )
    for retry in (False, True):
        batch = decode_to_arrow(raw, topic="%RETRY%g", broker_name="broker-a", retry=retry)
        assert_same(batch, raw, "%RETRY%g", retry)


def fields(*spec: tuple[str, Any] | str) -> StructType:
    """A user's schema: source columns by name, or (name, type) pairs (no session needed)."""
    return StructType([source_schema()[f] if isinstance(f, str) else StructField(f[0], f[1]) for f in spec])


def test_a_schema_of_some_columns_keeps_them_in_its_order() -> None:
    assert select_columns(None) is None
    assert select_columns(source_schema()) is None
    assert select_columns(fields("body", "queue_offset")) == ("body", "queue_offset")
    for columns in SUBSETS:
        user = fields(*columns)
        assert select_columns(user) == columns
        # what Spark checks the first batch of each partition against
        assert project(empty_batch(), columns).schema.equals(to_arrow_schema(user, timezone="UTC"))


@pytest.mark.parametrize(
    ("schema", "message"),
    [
        (fields("body", ("payload", BinaryType())),
         r"names column 'payload', which the source does not have; keep any of its columns: topic string, "
         r"queue_id int"),
        (fields(("queue_offset", IntegerType())),
         r"declares column 'queue_offset' as int, but the source reads it with type bigint: "
         r"declare 'queue_offset bigint' and cast after load\(\)"),
        (fields(("properties", MapType(StringType(), IntegerType()))),
         r"declare 'properties map<string,string>'"),
        (fields("body", "body"), r"names column 'body' twice"),
        (fields(("BODY", BinaryType())), r"names column 'BODY', .* did you mean 'body'\?"),
        (fields(("keys", ArrayType(StringType(), containsNull=False))),
         r"declares column 'keys' as array<string> with elements NOT NULL, but the source reads it with "
         r"elements and map values that may be null: declare 'keys array<string>'"),
        (fields(("born_timestamp", TimestampNTZType())),  # DDL "timestamp" with spark.sql.timestampType=NTZ
         r"as timestamp_ntz, but the source reads it with type timestamp_ltz: declare 'born_timestamp "
         r"timestamp_ltz'"),
        (StructType([StructField("body", BinaryType(), nullable=False)]), r"declares column 'body' NOT NULL"),
    ],
)
def test_a_schema_the_source_cannot_read_is_named(schema: StructType, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        select_columns(schema)


def test_an_empty_schema_is_refused() -> None:
    with pytest.raises(ValueError, match="keeps no column; name at least one of: topic string"):
        select_columns(StructType([]))


@pytest.mark.parametrize("retry", [False, True])
def test_kept_columns_decode_as_in_the_whole_schema(retry: bool) -> None:
    rng = random.Random(11)
    props = [{"TAGS": "A", "KEYS": "k1 k2", "UNIQ_KEY": "U1", "RETRY_TOPIC": "orders"}, {},
             {"TAGS": "B", "x": "\u00e9"}, {"UNIQ_KEY": "U2", "RETRY_TOPIC": "other"}]
    raw = b"".join(records(1, topic="%RETRY%g", props=[props[i % 4]], first_offset=i,
                           body_size=rng.randint(0, 50)) for i in range(23))
    whole = decode_to_arrow(raw, topic="%RETRY%g", broker_name="broker-a", retry=retry)
    for columns in SUBSETS:
        got = project(decode_to_arrow(raw, topic="%RETRY%g", broker_name="broker-a", retry=retry,
                                      columns=columns, end_offset=20), columns)
        assert got.schema.names == list(columns)
        for name in columns:
            assert got.column(name).equals(whole.column(name).slice(0, 20)), (columns, name)


def test_columns_that_need_no_properties_do_not_parse_them(monkeypatch: pytest.MonkeyPatch) -> None:
    raw = records(9)

    def refuse(*args: object) -> None:
        raise AssertionError("properties parsed")

    monkeypatch.setattr(pymq_arrow, "_properties", refuse)
    columns = ("queue_offset", "body", "offset_msg_id", "topic", "store_timestamp")
    got = decode_to_arrow(raw, topic="orders", broker_name="broker-a", retry=False, columns=columns)
    assert got.column("queue_offset").to_pylist() == list(range(9))
    assert got.column("body").to_pylist() == [m.body for m in decode_messages(raw, "broker-a")]
    for needs_them in ("tags", "keys", "msg_id", "properties"):
        with pytest.raises(AssertionError, match="properties parsed"):
            decode_to_arrow(raw, topic="orders", broker_name="broker-a", retry=False, columns=(needs_them,))
    with pytest.raises(AssertionError, match="properties parsed"):  # RETRY_TOPIC
        decode_to_arrow(raw, topic="%RETRY%g", broker_name="broker-a", retry=True, columns=("topic",))


# -- the stream reader's offset logic, against a fake broker --------------------------------


class FakeOffsetReader:
    """Stands in for OffsetReader: queue bounds and the resolved start are given."""

    def __init__(self, bounds: dict[MessageQueue, tuple[int, int]], topic_id: int = 0) -> None:
        self.set(bounds, topic_id)
        self.committed: dict[MessageQueue, int] = {}
        self.down: set[str] = set()  # brokers that are down (RocketMQ: not registered now)
        self.group_progress: dict[MessageQueue, int] = {}  # the group's offsets on the broker
        self.progress_fails: Exception | None = None  # what reading the group's progress raises
        self.opts: Any = None  # the query's options (make_stream sets them)

    def set(self, bounds: dict[MessageQueue, tuple[int, int]], topic_id: int = 0) -> None:
        self.queue_bounds = {mq: QueueBounds(lo, hi, topic_id) for mq, (lo, hi) in bounds.items()}

    def bounds(
        self, *, require_topics: bool, keep: Any = ()
    ) -> tuple[dict[MessageQueue, QueueBounds], list[str]]:
        topics = {mq.topic for mq in self.queue_bounds}
        return dict(self.queue_bounds), [t for t in ("t", "u") if t not in topics]

    def starting_offsets(self, bounds: dict[MessageQueue, QueueBounds]) -> dict[MessageQueue, int]:
        return {mq: b.min_offset for mq, b in bounds.items()}

    def unavailable_brokers(self, queues: Any) -> set[str]:
        return {mq.broker_name for mq in queues} & self.down

    def joining_offset(self, mq: MessageQueue, b: QueueBounds) -> int | None:
        return OffsetReader.joining_offset(self, mq, b)  # type: ignore[arg-type]

    @property
    def backend(self) -> Any:  # what joining_offset asks: the group's progress
        import types

        return types.SimpleNamespace(committed=self._progress)

    def _progress(self, group: str, mq: MessageQueue) -> int:
        if self.progress_fails is not None:
            raise self.progress_fails
        return self.group_progress.get(mq, -1)

    def topic_ids(self) -> dict[tuple[str, str], int]:
        return {(mq.topic, mq.broker_name): b.topic_id for mq, b in self.queue_bounds.items() if b.topic_id}

    def commit(self, offsets: dict[MessageQueue, int], read_with: Any = None) -> None:
        self.committed.update(offsets)
        self.read_with = read_with


def make_stream(fake: FakeOffsetReader, **extra: str) -> PymqMicroBatchStream:
    opts = parse_source_options(
        {"endpoint": EP, "topic": "t,u", "consumerGroup": "g", "includeRetry": "false",
         **extra},
        stream=True,
    )
    reader = PymqMicroBatchStream(opts)
    fake.opts = opts
    reader._reader = fake  # type: ignore[assignment]
    return reader


def ends(offset: dict[str, Any]) -> dict[MessageQueue, int]:
    return offsets_from_json(json.loads(json.dumps(offset)))


def test_stream_offsets_start_limit_new_queues_and_commit() -> None:
    T0, T1, U0 = MessageQueue("t", "b", 0), MessageQueue("t", "b", 1), MessageQueue("u", "b", 0)
    fake = FakeOffsetReader({T0: (0, 10), T1: (0, 30)})
    reader = make_stream(fake)
    first = reader.initialOffset()
    assert is_initial(first) and reader.partitions(first, first) == []
    # Batch 0 already reads (no empty first batch); its end carries its resolved start, so a
    # replay of batch 0 from the marker plans the same ranges.
    start = reader.latestOffset(first, ReadMaxRows(8))
    assert ends(start) == {T0: 2, T1: 6}  # shared by backlog: 10 vs 30
    assert json.loads(json.dumps(start))[FROM_KEY] == {"t": {"b:0": 0, "b:1": 0}}
    parts = reader.partitions(json.loads(json.dumps(first)), json.loads(json.dumps(start)))
    assert [(r.queue_id, r.start, r.end) for p in parts for r in p.ranges] == [(0, 0, 2), (1, 0, 6)]
    end = reader.latestOffset(start, ReadMaxRows(8))
    assert FROM_KEY not in end and ends(end) == {T0: 4, T1: 12}
    parts = reader.partitions(start, end)
    assert [(r.queue_id, r.start, r.end) for p in parts for r in p.ranges] == [(0, 2, 4), (1, 6, 12)]
    # a checkpoint of an older version: batch 0 ended at the resolved start and read nothing
    assert reader.partitions(first, {"t": {"b:0": 0, "b:1": 0}}) == []
    # Spark compares JSON text: the same offsets must serialise identically
    assert json.dumps(reader.latestOffset(end, ReadMaxRows(8))) == json.dumps(
        reader.latestOffset(end, ReadMaxRows(8))
    )
    # a new topic's queue joins at its first offset, then is read
    fake.set({T0: (0, 10), T1: (0, 30), U0: (5, 9)})
    more = reader.latestOffset(end, ReadAllAvailable())
    assert ends(more) == {T0: 10, T1: 30, U0: 5}
    assert ends(reader.latestOffset(more, ReadAllAvailable()))[U0] == 9
    reader.commit(more)
    assert fake.committed == {T0: 10, T1: 30, U0: 5}
    assert make_stream(fake, messageModel="BROADCASTING", startingOffsets="earliest",
                       includeRetry="false").options.commits_progress is False


def test_min_messages_per_trigger_holds_a_batch_back_until_enough_or_max_trigger_delay() -> None:
    T0, T1 = MessageQueue("t", "b", 0), MessageQueue("t", "b", 1)
    fake = FakeOffsetReader({T0: (0, 3)})
    reader = make_stream(fake, minMessagesPerTrigger="10", maxTriggerDelay="300ms")
    first = reader.latestOffset(reader.initialOffset(), ReadAllAvailable())
    assert ends(first) == {T0: 3}  # the first batch reads what is there
    end = json.loads(json.dumps(first))
    fake.set({T0: (0, 8)})
    assert json.dumps(reader.latestOffset(end, ReadAllAvailable())) == json.dumps(end)  # 5 < 10: no batch
    fake.set({T0: (0, 9), T1: (0, 4)})  # a new queue joins, its messages count from the next batch
    joined = reader.latestOffset(end, ReadAllAvailable())
    assert ends(joined) == {T0: 3, T1: 0}
    fake.set({T0: (0, 9), T1: (0, 4)})
    end = json.loads(json.dumps(joined))
    grown = reader.latestOffset(end, ReadAllAvailable())  # 6 + 4 = 10 new: a batch
    assert ends(grown) == {T0: 9, T1: 4}
    end = json.loads(json.dumps(grown))
    fake.set({T0: (0, 11), T1: (0, 4)})
    assert ends(reader.latestOffset(end, ReadAllAvailable())) == {T0: 9, T1: 4}
    time.sleep(0.35)  # maxTriggerDelay since the last batch: what is there goes
    assert ends(reader.latestOffset(end, ReadAllAvailable())) == {T0: 11, T1: 4}
    # with maxMessagesPerTrigger too: the batch waits for 10, then reads at most 12
    fake.set({T0: (0, 0)})
    both = make_stream(fake, minMessagesPerTrigger="10", maxMessagesPerTrigger="12")
    start = json.loads(json.dumps(both.latestOffset(both.initialOffset(), ReadMaxRows(12))))
    fake.set({T0: (0, 9)})
    assert ends(both.latestOffset(start, ReadMaxRows(12))) == {T0: 0}
    fake.set({T0: (0, 30)})
    assert ends(both.latestOffset(start, ReadMaxRows(12))) == {T0: 12}
    # Trigger.AvailableNow does not wait: it reads up to its target and ends
    fake.set({T0: (0, 4)})
    now = make_stream(fake, minMessagesPerTrigger="10")
    now.prepareForTriggerAvailableNow()
    done = json.loads(json.dumps(now.latestOffset(now.initialOffset(), ReadAllAvailable())))
    fake.set({T0: (0, 4)})
    assert ends(done) == {T0: 4}


def test_min_messages_per_trigger_options() -> None:
    opts = parse_source_options(stream(minMessagesPerTrigger="5", maxTriggerDelay="2m"), stream=True)
    assert (opts.min_messages_per_trigger, opts.max_trigger_delay_ms) == (5, 120_000)
    opts = parse_source_options(stream(minMessagesPerTrigger="5"), stream=True)
    assert opts.max_trigger_delay_ms == 15 * 60_000  # Kafka's default
    assert parse_source_options(stream(minMessagesPerTrigger="5", maxTriggerDelay="250"),
                                stream=True).max_trigger_delay_ms == 250
    for raw, needle in [
        (stream(minMessagesPerTrigger="50", maxMessagesPerTrigger="10"), "above maxMessagesPerTrigger=10"),
        (stream(maxTriggerDelay="1m"), "set minMessagesPerTrigger too"),
        (stream(minMessagesPerTrigger="5", maxTriggerDelay="soon"), "maxTriggerDelay='soon'"),
        (stream(minMessagesPerTrigger="0"), "minMessagesPerTrigger='0'"),
        (batch(minMessagesPerTrigger="5"), "minMessagesPerTrigger"),
    ]:
        with pytest.raises(ValueError, match=re.escape(needle)):
            parse_source_options(raw, stream=raw.get("consumerGroup") is not None)


def test_stream_offsets_available_now_target_and_data_loss() -> None:
    T0, T1 = MessageQueue("t", "b", 0), MessageQueue("t", "b", 1)
    fake = FakeOffsetReader({T0: (0, 10)})
    reader = make_stream(fake)
    reader.prepareForTriggerAvailableNow()
    fake.set({T0: (0, 50), T1: (0, 5)})  # arrives after the target was taken
    end = reader.latestOffset(reader.initialOffset(), ReadAllAvailable())
    assert ends(end) == {T0: 10}  # up to the target in batch 0
    # done: the same offset (JSON text and all) back, so Spark plans no second batch
    assert json.dumps(reader.latestOffset(end, ReadAllAvailable())) == json.dumps(end)

    # expired offsets, a deleted queue and a recreated queue: failOnDataLoss decides
    fake.set({T0: (4, 50)})
    strict = make_stream(fake)
    with pytest.raises(DataLossError, match=r"offsets \[2, 4\) are no longer on the broker"):
        strict.latestOffset({"t": {"b:0": 2}}, ReadAllAvailable())
    with pytest.raises(DataLossError, match="topic 'u' was deleted"):
        strict.latestOffset({"t": {"b:0": 5}, "u": {"b:0": 1}}, ReadAllAvailable())
    with pytest.raises(DataLossError, match="went back from 60 to 50"):
        strict.latestOffset({"t": {"b:0": 60}}, ReadAllAvailable())
    lenient = make_stream(fake, failOnDataLoss="false")
    assert ends(lenient.latestOffset({"t": {"b:0": 5}, "u": {"b:0": 1}}, ReadAllAvailable())) == {
        T0: 50
    }
    # a queue gone from a topic that is still there (RocketMQ's scale-in of read queues) keeps
    # its offset, and goes on from it when the topic has that queue again: nothing read twice
    T7 = MessageQueue("t", "b", 7)
    waiting = strict.latestOffset({"t": {"b:0": 5, "b:7": 3}}, ReadAllAvailable())
    assert ends(waiting) == {T0: 50, T7: 3}
    parts = strict.partitions({"t": {"b:0": 5, "b:7": 3}}, waiting)
    assert [r.queue_id for p in parts for r in p.ranges] == [0]
    fake.set({T0: (4, 50), T7: (0, 9)})
    assert ends(strict.latestOffset(waiting, ReadAllAvailable())) == {T0: 50, T7: 9}
    fake.set({T0: (4, 50)})
    # a queue whose broker is down waits where it is (no loss), and goes on once it is back
    A0 = MessageQueue("t", "a", 0)
    fake.down = {"a"}
    waiting = strict.latestOffset({"t": {"b:0": 5, "a:0": 7}}, ReadAllAvailable())
    assert ends(waiting) == {T0: 50, A0: 7}
    parts = strict.partitions({"t": {"b:0": 5, "a:0": 7}}, waiting)
    assert [r.broker_name for p in parts for r in p.ranges] == ["b"]
    assert len(strict.partitions({"t": {"b:0": 5, "a:0": 7}}, waiting)) == 1
    fake.down = set()
    fake.set({T0: (4, 50), A0: (0, 9)})
    assert ends(strict.latestOffset(waiting, ReadAllAvailable())) == {T0: 50, A0: 9}
    fake.set({T0: (4, 50)})
    # a %RETRY% queue missing from a live broker (RocketMQ: restarted, the group not
    # registered again yet) waits too; a missing queue of a user topic is still a loss
    R0 = MessageQueue("%RETRY%g", "b", 0)
    with_retry = make_stream(fake, includeRetry="true")
    assert ends(with_retry.latestOffset({"t": {"b:0": 5}, "%RETRY%g": {"b:0": 3}},
                                        ReadAllAvailable())) == {T0: 50, R0: 3}
    # offsets of a topic the query no longer reads are dropped, not reported
    assert ends(strict.latestOffset({"t": {"b:0": 5}, "old": {"b:0": 3}},
                                    ReadAllAvailable())) == {T0: 50}


def test_a_topic_created_again_is_told_by_its_id_whatever_its_offsets() -> None:
    """The new topic has more messages than the stream had read: offsets alone see nothing."""
    T0, T1, T2 = (MessageQueue("t", "b", q) for q in range(3))
    U0 = MessageQueue("u", "b", 0)
    fake = FakeOffsetReader({T0: (0, 10), T1: (0, 10), T2: (0, 10)}, topic_id=7)
    strict = make_stream(fake, topic="t")
    first = strict.latestOffset(strict.initialOffset(), ReadAllAvailable())
    assert json.loads(json.dumps(first))[TOPIC_IDS_KEY] == {"t": {"b": 7}}
    assert ends(first) == {T0: 10, T1: 10, T2: 10}
    # the same topic: nothing new, the same JSON text (Spark plans no batch)
    assert json.dumps(strict.latestOffset(first, ReadAllAvailable())) == json.dumps(
        strict.latestOffset(first, ReadAllAvailable()))
    strict.commit(first)
    assert fake.read_with == {("t", "b"): 7}  # the ids go with the commit (OffsetReader drops stale ones)

    fake.set({T0: (0, 25), T1: (0, 30)}, topic_id=8)  # deleted, created with 2 queues, refilled
    changed = r"topic 't' on broker b was deleted and created again since the checkpoint's last batch"
    with pytest.raises(DataLossError, match=changed + r" \(its id changed from 7 to 8\)"):
        strict.latestOffset(first, ReadAllAvailable())

    lenient = make_stream(fake, topic="t", failOnDataLoss="false")
    end = lenient.latestOffset(first, ReadAllAvailable())
    assert ends(end) == {T0: 25, T1: 30}  # T2 went with the old topic
    assert json.loads(json.dumps(end))[TOPIC_IDS_KEY] == {"t": {"b": 8}}
    parts = lenient.partitions(first, end)  # the new topic from its first message, not from 10
    assert sorted((r.queue_id, r.start, r.end) for p in parts for r in p.ranges) == [(0, 0, 25), (1, 0, 30)]
    assert ends(lenient.latestOffset(end, ReadAllAvailable())) == {T0: 25, T1: 30}  # then as usual

    # A restart replays the last batch from the checkpoint (partitions without latestOffset):
    # the re-created topic's queues are not read at the old offsets (then again from the start)
    fake.set({T0: (0, 10), T1: (0, 10), T2: (0, 10)}, topic_id=7)
    replayed = strict.latestOffset(first, ReadAllAvailable())  # nothing new: the same end
    fake.set({T0: (0, 12), T1: (0, 12), T2: (0, 12)}, topic_id=7)
    batch1 = strict.latestOffset(first, ReadAllAvailable())
    assert ends(batch1) == {T0: 12, T1: 12, T2: 12} and replayed == first
    fake.set({T0: (0, 25), T1: (0, 30)}, topic_id=8)
    with pytest.raises(DataLossError, match=changed):
        make_stream(fake, topic="t").partitions(first, batch1)
    assert make_stream(fake, topic="t", failOnDataLoss="false").partitions(first, batch1) == []

    # no id on one side (an older checkpoint, RocketMQ, a broker before ids): not judged
    no_ids = {k: v for k, v in first.items() if k != TOPIC_IDS_KEY}
    assert ends(strict.latestOffset(no_ids, ReadAllAvailable())) == {T0: 25, T1: 30, T2: 10}
    fake.set({T0: (0, 25), T1: (0, 30)})
    assert TOPIC_IDS_KEY not in strict.latestOffset(no_ids, ReadAllAvailable())
    # a topic missing now is the deleted-topic check's business, not an id change
    fake.set({U0: (0, 3)}, topic_id=9)
    with pytest.raises(DataLossError, match="topic 't' was deleted"):
        make_stream(fake).latestOffset(first, ReadAllAvailable())


def test_a_topic_created_again_while_its_broker_was_down_is_told_by_its_id() -> None:
    """The batch planned while the broker was down had no ids (its queues only waited): the next
    one compared nothing, and read the topic created again meanwhile at the old topic's offsets,
    skipping its first messages without a word (probe helper-91)."""
    T0, A0 = MessageQueue("t", "b", 0), MessageQueue("t", "a", 0)
    fake = FakeOffsetReader({T0: (0, 10), A0: (0, 10)}, topic_id=7)
    strict = make_stream(fake, topic="t")
    first = strict.latestOffset(strict.initialOffset(), ReadAllAvailable())
    fake.set({T0: (0, 10)}, topic_id=7)
    fake.down = {"a"}
    during = strict.latestOffset(first, ReadAllAvailable())
    assert json.loads(json.dumps(during))[TOPIC_IDS_KEY] == {"t": {"a": 7, "b": 7}}
    assert json.dumps(during) == json.dumps(first)  # nothing new: no batch for the outage alone
    fake.down = set()
    fake.set({T0: (0, 10), A0: (0, 30)}, topic_id=7)
    fake.queue_bounds[A0] = QueueBounds(0, 30, 8)  # broker a came back with t created again
    with pytest.raises(DataLossError, match=r"topic 't' on broker a was deleted and created again"):
        strict.latestOffset(during, ReadAllAvailable())
    lenient = make_stream(fake, topic="t", failOnDataLoss="false")
    end = lenient.latestOffset(during, ReadAllAvailable())
    assert [(r.start, r.end) for p in lenient.partitions(during, end) for r in p.ranges
            if r.broker_name == "a"] == [(0, 30)]  # the new topic from its first message


@pytest.mark.parametrize("starting", ["group", "earliest"])
def test_a_queue_of_a_broker_down_at_the_start_joins_at_the_groups_progress(starting: str) -> None:
    """A stream started while broker a was down read a's queues from their first message once it
    was back, though the group had read them up to 25 (probe helper-93): with startingOffsets=group
    a queue that joins starts where the group is, as a RocketMQ consumer's rebalance does; a queue
    the group never read, or another startingOffsets, from its first message."""
    T0, A0, A1 = MessageQueue("t", "b", 0), MessageQueue("t", "a", 0), MessageQueue("t", "a", 1)
    fake = FakeOffsetReader({T0: (0, 30)})
    fake.group_progress = {T0: 30, A0: 25}
    stream = make_stream(fake, topic="t", startingOffsets=starting)
    first = stream.latestOffset(stream.initialOffset(), ReadAllAvailable())
    fake.set({T0: (0, 30), A0: (0, 35), A1: (0, 4)})  # broker a is back
    joined = stream.latestOffset(first, ReadAllAvailable())
    at = 25 if starting == "group" else 0
    assert ends(joined)[A0] == at and ends(joined)[A1] == 0
    then = stream.latestOffset(joined, ReadAllAvailable())
    parts = stream.partitions(joined, then)
    assert sorted((r.broker_name, r.queue_id, r.start, r.end) for p in parts for r in p.ranges) == [
        ("a", 0, at, 35), ("a", 1, 0, 4)]
    if starting != "group":
        return
    # the group's progress below the queue's first message: failOnDataLoss, as at a query's start
    # (review helper-94); a broker that cannot say its progress yet: the queue joins later
    fake.set({T0: (0, 30)})
    restarted = make_stream(fake, topic="t")
    first = restarted.latestOffset(restarted.initialOffset(), ReadAllAvailable())
    fake.set({T0: (0, 30), A0: (27, 35)})
    with pytest.raises(DataLossError, match=r"the group's progress 25 is below the queue's first message"):
        restarted.latestOffset(first, ReadAllAvailable())
    fake.progress_fails = BrokerUnavailableError("broker a is loading")
    assert A0 not in ends(restarted.latestOffset(first, ReadAllAvailable()))
    fake.progress_fails = None
    lenient = make_stream(fake, topic="t", failOnDataLoss="false")
    assert ends(lenient.latestOffset(first, ReadAllAvailable()))[A0] == 27


def test_the_stream_driver_imports_no_producer_admin_or_transactions() -> None:
    """Spark starts fresh Python processes, one after the other, before a streaming query's
    first batch: to create the data source and check its options, to plan the read, and the
    source's runner. What they import is the query's start-up time. Options and schema need
    neither numpy, ssl, gRPC nor Arrow (~0.1 s), and a tag subscription is checked without the
    broker's parsers and protobuf (~0.05 s); the runner plans offsets, the producer, the admin
    client and transactions are not its business (~0.1 s more)."""
    import subprocess
    import sys

    code = (
        "import sys\n"
        "import pyspark_pymq.spark.data_source\n"
        "from pyspark_pymq.spark.options import parse_source_options\n"
        "for tags in ('*', 'TagA || TagB'):\n"
        "    parse_source_options({'endpoint': '127.0.0.1:1', 'topic': 't', 'consumerGroup': 'g',\n"
        "                          'subscription': tags}, stream=True)\n"
        "for m in ('numpy', 'ssl', 'grpc', 'pyarrow', 'pyspark_pymq.client.transport', 'pymq_broker',\n"
        "          'google.protobuf'):\n"
        "    assert m not in sys.modules, m\n"
        "import pyspark_pymq.spark.data_source, pyspark_pymq.spark.micro_batch_stream\n"
        "loaded = sorted(m for m in sys.modules if m.startswith('pyspark_pymq.client.'))\n"
        "for m in ('producer', 'admin', 'transaction', 'consumer'):\n"
        "    assert 'pyspark_pymq.client.' + m not in sys.modules, loaded\n"
        # the package's names still load on first use, whichever comes first
        "from pyspark_pymq.client import Admin, Producer, TransactionProducer\n"
        "import pyspark_pymq.client as c\n"
        "assert c.Producer is Producer and Admin.__module__ == 'pyspark_pymq.client.admin'\n"
        "assert sorted(dir(c)) == sorted(c.__all__)\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
    for first in ("pyspark_pymq.backend", "pyspark_pymq.client.producer", "pyspark_pymq.client.admin"):
        code = f"import {first}; from pyspark_pymq import Producer"
        subprocess.run([sys.executable, "-c", code], check=True)


def test_expired_offsets_skipped_with_fail_on_data_loss_false_spend_no_trigger_budget() -> None:
    # retention moved t/0's min offset far past the checkpoint; u/0 has a live backlog
    T0, U0 = MessageQueue("t", "b", 0), MessageQueue("u", "b", 0)
    fake = FakeOffsetReader({T0: (1_000_000, 1_000_100), U0: (0, 1000)})
    lenient = make_stream(fake, failOnDataLoss="false")
    start = {"t": {"b:0": 0}, "u": {"b:0": 0}}
    offset = json.loads(json.dumps(lenient.latestOffset(start, ReadMaxRows(100))))
    end = ends(offset)
    # the 100 rows of this trigger go to what is still there: t/0 from its min offset, and u/0
    assert end[T0] >= 1_000_000 and end[U0] > 0
    assert (end[T0] - 1_000_000) + end[U0] == 100
    # the batch (and its replay, from the checkpointed end) plans t/0 from its min offset, not
    # one range over the million gone offsets (split into many partitions by maxMessagesPerPartition)
    split = make_stream(fake, failOnDataLoss="false", maxMessagesPerPartition="10")
    for stream in (lenient, split):
        ranges = [(r.topic, r.start, r.end) for p in stream.partitions(start, offset) for r in p.ranges]
        assert sum(1 for t, _, _ in ranges if t == "t") <= 10
        assert min(a for t, a, _ in ranges if t == "t") == 1_000_000
    # the next trigger goes on from that end; with nothing new it returns it unchanged (no batch)
    fake.set({T0: (1_000_000, end[T0]), U0: (0, end[U0])})
    assert lenient.latestOffset(offset, ReadMaxRows(100)) == offset
    # AvailableNow whose target lies in the expired offsets: nothing to read, and no false
    # "its offsets went back" report
    fake.set({T0: (1_000_000, 1_000_100)})
    target = make_stream(FakeOffsetReader({T0: (0, 500)}), failOnDataLoss="false")
    target.prepareForTriggerAvailableNow()
    target._reader = fake  # type: ignore[assignment]
    first = json.loads(json.dumps(target.latestOffset({"t": {"b:0": 0}}, ReadAllAvailable())))
    assert ends(first) == {T0: 1_000_000}
    # and the next trigger finds nothing new (the same JSON text): the query ends
    assert json.dumps(target.latestOffset(first, ReadAllAvailable())) == json.dumps(first)


def test_a_queue_gone_from_its_topic_is_reported_once(caplog: pytest.LogCaptureFixture) -> None:
    T0, T7 = MessageQueue("t", "b", 0), MessageQueue("t", "b", 7)
    fake = FakeOffsetReader({T0: (0, 10)})
    stream = make_stream(fake)
    start: dict[str, Any] = {"t": {"b:0": 10, "b:7": 3}}
    with caplog.at_level(logging.WARNING, logger="pyspark_pymq.spark.micro_batch_stream"):
        for _ in range(3):
            start = json.loads(json.dumps(stream.latestOffset(start, ReadAllAvailable())))
        assert caplog.text.count("is not among topic 't''s read queues now") == 1
        fake.set({T0: (0, 10), T7: (0, 3)})  # back
        stream.latestOffset(start, ReadAllAvailable())
        fake.set({T0: (0, 10)})  # and gone again: said again
        stream.latestOffset(start, ReadAllAvailable())
    assert caplog.text.count("is not among topic 't''s read queues now") == 2


def test_a_queue_of_a_broker_that_is_down_is_reported_once_per_outage(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Each trigger repeated the warning for every queue of a broker that was down: an hour-long
    outage with a 2 s trigger flooded the driver's log. Once per queue and outage now."""
    A0, B0 = MessageQueue("t", "a", 0), MessageQueue("t", "b", 0)
    fake = FakeOffsetReader({A0: (0, 10)})
    fake.down = {"b"}
    stream = make_stream(fake)
    start: dict[str, Any] = {"t": {"a:0": 10, "b:0": 3}}
    said = "pymq source: t@b#0 is not in the route now (broker b is unavailable)"
    with caplog.at_level(logging.WARNING, logger="pyspark_pymq.spark.micro_batch_stream"):
        for _ in range(3):
            start = json.loads(json.dumps(stream.latestOffset(start, ReadAllAvailable())))
        assert ends(start)[B0] == 3  # it waits where it was
        assert caplog.text.count(said) == 1, caplog.text
        fake.down = set()
        fake.set({A0: (0, 10), B0: (0, 3)})  # back
        stream.latestOffset(start, ReadAllAvailable())
        fake.down = {"b"}
        fake.set({A0: (0, 10)})  # down again: said again
        stream.latestOffset(start, ReadAllAvailable())
    assert caplog.text.count(said) == 2

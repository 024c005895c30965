"""The Spark sink and the listener helper against a real broker, on the shared local[2] session."""

from __future__ import annotations

import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.dataset as ds
import pytest
from broker_process import BrokerProcess
from helpers import read_all, unique
from pyspark_pymq import Admin, Message, MessageExt, Producer, PullConsumer
from pyspark_pymq.client.route import PERM_READ
from pyspark_pymq.errors import NoPermissionError
from pyspark_pymq.spark.listener import ConsumeConcurrentlyStatus, MessageListener
from pyspark_pymq.spark.sink_options import parse_sink_options
from pyspark_pymq.spark.writer import write_partition

pytestmark = pytest.mark.spark
TASK_RETRY_JOB = Path(__file__).resolve().parent / "jobs" / "task_retry_job.py"


def test_batch_write_sends_every_row_with_its_columns(spark: Any, shared_broker: Any) -> None:
    ep = shared_broker.endpoint
    topic = unique("sink")
    Admin(ep).create_topic(topic, queues=4)
    rows = [(f"order-{i}", f"T{i % 3}", [f"k{i}", "all"], {"n": str(i)}, f"cust-{i % 5}") for i in range(300)]
    df = spark.createDataFrame(
        rows, "body string, tags string, keys array<string>, properties map<string,string>, "
              "sharding_key string").coalesce(1)  # one partition: its row order is the key order
    df.write.format("pymq").option("endpoint", ep).option("topic", topic).mode("append").save()
    got = read_all(ep, topic)
    assert sorted(m.body.decode() for m in got) == sorted(r[0] for r in rows)
    by_body = {m.body.decode(): m for m in got}
    for body, tags, keys, props, _shard in rows[:20]:
        m = by_body[body]
        assert m.tags == tags and m.keys == tuple(keys) and m.user_properties == props
    queue_of: dict[str, set[int]] = {}
    for m in got:
        queue_of.setdefault(m.properties["__SHARDINGKEY"], set()).add(m.queue_id)
    assert all(len(q) == 1 for q in queue_of.values())  # same key, same queue
    for q in {m.queue_id for m in got}:
        per_key: dict[str, int] = {}
        for m in sorted((m for m in got if m.queue_id == q), key=lambda m: m.queue_offset):
            i = int(m.body.decode().split("-")[1])
            key = m.properties["__SHARDINGKEY"]
            assert per_key.get(key, -1) < i, "per-key order of the rows was not kept"
            per_key[key] = i


@pytest.mark.parametrize("mode", ["sync", "async", "oneway"])
def test_send_modes_deliver_every_row(spark: Any, shared_broker: Any, mode: str) -> None:
    ep = shared_broker.endpoint
    topic = unique(f"mode-{mode}")
    Admin(ep).create_topic(topic, queues=2)
    df = spark.range(2000).selectExpr("CAST(id AS STRING) AS body").repartition(3)
    (df.write.format("pymq").option("endpoint", ep).option("topic", topic)
     .option("sendMode", mode).option("maxBatchBytes", 4096).mode("append").save())
    bodies = sorted(int(m.body) for m in read_all(ep, topic))
    assert bodies == list(range(2000))


def test_topic_column_delay_level_and_queue_id(spark: Any, shared_broker: Any) -> None:
    ep = shared_broker.endpoint
    a, b = unique("col-a"), unique("col-b")
    for t in (a, b):
        Admin(ep).create_topic(t, queues=4)
    df = spark.createDataFrame(
        [(a, b"x1", None, 3), (b, b"x2", None, 2), (a, b"late", 1, 1)],
        "topic string, body binary, delay_level int, queue_id int")
    df.write.format("pymq").option("endpoint", ep).mode("append").save()
    deadline = time.monotonic() + 10
    while len(read_all(ep, a)) < 2 and time.monotonic() < deadline:
        time.sleep(0.1)
    got_a = {m.body: m for m in read_all(ep, a)}
    assert set(got_a) == {b"x1", b"late"} and got_a[b"x1"].queue_id == 3
    assert got_a[b"late"].queue_id == 1
    assert [m.queue_id for m in read_all(ep, b)] == [2]


def test_a_deliver_time_ms_column_delivers_each_row_at_its_time(spark: Any, shared_broker: Any) -> None:
    """RocketMQ 5's delivery time: the sink dropped a row's TIMER_DELIVER_MS property (a reserved
    name) and delivered it at once (probe helper-93). A timestamp column or epoch ms."""
    import datetime

    ep = shared_broker.endpoint
    topic = unique("timed")
    Admin(ep).create_topic(topic, queues=1)
    at = int(time.time() * 1000) + 6000
    when = datetime.datetime.fromtimestamp(at / 1000, tz=datetime.timezone.utc)
    for rows, schema in ((
            [(b"at-ms", at), (b"now-ms", None)], "body binary, deliver_time_ms bigint"), (
            [(b"at-ts", when), (b"now-ts", None)], "body binary, deliver_time_ms timestamp")):
        spark.createDataFrame(rows, schema).write.format("pymq").option("endpoint", ep) \
            .option("topic", topic).mode("append").save()
    if time.time() * 1000 < at - 500:  # the writes took less than the delay: nothing timed is out yet
        assert {m.body for m in read_all(ep, topic)} == {b"now-ms", b"now-ts"}
    while len(read_all(ep, topic)) < 4 and time.time() * 1000 < at + 5000:
        time.sleep(0.1)
    assert time.time() * 1000 >= at
    assert {m.body for m in read_all(ep, topic)} == {b"at-ms", b"now-ms", b"at-ts", b"now-ts"}


def test_rows_read_from_pymq_go_to_the_topic_option_not_back_to_their_own(
        spark: Any, shared_broker: Any) -> None:
    """A pass-through keeps the source's `topic` column; the `topic` option wins over it (Spark's Kafka
    sink does the same), else the rows would be written back into the topic they were read from."""
    ep = shared_broker.endpoint
    src, dst = unique("pass-src"), unique("pass-dst")
    for t in (src, dst):
        Admin(ep).create_topic(t, queues=2)
    with Producer(ep) as producer:
        producer.send_batch([Message(src, f"m{i}".encode(), tags="T", keys=[f"k{i}"]) for i in range(6)])
    read = spark.read.format("pymq").option("endpoint", ep).option("topic", src).load()
    for columns in (("topic", "body"), ("topic", "body", "tags", "keys", "properties")):  # columnar, per row
        read.select(*columns).write.format("pymq").option("endpoint", ep).option("topic", dst) \
            .mode("append").save()
    assert len(read_all(ep, src)) == 6
    got = read_all(ep, dst)
    assert sorted(m.body for m in got) == sorted([f"m{i}".encode() for i in range(6)] * 2)
    assert sorted(m.keys for m in got if m.tags == "T") == [(f"k{i}",) for i in range(6)]


def test_bad_columns_and_options_fail_before_any_row_is_written(spark: Any, shared_broker: Any) -> None:
    ep = shared_broker.endpoint
    topic = unique("bad")
    Admin(ep).create_topic(topic, queues=1)

    def write(df: Any, **opts: str) -> str:
        w = df.write.format("pymq").option("endpoint", ep).mode("append")
        for k, v in opts.items():
            w = w.option(k, v)
        with pytest.raises(Exception) as info:
            w.save()
        return str(info.value)

    assert "needs a 'body' column" in write(spark.createDataFrame([("x",)], "value string"), topic=topic)
    msg = write(spark.createDataFrame([(1,)], "body int"), topic=topic)
    assert "'body' has type int" in msg and "binary or string" in msg
    msg = write(spark.createDataFrame([("x", 1)], "body string, tags int"), topic=topic)
    assert "'tags' has type int" in msg
    assert "needs a topic" in write(spark.createDataFrame([("x",)], "body string"))
    msg = write(spark.createDataFrame([("x",)], "body string"), topic=topic, sendMode="fast")
    assert "sendMode='fast'" in msg and "sync, async, oneway" in msg
    assert "Did you mean 'sendMode'" in write(spark.createDataFrame([("x",)], "body string"),
                                              topic=topic, sendmod="sync")
    msg = write(spark.createDataFrame([("x",)], "body string"), topic=topic, action="reconsumeLater")
    assert "consumerGroup is required" in msg
    # rows without body and properties: a row the broker cannot send back would be copied to %RETRY% empty
    lean = spark.createDataFrame([(1, "m", "t", "b", 0)], "commit_log_offset bigint, msg_id string, "
                                 "topic string, broker_name string, reconsume_times int")
    msg = write(lean, topic=topic, action="reconsumeLater", consumerGroup="g")
    assert "needs the pymq source's columns ['body', 'properties']" in msg
    with pytest.raises(Exception, match=r"mode\('overwrite'\).*append-only.*\.mode\('append'\)"):
        (spark.createDataFrame([("x",)], "body string").write.format("pymq").option("endpoint", ep)
         .option("topic", topic).mode("overwrite").save())
    assert read_all(ep, topic) == []


def test_a_stream_with_a_bad_column_fails_at_start_naming_it(
    spark: Any, shared_broker: Any, tmp_path: Path
) -> None:
    ep = shared_broker.endpoint
    topic = unique("bad-stream")
    Admin(ep).create_topic(topic, queues=1)
    q = (spark.readStream.format("rate").option("rowsPerSecond", 50).load()
         .selectExpr("value AS body", "CAST(value AS STRING) AS tags")
         .writeStream.format("pymq").option("endpoint", ep).option("topic", topic)
         .option("checkpointLocation", str(tmp_path / "ckpt")).start())
    with pytest.raises(Exception) as info:
        q.awaitTermination(120)
    assert "column 'body' has type bigint" in str(info.value) and "binary or string" in str(info.value)
    assert read_all(ep, topic) == []


def test_a_topic_the_broker_does_not_know_fails_the_write_on_the_driver(
    spark: Any, shared_broker: Any, tmp_path: Path
) -> None:
    """One route look-up before any task: not every task's first send after Spark's retries."""
    ep = shared_broker.endpoint
    missing = unique("missing")
    df = spark.createDataFrame([("x",)], "body string")
    with pytest.raises(Exception, match=rf"looking up topic '{missing}' before writing failed: topic "
                                        rf"'{missing}' does not exist") as info:
        df.write.format("pymq").option("endpoint", ep).option("topic", missing).mode("append").save()
    assert "Failed to initialize Python data source writer" in str(info.value)  # no task ran
    rate = spark.readStream.format("rate").option("rowsPerSecond", 5).load()
    q = (rate.selectExpr("CAST(value AS STRING) AS body").writeStream.format("pymq")
         .option("endpoint", ep).option("topic", missing)
         .option("checkpointLocation", str(tmp_path / "ckpt")).start())
    with pytest.raises(Exception, match=f"looking up topic '{missing}' before writing"):
        q.awaitTermination(120)
    assert missing not in set(Admin(ep).topics()["topic"])


def test_replayed_rows_are_dropped_by_the_dedup_window(shared_broker: Any) -> None:
    """The same task twice (a retry or a replayed batch) sends the same UNIQ_KEYs."""
    from pyspark.sql.types import StringType, StructField, StructType

    ep = shared_broker.endpoint
    plain, dedup = unique("nodedup"), unique("dedup")
    Admin(ep).create_topic(plain, queues=2)
    Admin(ep).create_topic(dedup, queues=2, dedup_window_ms=60_000)
    schema = StructType([StructField("body", StringType())])
    batch = pa.record_batch([pa.array([f"r{i}" for i in range(500)])], names=["body"])
    for topic in (plain, dedup):
        opts = parse_sink_options({"endpoint": ep, "topic": topic}, schema, stream=True)
        for _attempt in range(2):
            write_partition(opts, iter([batch]))
    assert len(read_all(ep, plain)) == 1000  # at-least-once: the replay duplicated
    got = read_all(ep, dedup)
    assert sorted(m.body.decode() for m in got) == sorted(f"r{i}" for i in range(500))


@pytest.mark.parametrize("mode", ["sync", "async", "oneway"])
@pytest.mark.parametrize("per_row", [None, "tags", "sharding_key"], ids=["plain", "per-row", "sharded"])
def test_a_refused_send_fails_the_task_with_the_code_and_the_rows(
    shared_broker: Any, mode: str, per_row: str | None
) -> None:
    """A read-only topic: NO_PERMISSION is not retriable, so the task fails naming the rows.

    oneway too: it is lossy only in transport, and no send could ever succeed here.
    """
    from pyspark.sql.types import StringType, StructField, StructType

    ep = shared_broker.endpoint
    topic = unique(f"readonly-{mode}")
    Admin(ep).create_topic(topic, queues=1, perm=PERM_READ)
    fields = [StructField("body", StringType())] + ([StructField(per_row, StringType())] if per_row else [])
    columns = [pa.array([f"r{i}" for i in range(30)])] + ([pa.array(["t"] * 30)] if per_row else [])
    batch = pa.record_batch(columns, names=[f.name for f in fields])
    opts = parse_sink_options({"endpoint": ep, "topic": topic, "sendMode": mode}, StructType(fields),
                              stream=False)
    with pytest.raises(NoPermissionError) as info:
        write_partition(opts, iter([batch]))
    assert info.value.code == "NO_PERMISSION"
    rows = "row 0 of partition 0" if per_row == "sharding_key" else "rows 0..29 of partition 0"
    assert rows in str(info.value) and "no writable queue" in str(info.value)
    assert Admin(ep).topic_stats(topic)["max_offset"].sum() == 0


def test_a_write_query_with_a_refused_send_fails_naming_the_code(spark: Any, shared_broker: Any) -> None:
    ep = shared_broker.endpoint
    topic = unique("readonly-query")
    Admin(ep).create_topic(topic, queues=1, perm=PERM_READ)
    df = spark.range(10).selectExpr("CAST(id AS STRING) AS body").coalesce(1)
    with pytest.raises(Exception) as info:
        df.write.format("pymq").option("endpoint", ep).option("topic", topic).mode("append").save()
    assert "[NO_PERMISSION]" in str(info.value) and "rows 0..9 of partition 0" in str(info.value)


def test_a_retried_task_sends_the_same_keys_so_the_dedup_window_drops_them(shared_broker: Any) -> None:
    """A real task retry (its own driver, local[2,2]): the first attempt died after 200+ rows."""
    ep = shared_broker.endpoint
    plain, dedup = unique("retry-nodedup"), unique("retry-dedup")
    Admin(ep).create_topic(plain, queues=2)
    Admin(ep).create_topic(dedup, queues=2, dedup_window_ms=600_000)
    job = subprocess.run([sys.executable, str(TASK_RETRY_JOB), ep, plain, dedup],
                         capture_output=True, text=True, timeout=300)
    assert job.returncode == 0, job.stdout[-3000:] + job.stderr[-3000:]
    expected = sorted(str(i) for i in range(1000))
    got = read_all(ep, plain)  # at-least-once: the first attempt's rows are there twice...
    assert len(got) >= 1200 and sorted({m.body.split(b":")[0].decode() for m in got}) == expected
    by_key: dict[str, set[bytes]] = {}
    for m in got:
        by_key.setdefault(m.msg_id, set()).add(m.body)
    assert len(by_key) == 1000 and all(len(b) == 1 for b in by_key.values())  # ...with the same keys
    got = read_all(ep, dedup)  # so a de-duplication window stores each row once
    assert sorted(m.body.split(b":")[0].decode() for m in got) == expected


def test_stream_replay_from_checkpoint_adds_no_duplicates_with_dedup(
    spark: Any, shared_broker: Any, tmp_path: Path
) -> None:
    ep = shared_broker.endpoint
    topic = unique("replay")
    Admin(ep).create_topic(topic, queues=2, dedup_window_ms=600_000)
    src = tmp_path / "src"
    src.mkdir()
    spark.range(400).selectExpr("CAST(id AS STRING) AS body").write.parquet(str(src / "part1"))
    ckpt = tmp_path / "ckpt"

    def run() -> None:
        q = (spark.readStream.schema("body string").parquet(str(src / "*"))
             .writeStream.format("pymq").option("endpoint", ep).option("topic", topic)
             .option("checkpointLocation", str(ckpt)).trigger(availableNow=True).start())
        q.awaitTermination(120)
        assert q.exception() is None

    run()
    assert len(read_all(ep, topic)) == 400
    # forget that batch 0 committed: the restart replays it with the same ids
    shutil.rmtree(ckpt / "commits")
    run()
    got = read_all(ep, topic)
    assert len(got) == 400 and len({m.msg_id for m in got}) == 400


def test_reconsume_later_sends_rows_back_with_their_error(spark: Any, shared_broker: Any) -> None:
    ep = shared_broker.endpoint
    topic, group = unique("back"), unique("g")
    Admin(ep).create_topic(topic, queues=2)
    Producer(ep).send_batch([Message(topic, f"m{i}") for i in range(20)])
    rows = (spark.read.format("pymq").option("endpoint", ep).option("topic", topic).load()
            .selectExpr("*", "'bad payload' AS error", "'ValueError' AS error_class"))
    (rows.write.format("pymq").option("endpoint", ep).option("action", "reconsumeLater")
     .option("consumerGroup", group).option("delayLevel", 1).mode("append").save())
    got = _pull_retry(ep, group, 20)
    assert sorted(m.body for m in got) == sorted(f"m{i}".encode() for i in range(20))
    m = got[0]
    assert m.retry_topic == topic and m.reconsume_times == 1
    assert m.properties["CONSUME_FAILURE_REASON"] == "bad payload"
    assert m.properties["CONSUME_FAILURE_EXCEPTION"] == "ValueError"
    assert m.properties["CONSUME_FAILURE_STAGE"] == "spark-sink"
    # straight to the DLQ with delayLevel -1
    (rows.limit(3).write.format("pymq").option("endpoint", ep).option("action", "reconsumeLater")
     .option("consumerGroup", group).option("delayLevel", -1).mode("append").save())
    assert len(Admin(ep).dead_letter_messages(group)) == 3


def test_listener_stream_retries_failures_and_dead_letters_poison(
    spark: Any, shared_broker: Any, tmp_path: Path
) -> None:
    """1 in 10 fails once, 1 in 100 always fails; the query never stops, nothing is lost."""
    ep = shared_broker.endpoint
    topic, group = unique("life"), unique("lg")
    Admin(ep).create_topic(topic, queues=2)
    n = 300
    Producer(ep).send_batch([Message(topic, str(i)) for i in range(n)])
    flaky = {i for i in range(n) if i % 10 == 3}
    poison = {i for i in range(n) if i % 100 == 7}
    max_times = 3

    def handle(msgs: list[MessageExt]) -> ConsumeConcurrentlyStatus:
        i = int(msgs[0].body)
        if i in poison or (i in flaky and msgs[0].reconsume_times == 0):
            raise ValueError(f"cannot handle {i}")
        return ConsumeConcurrentlyStatus.CONSUME_SUCCESS

    listener = MessageListener(ep, group, handle, max_reconsume_times=max_times)
    out = tmp_path / "out"

    def each_batch(df: Any, batch_id: int) -> None:
        good = listener.process(df, batch_id)
        good.select("body", "reconsume_times", "msg_id").write.mode("append").parquet(str(out))

    q = (spark.readStream.format("pymq").option("endpoint", ep).option("topic", topic)
         .option("consumerGroup", group).option("startingOffsets", "earliest").load()
         .writeStream.foreachBatch(each_batch)
         .option("checkpointLocation", str(tmp_path / "ckpt")).trigger(processingTime="200 milliseconds")
         .start())
    admin = Admin(ep)
    deadline = time.monotonic() + 300  # generous: CI machines are shared
    try:
        while time.monotonic() < deadline:
            assert q.isActive, f"query stopped: {q.exception()}"
            done = out.exists() and ds.dataset(str(out)).count_rows() >= n - len(poison)
            if done and len(admin.dead_letter_messages(group)) >= len(poison):
                break
            time.sleep(0.5)
        else:
            raise AssertionError(
                f"not done in time: {ds.dataset(str(out)).count_rows() if out.exists() else 0} rows, "
                f"{len(admin.dead_letter_messages(group))} dead letters"
            )
    finally:
        q.stop()
    table = ds.dataset(str(out)).to_table().to_pylist()
    bodies = Counter(int(r["body"]) for r in table)
    assert set(bodies) == set(range(n)) - poison
    assert all(c == 1 for c in bodies.values())  # each good message exactly once
    retried = {int(r["body"]): r["reconsume_times"] for r in table if int(r["body"]) in flaky}
    assert retried == dict.fromkeys(flaky - poison, 1)
    dead = admin.dead_letter_messages(group)
    assert sorted(int(d.body) for d in dead) == sorted(poison)
    assert all(d.reconsume_times == max_times + 1 for d in dead)
    assert all("cannot handle" in d.properties["CONSUME_FAILURE_REASON"] for d in dead)
    assert {d.properties["CONSUME_FAILURE_EXCEPTION"] for d in dead} == {"ValueError"}


def _pull_retry(ep: str, group: str, n: int) -> list[MessageExt]:
    """The first ``n`` messages of %RETRY%<group>, waiting for their delay to pass."""
    consumer = PullConsumer(ep, group)
    retry_mq = consumer.retry_queues()[0]
    got: list[MessageExt] = []
    deadline = time.monotonic() + 30
    while len(got) < n and time.monotonic() < deadline:
        got = consumer.pull(retry_mq, 0, 1000, suspend_timeout_ms=200).messages
    return got


def test_stream_reconsume_later_keeps_the_query_and_batch_of_each_failure(
    spark: Any, shared_broker: Any, tmp_path: Path
) -> None:
    """df.writeStream with action=reconsumeLater: the dead letter can say which query and batch failed it."""
    ep = shared_broker.endpoint
    topic, group = unique("sback"), unique("sbg")
    Admin(ep).create_topic(topic, queues=2)
    Producer(ep).send_batch([Message(topic, f"m{i}") for i in range(40)])
    failed = (spark.readStream.format("pymq").option("endpoint", ep).option("topic", topic)
              .option("consumerGroup", group).option("startingOffsets", "earliest")
              .option("includeRetry", "false").load()
              .where("CAST(body AS STRING) LIKE 'm1%'")  # m1, m10..m19
              .selectExpr("*", "concat('no price in ', CAST(body AS STRING)) AS error",
                          "'KeyError' AS error_class"))
    q = (failed.writeStream.format("pymq").option("endpoint", ep).option("action", "reconsumeLater")
         .option("consumerGroup", group).option("delayLevel", 1)
         .option("checkpointLocation", str(tmp_path / "ckpt")).trigger(availableNow=True).start())
    q.awaitTermination(120)
    assert q.exception() is None
    batches = {str(p["batchId"]) for p in q.recentProgress if p["numInputRows"]}
    got = _pull_retry(ep, group, 11)
    assert sorted(m.body for m in got) == sorted([b"m1"] + [f"m1{i}".encode() for i in range(10)])
    for m in got:
        assert m.retry_topic == topic and m.reconsume_times == 1
        assert m.properties["CONSUME_FAILURE_REASON"] == f"no price in {m.body.decode()}"
        assert m.properties["CONSUME_FAILURE_EXCEPTION"] == "KeyError"
        assert m.properties["CONSUME_FAILURE_STAGE"] == "spark-stream-sink"
        assert m.properties["CONSUME_FAILURE_QUERY_ID"] == str(q.id)
        assert m.properties["CONSUME_FAILURE_BATCH_ID"] in batches


def test_listener_batches_of_messages_fail_whole_and_none_means_reconsume_later(
    spark: Any, shared_broker: Any, tmp_path: Path
) -> None:
    """consumeMessageBatchMaxSize 4: one call per 4 messages; a failed call sends all 4 back."""
    ep = shared_broker.endpoint
    topic, group = unique("lbatch"), unique("lbg")
    Admin(ep).create_topic(topic, queues=2)
    Producer(ep).send_batch([Message(topic, f"m{i}") for i in range(30)])
    log = tmp_path / "calls.log"  # the listener runs in Spark's Python workers: log to a file

    def handle(msgs: list[MessageExt]) -> Any:
        bodies = [m.body.decode() for m in msgs]
        with log.open("a") as f:
            f.write(" ".join(bodies) + "\n")
        if "m5" in bodies:
            return None  # RocketMQ: null is RECONSUME_LATER
        if "m17" in bodies:
            msgs.clear()  # a listener that works its list off: the messages it failed still go back
            raise KeyError("m17")
        if "m22" in bodies:
            return ConsumeConcurrentlyStatus.RECONSUME_LATER
        return ConsumeConcurrentlyStatus.CONSUME_SUCCESS

    listener = MessageListener(ep, group, handle, consume_message_batch_max_size=4, delay_level=1)
    df = spark.read.format("pymq").option("endpoint", ep).option("topic", topic).load()
    with pytest.raises(ValueError, match=r"lacks \['topic', 'queue_id', .*without \.schema"):
        listener.process(spark.read.format("pymq").schema("body binary").option("endpoint", ep)
                         .option("topic", topic).load())
    good = {r["body"].decode() for r in listener.process(df, 7).select("body").collect()}
    calls = [line.split() for line in log.read_text().splitlines()]
    assert all(1 <= len(c) <= 4 for c in calls) and sum(len(c) for c in calls) == 30
    assert sum(len(c) == 4 for c in calls) >= 6  # 2 queues of 15: at most one short call each
    failed_calls = [c for c in calls if {"m5", "m17", "m22"} & set(c)]
    failed = {b for c in failed_calls for b in c}
    assert good == {f"m{i}" for i in range(30)} - failed
    assert listener.last_stats.reconsume_later == len(failed)
    assert listener.last_stats.consumed == 30 - len(failed)
    back = {m.body.decode(): m for m in _pull_retry(ep, group, len(failed))}
    assert set(back) == failed
    reason = {b: back[b].properties["CONSUME_FAILURE_REASON"] for b in failed}
    exc = {b: back[b].properties.get("CONSUME_FAILURE_EXCEPTION", "") for b in failed}
    for call in failed_calls:
        if "m5" in call:
            assert {reason[b] for b in call} == {"listener returned None"}
        elif "m17" in call:
            assert {exc[b] for b in call} == {"KeyError"}
        else:
            assert {reason[b] for b in call} == {"listener returned RECONSUME_LATER"}
    assert {m.properties["CONSUME_FAILURE_BATCH_ID"] for m in back.values()} == {"7"}


def test_a_listener_of_a_group_no_consumer_registered_says_so(
    spark: Any, shared_broker: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """A listener whose group was misspelt sent every failure to a %RETRY% topic no stream read,
    and nothing said so (newcomer probe)."""
    ep = shared_broker.endpoint
    topic = unique("lgroup")
    Admin(ep).create_topic(topic, queues=1)
    Producer(ep).send(Message(topic, b"m"))
    df = spark.read.format("pymq").option("endpoint", ep).option("topic", topic).load()

    def ok(msgs: list[MessageExt]) -> ConsumeConcurrentlyStatus:
        return ConsumeConcurrentlyStatus.CONSUME_SUCCESS

    typo = unique("billng")
    with caplog.at_level(logging.WARNING, logger="pyspark_pymq.spark.listener"):
        assert MessageListener(ep, typo, ok).process(df, 0).count() == 1
    assert f"MessageListener of consumer group {typo!r}: no consumer of the group has registered" in (
        caplog.text)
    assert f"%RETRY%{typo} does not exist" in caplog.text
    caplog.clear()
    group = unique("billing")
    PullConsumer(ep, group).register(topic)  # as a stream of the group does when it starts
    with caplog.at_level(logging.WARNING, logger="pyspark_pymq.spark.listener"):
        assert MessageListener(ep, group, ok).process(df, 0).count() == 1
    assert "no consumer of the group" not in caplog.text


def test_a_listener_runs_once_per_process_and_frees_earlier_batches_results(
    spark: Any, shared_broker: Any, tmp_path: Path
) -> None:
    """The result is written without running the listener again; a later batch's process frees
    the earlier results' blocks (left to the JVM's garbage collection, a long stream held hundreds
    of MB of them), and a freed result fails when read instead of consuming its messages again."""
    ep = shared_broker.endpoint
    topic, group = unique("lcache"), unique("lcg")
    Admin(ep).create_topic(topic, queues=2)
    Producer(ep).send_batch([Message(topic, f"m{i}") for i in range(20)])
    log = tmp_path / "calls.log"

    def handle(msgs: list[MessageExt]) -> ConsumeConcurrentlyStatus:
        with log.open("a") as f:
            f.write(f"{msgs[0].body.decode()}\n")
        return ConsumeConcurrentlyStatus.CONSUME_SUCCESS

    def held() -> set[int]:  # RDDs with blocks in Spark's storage (others' too: compared by id,
        # as an earlier test's results may be freed meanwhile)
        return {int(info.id()) for info in spark.sparkContext._jsc.sc().getRDDStorageInfo()}

    def calls() -> int:
        return len(log.read_text().splitlines())

    listener = MessageListener(ep, group, handle)
    df = spark.read.format("pymq").option("endpoint", ep).option("topic", topic).load()
    before = held()
    first = listener.process(df, 0)
    assert first.count() == 20 and first.select("body").distinct().count() == 20  # read twice
    assert calls() == 20  # the listener ran once
    one = held() - before
    assert one
    again = listener.process(df, 0)  # the same batch again (a retried foreachBatch): both kept
    assert again.count() == 20 and first.count() == 20
    both = held() - before
    assert one < both and len(both) == 2 * len(one)
    assert listener.process(df, 1).count() == 20 and calls() == 60
    later = held() - before
    assert len(later) == len(one) and not later & both  # batch 0's results are freed
    with pytest.raises(Exception, match="CHECKPOINT_RDD_BLOCK_ID_NOT_FOUND"):
        first.count()
    assert calls() == 60  # a freed result is not consumed again
    listener.release()
    assert not held() - before


def test_stream_sink_keeps_per_key_order_end_to_end(spark: Any, shared_broker: Any, tmp_path: Path) -> None:
    """Rows of a key, in order in their Spark partition, reach the consumer in that order over batches."""
    ep = shared_broker.endpoint
    topic, group = unique("e2e-order"), unique("e2e-g")
    Admin(ep).create_topic(topic, queues=4)
    src = tmp_path / "src"
    keys = [f"order-{k}" for k in range(8)]
    for wave in range(3):  # one file per micro-batch; each holds the next 10 steps of every key
        rows = [(key, wave * 10 + step) for key in keys for step in range(10)]
        (spark.createDataFrame(rows, "key string, step int").repartition(3, "key")
         .sortWithinPartitions("key", "step").write.parquet(str(src / f"wave={wave}")))
    q = (spark.readStream.schema("key string, step int, wave int").option("maxFilesPerTrigger", 3)
         .parquet(str(src))
         .selectExpr("key AS sharding_key", "CAST(step AS STRING) AS body", "key AS keys")
         .writeStream.format("pymq").option("endpoint", ep).option("topic", topic)
         .option("checkpointLocation", str(tmp_path / "sink-ckpt")).trigger(availableNow=True).start())
    q.awaitTermination(120)
    assert q.exception() is None
    out = tmp_path / "out"
    r = (spark.readStream.format("pymq").option("endpoint", ep).option("topic", topic)
         .option("consumerGroup", group).option("startingOffsets", "earliest")
         .option("maxMessagesPerTrigger", 50).load()
         .selectExpr("keys[0] AS key", "CAST(CAST(body AS STRING) AS INT) AS step", "queue_id",
                     "queue_offset")
         .writeStream.format("parquet").option("checkpointLocation", str(tmp_path / "src-ckpt"))
         .trigger(availableNow=True).start(str(out)))
    r.awaitTermination(120)
    assert r.exception() is None
    rows = ds.dataset(str(out)).to_table().to_pylist()
    assert len(rows) == 240
    for key in keys:
        mine = sorted((row for row in rows if row["key"] == key), key=lambda row: row["queue_offset"])
        assert len({row["queue_id"] for row in mine}) == 1  # one key, one queue
        assert [row["step"] for row in mine] == list(range(30)), f"{key} out of order"


def test_a_send_back_waits_for_a_restarting_broker_and_the_stream_loses_nothing(
    spark: Any, tmp_path: Path
) -> None:
    """The broker dies while the listener runs and is back 6 s later: the send back waits for it (as
    the source's pulls do) instead of failing the batch, and so the query, after 3.5 s."""
    with socket.socket() as s:  # the broker comes back on the same port: the endpoint stays valid
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    broker = BrokerProcess(tmp_path / "broker", ["--port", str(port), "--message-delay-level", "100ms"])
    broker.start()
    try:
        ep = broker.endpoint
        topic, group = unique("sbfail"), unique("sbfail-g")
        Admin(ep).create_topic(topic, queues=1)
        Producer(ep).send_batch([Message(topic, str(i)) for i in range(40)])
        poison = {i for i in range(40) if i % 10 == 3}
        killed, pid, out = tmp_path / "killed", broker.pid, tmp_path / "out"

        def handle(msgs: list[MessageExt]) -> ConsumeConcurrentlyStatus:
            i = int(msgs[0].body)
            if i in poison:
                if not killed.exists():  # the first failure: the broker goes before it is sent back
                    killed.touch()
                    os.kill(pid, signal.SIGKILL)
                raise ValueError(f"cannot handle {i}")
            return ConsumeConcurrentlyStatus.CONSUME_SUCCESS

        listener = MessageListener(ep, group, handle, max_reconsume_times=2, delay_level=1)

        def each_batch(df: Any, batch_id: int) -> None:
            listener.process(df, batch_id).select("body").write.mode("append").parquet(str(out))

        def start() -> Any:
            return (spark.readStream.format("pymq").option("endpoint", ep).option("topic", topic)
                    .option("consumerGroup", group).option("startingOffsets", "earliest").load()
                    .writeStream.foreachBatch(each_batch)
                    .option("checkpointLocation", str(tmp_path / "ckpt"))
                    .trigger(processingTime="200 milliseconds").start())

        q = start()
        deadline = time.monotonic() + 120
        while not killed.exists() and time.monotonic() < deadline:
            assert q.isActive, f"query stopped: {q.exception()}"
            time.sleep(0.1)
        assert killed.exists(), "the listener never met a poison message"
        down_until = time.monotonic() + 6  # longer than the 4 attempts' backoff (3.5 s) that failed the query
        while time.monotonic() < down_until:
            assert q.isActive, f"query stopped while the broker was down: {q.exception()}"
            time.sleep(0.2)
        broker.start()
        admin = Admin(ep)
        deadline = time.monotonic() + 120
        try:
            # kill -9 took the group's defaults (persisted by a periodic task): the broker knows the
            # group again once the restarted query registers it, and dead_letter_messages refuses
            # a group it does not know
            while group not in set(admin.groups()["group"]) and time.monotonic() < deadline:
                assert q.isActive, f"query stopped: {q.exception()}"
                time.sleep(0.1)
            while len(admin.dead_letter_messages(group)) < len(poison) and time.monotonic() < deadline:
                assert q.isActive, f"query stopped: {q.exception()}"
                time.sleep(0.3)
        finally:
            q.stop()
        bodies = Counter(int(r["body"]) for r in ds.dataset(str(out)).to_table().to_pylist())
        assert set(bodies) == set(range(40)) - poison and max(bodies.values()) == 1
        assert sorted(int(d.body) for d in admin.dead_letter_messages(group)) == sorted(poison)
    finally:
        broker.stop()


def test_two_writes_in_one_foreach_batch_send_keys_of_their_own(
    spark: Any, shared_broker: Any, tmp_path: Path
) -> None:
    """A df.write inside foreachBatch sees the stream's query and batch ids: two writes of one
    micro-batch must not send the same msgIds, or a de-duplication window keeps only the first."""
    ep = shared_broker.endpoint
    topic = unique("fb-two")
    Admin(ep).create_topic(topic, queues=2, dedup_window_ms=600_000)
    source = tmp_path / "in"
    source.mkdir()
    (source / "part.json").write_text("".join(f'{{"id": {i}}}\n' for i in range(20)))

    def each_batch(df: Any, batch_id: int) -> None:
        for kind in ("order", "refund"):
            (df.selectExpr(f"CONCAT('{kind}-', id) AS body").write.format("pymq")
             .option("endpoint", ep).option("topic", topic).mode("append").save())
        # a write with a writeId sends the same msgIds when it runs again (as in a replayed
        # micro-batch): the de-duplication window stores its rows once
        for _ in range(2):
            (df.selectExpr("CONCAT('audit-', id) AS body").write.format("pymq").option("writeId", "audit")
             .option("endpoint", ep).option("topic", topic).mode("append").save())

    query = (spark.readStream.schema("id INT").json(str(source)).writeStream.foreachBatch(each_batch)
             .option("checkpointLocation", str(tmp_path / "chk")).trigger(availableNow=True).start())
    query.awaitTermination(120)
    got = read_all(ep, topic)
    assert sorted(m.body.decode() for m in got) == sorted(
        f"{kind}-{i}" for kind in ("order", "refund", "audit") for i in range(20))
    assert len({m.msg_id for m in got}) == 60

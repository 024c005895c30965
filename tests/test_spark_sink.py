"""The Spark sink and the listener helper against a real broker, on the shared local[2] session."""

from __future__ import annotations

import shutil
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.dataset as ds
import pytest
from helpers import read_all, unique
from pyspark_pymq import Admin, Message, MessageExt, Producer, PullConsumer
from pyspark_pymq.client.route import PERM_READ
from pyspark_pymq.errors import NoPermissionError
from pyspark_pymq.spark.listener import ConsumeConcurrentlyStatus, MessageListener
from pyspark_pymq.spark.sink_options import parse_sink_options
from pyspark_pymq.spark.writer import write_partition

pytestmark = pytest.mark.spark


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
    assert read_all(ep, topic) == []


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


@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.parametrize("per_row", [False, True], ids=["plain", "per-row"])
def test_a_refused_send_fails_the_task_with_the_code_and_the_rows(
    shared_broker: Any, mode: str, per_row: bool
) -> None:
    """A read-only topic: NO_PERMISSION is not retriable, so the task fails naming the rows."""
    from pyspark.sql.types import StringType, StructField, StructType

    ep = shared_broker.endpoint
    topic = unique(f"readonly-{mode}")
    Admin(ep).create_topic(topic, queues=1, perm=PERM_READ)
    fields = [StructField("body", StringType())] + ([StructField("tags", StringType())] if per_row else [])
    columns = [pa.array([f"r{i}" for i in range(30)])] + ([pa.array(["t"] * 30)] if per_row else [])
    batch = pa.record_batch(columns, names=[f.name for f in fields])
    opts = parse_sink_options({"endpoint": ep, "topic": topic, "sendMode": mode}, StructType(fields),
                              stream=False)
    with pytest.raises(NoPermissionError) as info:
        write_partition(opts, iter([batch]))
    assert info.value.code == "NO_PERMISSION"
    assert "rows 0..29 of partition 0" in str(info.value) and "no writable queue" in str(info.value)
    assert Admin(ep).topic_stats(topic)["max_offset"].sum() == 0


def test_a_write_query_with_a_refused_send_fails_naming_the_code(spark: Any, shared_broker: Any) -> None:
    ep = shared_broker.endpoint
    topic = unique("readonly-query")
    Admin(ep).create_topic(topic, queues=1, perm=PERM_READ)
    df = spark.range(10).selectExpr("CAST(id AS STRING) AS body").coalesce(1)
    with pytest.raises(Exception) as info:
        df.write.format("pymq").option("endpoint", ep).option("topic", topic).mode("append").save()
    assert "[NO_PERMISSION]" in str(info.value) and "rows 0..9 of partition 0" in str(info.value)


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
    consumer = PullConsumer(ep, group)
    retry_mq = consumer.retry_queues()[0]
    got: list[MessageExt] = []
    deadline = time.monotonic() + 15
    while len(got) < 20 and time.monotonic() < deadline:
        got = consumer.pull(retry_mq, 0, 100, suspend_timeout_ms=200).messages
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

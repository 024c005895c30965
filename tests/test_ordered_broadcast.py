"""Ordered messages and broadcasting, end to end through Spark (shared local[2] session)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pyarrow.dataset as ds
import pytest
from helpers import unique
from pyspark_pymq import Admin, Message, MessageExt, Producer
from pyspark_pymq.spark.listener import (
    ConsumeConcurrentlyStatus,
    ConsumeOrderlyStatus,
    MessageListener,
)

pytestmark = pytest.mark.spark


def test_ordered_messages_keep_per_key_order_and_retry_in_place(
    spark: Any, shared_broker: Any, tmp_path: Path
) -> None:
    ep = shared_broker.endpoint
    topic, group = unique("ordered"), unique("og")
    Admin(ep).create_topic(topic, queues=4)
    keys = [f"order-{k}" for k in range(6)]
    with Producer(ep) as producer:  # interleaved keys, each key's steps in order
        for step in range(10):
            for key in keys:
                producer.send(Message(topic, f"{key}:{step}", sharding_key=key))
    log = tmp_path / "calls.log"  # the listener runs in Spark's Python workers: log to a file

    def handle(msgs: list[MessageExt]) -> ConsumeOrderlyStatus:
        body = msgs[0].body.decode()
        calls = log.read_text().splitlines() if log.exists() else []
        tries = sum(1 for c in calls if c.split(" ")[1] == body) + 1
        ok = not (body.endswith(":3") and tries < 3)  # step 3 fails twice, then works
        with log.open("a") as f:
            f.write(f"{'ok' if ok else 'fail'} {body} {msgs[0].reconsume_times}\n")
        return ConsumeOrderlyStatus.SUCCESS if ok else ConsumeOrderlyStatus.SUSPEND_CURRENT_QUEUE_A_MOMENT

    listener = MessageListener(ep, group, handle, orderly=True,
                               suspend_current_queue_time_millis=50, max_reconsume_times=5)
    df = (spark.read.format("pymq").option("endpoint", ep).option("topic", topic).load()
          .coalesce(1))  # one task, so the log is one sequence
    good = listener.process(df, 0)
    assert good.count() == 60
    calls = [line.split(" ") for line in log.read_text().splitlines()]
    processed = [body for status, body, _ in calls if status == "ok"]
    for key in keys:  # per-key order kept, retries in place did not reorder
        steps = [int(b.split(":")[1]) for b in processed if b.startswith(key + ":")]
        assert steps == list(range(10))
    for key in keys:  # the failing step was retried in place, before the key's next step, and each
        # retry told the listener it was one (RocketMQ's checkReconsumeTimes counts up before it)
        mine = [tuple(c) for c in calls if c[1].startswith(key + ":")]
        assert mine[3:6] == [("fail", f"{key}:3", "0"), ("fail", f"{key}:3", "1"), ("ok", f"{key}:3", "2")]
        assert {c[2] for c in mine[:3] + mine[6:]} == {"0"}
    assert listener.last_stats.retried_in_place == 2 * len(keys)
    assert listener.last_stats.reconsume_later == 0  # orderly never sends back


def test_orderly_consumes_a_queue_in_order_even_when_the_read_splits_it(
    spark: Any, shared_broker: Any, tmp_path: Path
) -> None:
    """maxMessagesPerPartition cuts one queue into six partitions; two at a time ran at once."""
    ep = shared_broker.endpoint
    topic, group = unique("ordered-split"), unique("osg")
    Admin(ep).create_topic(topic, queues=1)
    Producer(ep).send_batch([Message(topic, f"s{i}") for i in range(60)])
    log = tmp_path / "calls.log"

    def handle(msgs: list[MessageExt]) -> ConsumeOrderlyStatus:
        time.sleep(0.01)  # long enough for concurrent tasks to interleave their calls
        with log.open("a") as f:
            f.write(msgs[0].body.decode() + "\n")
        return ConsumeOrderlyStatus.SUCCESS

    listener = MessageListener(ep, group, handle, orderly=True)
    df = (spark.read.format("pymq").option("endpoint", ep).option("topic", topic)
          .option("maxMessagesPerPartition", 10).load())
    assert df.rdd.getNumPartitions() == 6
    assert listener.process(df, 0).count() == 60
    assert log.read_text().splitlines() == [f"s{i}" for i in range(60)]


def test_orderly_gives_up_to_the_dlq_after_max_reconsume_times(spark: Any, shared_broker: Any) -> None:
    ep = shared_broker.endpoint
    topic, group = unique("ordered-poison"), unique("opg")
    Admin(ep).create_topic(topic, queues=1)
    Producer(ep).send_batch([Message(topic, f"s{i}", flag=7 if i == 2 else 0) for i in range(5)])

    def handle(msgs: list[MessageExt]) -> ConsumeOrderlyStatus:
        if msgs[0].body == b"s2":
            raise ValueError("poison step")
        return ConsumeOrderlyStatus.SUCCESS

    listener = MessageListener(ep, group, handle, orderly=True,
                               suspend_current_queue_time_millis=10, max_reconsume_times=2)
    good = listener.process(spark.read.format("pymq").option("endpoint", ep).option("topic", topic).load())
    assert sorted(r["body"] for r in good.select("body").collect()) == [b"s0", b"s1", b"s3", b"s4"]
    dead = Admin(ep).dead_letter_messages(group)
    assert [d.body for d in dead] == [b"s2"]
    assert dead[0].properties["CONSUME_FAILURE_EXCEPTION"] == "ValueError"
    # tried 1 + 2 times in place: the dead letter counts them, as RocketMQ's orderly consumer's
    assert dead[0].reconsume_times == 3 and dead[0].properties["RETRY_TOPIC"] == topic
    assert dead[0].flag == 7  # the stored message's, which a Spark row does not carry
    assert listener.last_stats.dead_letters == 1 and listener.last_stats.retried_in_place == 2


def test_broadcasting_queries_each_see_every_message_without_progress_or_retries(
    spark: Any, shared_broker: Any, tmp_path: Path
) -> None:
    ep = shared_broker.endpoint
    topic, group = unique("bcast"), unique("bg")
    Admin(ep).create_topic(topic, queues=2)
    Producer(ep).send_batch([Message(topic, f"b{i}") for i in range(40)])
    failures = {b"b3", b"b7"}

    def handle(msgs: list[MessageExt]) -> ConsumeConcurrentlyStatus:
        return (ConsumeConcurrentlyStatus.RECONSUME_LATER if msgs[0].body in failures
                else ConsumeConcurrentlyStatus.CONSUME_SUCCESS)

    listener = MessageListener(ep, group, handle, message_model="BROADCASTING")
    outputs = []
    for q in range(2):  # two queries of one group: each gets everything
        out = tmp_path / f"out{q}"
        outputs.append(out)

        def each_batch(df: Any, batch_id: int, out: Path = out) -> None:
            listener.process(df, batch_id).select("body").write.mode("append").parquet(str(out))

        query = (spark.readStream.format("pymq").option("endpoint", ep).option("topic", topic)
                 .option("consumerGroup", group).option("messageModel", "BROADCASTING")
                 .option("startingOffsets", "earliest").load()
                 .writeStream.foreachBatch(each_batch)
                 .option("checkpointLocation", str(tmp_path / f"ckpt{q}"))
                 .trigger(availableNow=True).start())
        query.awaitTermination(120)
        assert query.exception() is None
    for out in outputs:
        bodies = sorted(r["body"] for r in ds.dataset(str(out)).to_table().to_pylist())
        assert bodies == sorted(f"b{i}".encode() for i in range(40) if f"b{i}".encode() not in failures)
    time.sleep(0.3)
    admin = Admin(ep)
    assert len(admin.group_progress(group)) == 0  # nothing written to the broker
    names = admin.topic_names(include_system=True)
    assert f"%RETRY%{group}" not in names and f"%DLQ%{group}" not in names  # no retries
